"""The Triton dequantization of a tile of a `GpuQuant` matrix, shared by every kernel that reads
quantized weights (matmuls, embedding lookups).

`dequant_tile(QT, p0..p5, r, e, K, rmask)` returns weights [BN, BK] fp32 for rows r [BN, 1]
(int64; any rows, e.g. token ids for an embedding) and columns e [1, BK] (int32) of a matrix with K columns
whose planes are p0.. (qformat.py). The per-element formulas, and their fp32 operation order,
are dequant_ref.element_values' (ggml's reference dequantizers): the tile equals the reference
element for element. Loads are gathers; neighbouring columns read neighbouring bytes, so a
tile's loads hit the same cache lines.

`embedding(ids, w)` is the simplest reader: out[t] = dequantized row ids[t] of W [V, H], only the
looked-up rows read (a 129K x 7168 table stays in its blocks); `embedding_ref` is its torch
reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu_kernels import qtypes as qt
from gpu_kernels.dequant_ref import element_values
from gpu_kernels.device_function import device_function
from gpu_kernels.qformat import GpuQuant

# constexpr globals: triton folds the comparisons against a constexpr type id
_F32, _F16, _BF16 = tl.constexpr(qt.F32), tl.constexpr(qt.F16), tl.constexpr(qt.BF16)
_Q4_0, _Q4_1, _Q5_0 = tl.constexpr(qt.Q4_0), tl.constexpr(qt.Q4_1), tl.constexpr(qt.Q5_0)
_Q5_1, _Q8_0, _Q2_K = tl.constexpr(qt.Q5_1), tl.constexpr(qt.Q8_0), tl.constexpr(qt.Q2_K)
_Q3_K, _Q4_K, _Q5_K = tl.constexpr(qt.Q3_K), tl.constexpr(qt.Q4_K), tl.constexpr(qt.Q5_K)
_Q6_K = tl.constexpr(qt.Q6_K)
_IQ4_NL, _IQ4_XS = tl.constexpr(qt.IQ4_NL), tl.constexpr(qt.IQ4_XS)
_MXFP4 = tl.constexpr(qt.MXFP4)


def _level_words(levels: tuple[int, ...]) -> list[int]:
    """16 int8 levels as 4 int32 words of 4 little-endian bytes (levels 4w..4w+3 in word w)."""
    out = []
    for w in range(4):
        word = sum((levels[4 * w + k] & 0xFF) << (8 * k) for k in range(4))
        out.append(word - (1 << 32) if word >= 1 << 31 else word)
    return out


_LV0, _LV1, _LV2, _LV3 = (tl.constexpr(w) for w in _level_words(qt.IQ4_LEVELS))
_MX0, _MX1, _MX2, _MX3 = (tl.constexpr(w) for w in _level_words(qt.MXFP4_LEVELS))


@device_function
def _signed_byte(word, v):
    """Byte v % 4 of `word` (the level of code v), sign-extended, as fp32."""
    return ((((word >> (8 * (v & 3))) & 255) ^ 128) - 128).to(tl.float32)


@device_function
def iq4_level(v):
    """IQ4_LEVELS[v] (v int32 in 0..15) as fp32, from the 4 words: no table in memory."""
    return _signed_byte(tl.where(v < 8, tl.where(v < 4, _LV0, _LV1),
                                 tl.where(v < 12, _LV2, _LV3)), v)


@device_function
def mxfp4_level(v):
    """MXFP4_LEVELS[v] (v int32 in 0..15) as fp32, from the 4 words: no table in memory."""
    return _signed_byte(tl.where(v < 8, tl.where(v < 4, _MX0, _MX1),
                                 tl.where(v < 12, _MX2, _MX3)), v)


@device_function
def e8m0_half(e):
    """MXFP4's scale 2^(e - 128) as fp32 for exponents e (int32 in 0..255), written as its
    bits (ggml's GGML_E8M0_TO_FP32_HALF): exact for every e, where exp2 may be approximate.
    e in {0, 1} give the denormals 2^-128 and 2^-127, kept, not flushed (ggml keeps them)."""
    return tl.where(e < 2, (e + 1) * 0x00200000, (e - 1) << 23).to(tl.float32, bitcast=True)


@device_function
def _i32(p, r, stride, col, m):
    """Plane p at rows r [BN, 1] (int64; `stride` elements per row) and columns col [1, BK]
    (int32): the row offset is 64-bit, the column offsets stay 32-bit."""
    return tl.load((p + r * stride) + col, mask=m, other=0).to(tl.int32)


@device_function
def _f32(p, r, stride, col, m):
    return tl.load((p + r * stride) + col, mask=m, other=0).to(tl.float32)


@device_function
def dequant_tile(QT: tl.constexpr, p0, p1, p2, p3, p4, p5, r, e, K, rmask):
    if QT == _F32 or QT == _F16 or QT == _BF16:
        w = _f32(p0, r, K, e, rmask)
    elif QT == _Q8_0:
        w = _f32(p1, r, K // 32, e // 32, rmask) * _f32(p0, r, K, e, rmask)
    elif QT == _MXFP4:
        b = _i32(p0, r, K // 2, (e // 32) * 16 + e % 16, rmask)
        w = e8m0_half(_i32(p1, r, K // 32, e // 32, rmask)) \
            * mxfp4_level((b >> (((e // 16) % 2) * 4)) & 15)
    elif QT == _IQ4_NL or QT == _IQ4_XS:
        b = _i32(p0, r, K // 2, (e // 32) * 16 + e % 16, rmask)
        level = iq4_level((b >> (((e // 16) % 2) * 4)) & 15)
        if QT == _IQ4_NL:
            w = _f32(p1, r, K // 32, e // 32, rmask) * level
        else:
            w = (_f32(p2, r, K // 256, e // 256, rmask) * _f32(p1, r, K // 32, e // 32, rmask)) \
                * level
    elif QT == _Q4_0 or QT == _Q4_1 or QT == _Q5_0 or QT == _Q5_1:
        b = _i32(p0, r, K // 2, (e // 32) * 16 + e % 16, rmask)
        v = (b >> (((e // 16) % 2) * 4)) & 15
        if QT == _Q5_0 or QT == _Q5_1:
            qh = _i32(p1, r, K // 32, e // 32, rmask)
            v = v | (((qh >> (e % 32).to(tl.int32)) & 1) << 4)
            d = _f32(p2, r, K // 32, e // 32, rmask)
        else:
            d = _f32(p1, r, K // 32, e // 32, rmask)
        if QT == _Q4_0:
            w = d * (v - 8).to(tl.float32)
        elif QT == _Q5_0:
            w = d * (v - 16).to(tl.float32)
        elif QT == _Q4_1:
            w = d * v.to(tl.float32) + _f32(p2, r, K // 32, e // 32, rmask)
        else:
            w = d * v.to(tl.float32) + _f32(p3, r, K // 32, e // 32, rmask)
    else:
        sb = e // 256
        i = e % 256
        half = i // 128
        run = (i % 128) // 32
        lane = i % 32
        if QT == _Q4_K or QT == _Q5_K:
            b = _i32(p0, r, K // 2, sb * 128 + (i // 64) * 32 + lane, rmask)
            v = (b >> (((i // 32) % 2) * 4).to(tl.int32)) & 15
            if QT == _Q5_K:
                qh = _i32(p1, r, K // 8, sb * 32 + lane, rmask)
                v = v | (((qh >> (i // 32).to(tl.int32)) & 1) << 4)
                sc = _f32(p2, r, K // 32, e // 32, rmask)
                mn = _f32(p3, r, K // 32, e // 32, rmask)
                d = _f32(p4, r, K // 256, sb, rmask)
                dmin = _f32(p5, r, K // 256, sb, rmask)
            else:
                sc = _f32(p1, r, K // 32, e // 32, rmask)
                mn = _f32(p2, r, K // 32, e // 32, rmask)
                d = _f32(p3, r, K // 256, sb, rmask)
                dmin = _f32(p4, r, K // 256, sb, rmask)
            w = (d * sc) * v.to(tl.float32) - dmin * mn
        elif QT == _Q6_K:
            ql = _i32(p0, r, K // 2, sb * 128 + half * 64 + (run % 2) * 32 + lane, rmask)
            qh = _i32(p1, r, K // 4, sb * 64 + half * 32 + lane, rmask)
            v = ((ql >> ((run // 2) * 4).to(tl.int32)) & 15) | (((qh >> (2 * run).to(tl.int32)) & 3) << 4)
            d = _f32(p3, r, K // 256, sb, rmask)
            sc = _f32(p2, r, K // 16, e // 16, rmask)
            w = (d * sc) * (v - 32).to(tl.float32)
        elif QT == _Q2_K:
            b = _i32(p0, r, K // 4, sb * 64 + half * 32 + lane, rmask)
            v = (b >> (2 * run).to(tl.int32)) & 3
            s = _i32(p1, r, K // 16, e // 16, rmask)
            d = _f32(p2, r, K // 256, sb, rmask)
            dmin = _f32(p3, r, K // 256, sb, rmask)
            w = (d * (s & 15).to(tl.float32)) * v.to(tl.float32) - dmin * (s >> 4).to(tl.float32)
        else:  # Q3_K
            b = _i32(p1, r, K // 4, sb * 64 + half * 32 + lane, rmask)
            hm = _i32(p0, r, K // 8, sb * 32 + lane, rmask)
            v = ((b >> (2 * run).to(tl.int32)) & 3) - 4 + 4 * ((hm >> (4 * half + run).to(tl.int32)) & 1)
            d = _f32(p3, r, K // 256, sb, rmask)
            sc = _f32(p2, r, K // 16, e // 16, rmask)
            w = (d * sc) * v.to(tl.float32)
    return w


def plane_args(planes) -> list:
    """The six plane pointers a kernel takes: the planes, then repeats of the first."""
    return list(planes) + [planes[0]] * (6 - len(planes))


@triton.jit(do_not_specialize=["T"])
def _embedding_kernel(ids_ptr, y_ptr, p0, p1, p2, p3, p4, p5, T, K,
                      QT: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr):
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    tmask = t < T
    e = (tl.program_id(1) * BK + tl.arange(0, BK))[None, :]
    r = tl.load(ids_ptr + t, mask=tmask, other=0).to(tl.int64)[:, None]
    w = dequant_tile(QT, p0, p1, p2, p3, p4, p5, r, e, K, tmask[:, None])
    tl.store(y_ptr + t.to(tl.int64)[:, None] * K + e, w, mask=tmask[:, None])


def embedding(ids: torch.Tensor, w: GpuQuant, out: torch.Tensor | None = None) -> torch.Tensor:
    """ids: [T] int (on w's device) -> [T, H] f32."""
    t = ids.numel()
    out = out if out is not None else torch.empty(t, w.cols, dtype=torch.float32,
                                                  device=ids.device)
    bk = 64 if w.cols % 64 == 0 else 32
    if t:
        _embedding_kernel[(triton.cdiv(t, 4), w.cols // bk)](
            ids, out, *plane_args(w.planes), t, w.cols, QT=w.qtype, BT=4, BK=bk, num_warps=4)
    return out


def embedding_ref(ids: torch.Tensor, w: GpuQuant) -> torch.Tensor:
    return element_values(w, ids.reshape(-1).long(), torch.arange(w.cols))
