"""Per-type Triton bodies of the quantized product y = x @ W^T: one step over K, accumulated.

A step covers NC chunks of a type's natural unit (Q8_0/Q4_0/Q5_0/IQ4/MXFP4 and float: a
32-block; Q4_K/Q5_K: 64 weights, whose 32 packed bytes hold them as low and high nibbles; Q6_K,
Q2_K, Q3_K: a half super-block of 128). Within a chunk the packed codes are read as contiguous
bytes (wide, coalesced loads) and split into parts of consecutive columns: low nibbles are columns
[0, 32) of a Q4_K chunk and high nibbles [32, 64); Q2_K's four 2-bit fields are four runs of
32. Each part [BN, NC, S] is multiplied with the matching columns of x (`_mac`), so no weight
is reordered; scales are loaded once per (row, sub-block) and broadcast.

The per-element formulas and their fp32 order are dequant_ref's (ggml's), so the tiles equal
the reference dequantization; only the summation order of the products differs.
"""

from __future__ import annotations

import triton.language as tl

from gpu_kernels import qtypes as qt
from gpu_kernels.dequant_tile import e8m0_half, iq4_level, mxfp4_level
from gpu_kernels.device_function import INTERPRETED, device_function

_F32, _F16, _BF16 = tl.constexpr(qt.F32), tl.constexpr(qt.F16), tl.constexpr(qt.BF16)
_Q4_0, _Q4_1, _Q5_0 = tl.constexpr(qt.Q4_0), tl.constexpr(qt.Q4_1), tl.constexpr(qt.Q5_0)
_Q5_1, _Q8_0, _Q2_K = tl.constexpr(qt.Q5_1), tl.constexpr(qt.Q8_0), tl.constexpr(qt.Q2_K)
_Q3_K, _Q4_K, _Q5_K = tl.constexpr(qt.Q3_K), tl.constexpr(qt.Q4_K), tl.constexpr(qt.Q5_K)
_Q6_K = tl.constexpr(qt.Q6_K)
_IQ4_NL, _IQ4_XS = tl.constexpr(qt.IQ4_NL), tl.constexpr(qt.IQ4_XS)
_MXFP4 = tl.constexpr(qt.MXFP4)
_NATIVE_FP16 = tl.constexpr(not INTERPRETED)

# weights per chunk, per type (the launcher's step is NC chunks)
CHUNK = {qt.F32: 32, qt.F16: 32, qt.BF16: 32, qt.Q8_0: 32, qt.Q4_0: 32, qt.Q4_1: 32,
         qt.Q5_0: 32, qt.Q5_1: 32, qt.Q4_K: 64, qt.Q5_K: 64, qt.Q6_K: 128, qt.Q2_K: 128,
         qt.Q3_K: 128, qt.IQ4_NL: 32, qt.IQ4_XS: 32, qt.MXFP4: 32}
# columns per part of a chunk (a chunk is CHUNK / PART parts of consecutive columns)
PART = {qt.F32: 32, qt.F16: 32, qt.BF16: 32, qt.Q8_0: 32, qt.Q4_0: 16, qt.Q4_1: 16,
        qt.Q5_0: 16, qt.Q5_1: 16, qt.Q4_K: 32, qt.Q5_K: 32, qt.Q6_K: 64, qt.Q2_K: 32,
        qt.Q3_K: 32, qt.IQ4_NL: 16, qt.IQ4_XS: 16, qt.MXFP4: 16}


@device_function
def _mac(acc, w, x_row, xcol, mmask, NC: tl.constexpr, S: tl.constexpr, DOT: tl.constexpr):
    """acc += x[:, xcol] * w. w: [BN, NC, S] f32; xcol: [NC, S] int32 columns of x.

    DOT: acc [BM, BN] += x @ w^T on tensor cores, in tf32x3 (fp32 accuracy) or, DOT == 2, in
    fp16 (x and the dequantized w rounded to fp16, fp32 sums: ~5e-4 relative through a whole
    expert, against ~2e-2 for bf16's 8-bit mantissa; x must stay below 65504).
    Otherwise acc [BM, BN, NC * S] gathers the products elementwise and the kernel sums them once after its K loop: a reduction across
    threads in every step would put a barrier in every step."""
    w2 = tl.reshape(w, (w.shape[0], NC * S))
    x = tl.load(x_row + tl.reshape(xcol, (1, NC * S)), mask=mmask[:, None], other=0.0)
    if DOT == 2:
        if _NATIVE_FP16:
            acc += tl.dot(x.to(tl.float16), tl.trans(w2.to(tl.float16)))
        else:  # the interpreter's half-precision dot is wrong (triton 3.9): fp16 rounding,
            # fp32 products
            acc += tl.dot(x.to(tl.float16).to(tl.float32),
                          tl.trans(w2.to(tl.float16).to(tl.float32)), input_precision="ieee")
    elif DOT:
        acc += tl.dot(x, tl.trans(w2), input_precision="tf32x3")
    else:
        acc += x[:, None, :] * w2[None, :, :]
    return acc


@device_function
def _ld(p, off, m):
    return tl.load(p + off, mask=m, other=0)


@device_function
def _k4_scales(sc_p, mn_p, d_p, dm_p, r, rmask, K, j):
    """Q4_K/Q5_K: the scales and mins of 64-chunk j's two sub-blocks, and d, dmin."""
    d = _ld(d_p, r * (K // 256) + j // 4, rmask).to(tl.float32)
    dmin = _ld(dm_p, r * (K // 256) + j // 4, rmask).to(tl.float32)
    sc_lo = _ld(sc_p, r * (K // 32) + 2 * j, rmask).to(tl.float32)
    mn_lo = _ld(mn_p, r * (K // 32) + 2 * j, rmask).to(tl.float32)
    sc_hi = _ld(sc_p, r * (K // 32) + 2 * j + 1, rmask).to(tl.float32)
    mn_hi = _ld(mn_p, r * (K // 32) + 2 * j + 1, rmask).to(tl.float32)
    return sc_lo, mn_lo, sc_hi, mn_hi, d, dmin


@device_function
def qdot_step(QT: tl.constexpr, acc, x_row, mmask, p0, p1, p2, p3, p4, p5, r, rmask, K, k0,
              NC: tl.constexpr, DOT: tl.constexpr):
    """acc += x[:, k0 : k0 + NC * CHUNK[QT]] times W[r, same] (see _mac for acc's shape; its
    last dimension is NC * PART[QT] without DOT).

    r: [BN, 1, 1] int64 rows, rmask the same shape; x_row: [BM, 1] pointers to x's rows."""
    c3 = tl.arange(0, NC)[None, :, None]  # [1, NC, 1] chunk
    c2 = tl.arange(0, NC)[:, None]  # [NC, 1]
    if QT == _F32 or QT == _F16 or QT == _BF16 or QT == _Q8_0:
        l3 = tl.arange(0, 32)[None, None, :]
        col = k0 + c2 * 32 + tl.arange(0, 32)[None, :]  # [NC, 32]
        w = _ld(p0, r * K + (k0 + c3 * 32 + l3), rmask).to(tl.float32)
        if QT == _Q8_0:
            w = _ld(p1, r * (K // 32) + (k0 // 32 + c3), rmask).to(tl.float32) * w
        acc = _mac(acc, w, x_row, col, mmask, NC, 32, DOT)
    elif QT == _Q4_0 or QT == _Q4_1 or QT == _Q5_0 or QT == _Q5_1:
        l3 = tl.arange(0, 16)[None, None, :]
        blk = k0 // 32 + c3  # [1, NC, 1]
        b = _ld(p0, r * (K // 2) + blk * 16 + l3, rmask).to(tl.int32)  # [BN, NC, 16]
        lo = b & 15
        hi = b >> 4
        if QT == _Q5_0 or QT == _Q5_1:
            qh = _ld(p1, r * (K // 32) + blk, rmask)  # [BN, NC, 1] int32
            lo = lo | (((qh >> l3) & 1) << 4)
            hi = hi | (((qh >> (l3 + 16)) & 1) << 4)
            d = _ld(p2, r * (K // 32) + blk, rmask).to(tl.float32)
        else:
            d = _ld(p1, r * (K // 32) + blk, rmask).to(tl.float32)
        if QT == _Q4_0:
            w_lo = d * (lo - 8).to(tl.float32)
            w_hi = d * (hi - 8).to(tl.float32)
        elif QT == _Q5_0:
            w_lo = d * (lo - 16).to(tl.float32)
            w_hi = d * (hi - 16).to(tl.float32)
        else:
            m = _ld(p2 if QT == _Q4_1 else p3, r * (K // 32) + blk, rmask).to(tl.float32)
            w_lo = d * lo.to(tl.float32) + m
            w_hi = d * hi.to(tl.float32) + m
        col = k0 + c2 * 32 + tl.arange(0, 16)[None, :]
        acc = _mac(acc, w_lo, x_row, col, mmask, NC, 16, DOT)
        acc = _mac(acc, w_hi, x_row, col + 16, mmask, NC, 16, DOT)
    elif QT == _IQ4_NL or QT == _IQ4_XS or QT == _MXFP4:  # Q4_0's nibble order, table levels
        l3 = tl.arange(0, 16)[None, None, :]
        blk = k0 // 32 + c3  # [1, NC, 1]
        b = _ld(p0, r * (K // 2) + blk * 16 + l3, rmask).to(tl.int32)  # [BN, NC, 16]
        if QT == _MXFP4:  # planes: qs, e
            d = e8m0_half(_ld(p1, r * (K // 32) + blk, rmask).to(tl.int32))
            lv_lo, lv_hi = mxfp4_level(b & 15), mxfp4_level(b >> 4)
        else:
            if QT == _IQ4_NL:
                d = _ld(p1, r * (K // 32) + blk, rmask).to(tl.float32)
            else:  # planes: qs, sc, d
                d = _ld(p2, r * (K // 256) + blk // 8, rmask).to(tl.float32) \
                    * _ld(p1, r * (K // 32) + blk, rmask).to(tl.float32)
            lv_lo, lv_hi = iq4_level(b & 15), iq4_level(b >> 4)
        col = k0 + c2 * 32 + tl.arange(0, 16)[None, :]
        acc = _mac(acc, d * lv_lo, x_row, col, mmask, NC, 16, DOT)
        acc = _mac(acc, d * lv_hi, x_row, col + 16, mmask, NC, 16, DOT)
    elif QT == _Q4_K or QT == _Q5_K:
        l3 = tl.arange(0, 32)[None, None, :]
        j = k0 // 64 + c3  # [1, NC, 1] global 64-chunk
        b = _ld(p0, r * (K // 2) + j * 32 + l3, rmask).to(tl.int32)  # [BN, NC, 32]
        lo = b & 15
        hi = b >> 4
        if QT == _Q5_K:  # planes: qs, qh, sc, mn, d, dmin
            qh = _ld(p1, r * (K // 8) + (j // 4) * 32 + l3, rmask).to(tl.int32)
            bit = 2 * (j % 4)
            lo = lo | (((qh >> bit) & 1) << 4)
            hi = hi | (((qh >> (bit + 1)) & 1) << 4)
            sc_lo, mn_lo, sc_hi, mn_hi, d, dmin = _k4_scales(p2, p3, p4, p5, r, rmask, K, j)
        else:  # planes: qs, sc, mn, d, dmin
            sc_lo, mn_lo, sc_hi, mn_hi, d, dmin = _k4_scales(p1, p2, p3, p4, r, rmask, K, j)
        col = k0 + c2 * 64 + tl.arange(0, 32)[None, :]
        acc = _mac(acc, (d * sc_lo) * lo.to(tl.float32) - dmin * mn_lo, x_row, col, mmask,
                   NC, 32, DOT)
        acc = _mac(acc, (d * sc_hi) * hi.to(tl.float32) - dmin * mn_hi, x_row, col + 32,
                   mmask, NC, 32, DOT)
    elif QT == _Q6_K:
        l3 = tl.arange(0, 64)[None, None, :]
        j = k0 // 128 + c3  # [1, NC, 1] global half super-block
        ql = _ld(p0, r * (K // 2) + j * 64 + l3, rmask).to(tl.int32)  # [BN, NC, 64]
        qh = _ld(p1, r * (K // 4) + j * 32 + (l3 % 32), rmask).to(tl.int32)
        d = _ld(p3, r * (K // 256) + j // 2, rmask).to(tl.float32)
        sh = 2 * (l3 // 32)
        v_lo = (ql & 15) | (((qh >> sh) & 3) << 4)
        v_hi = (ql >> 4) | (((qh >> (sh + 4)) & 3) << 4)
        sc_lo = _ld(p2, r * (K // 16) + j * 8 + l3 // 16, rmask).to(tl.float32)
        sc_hi = _ld(p2, r * (K // 16) + j * 8 + 4 + l3 // 16, rmask).to(tl.float32)
        col = k0 + c2 * 128 + tl.arange(0, 64)[None, :]
        acc = _mac(acc, (d * sc_lo) * (v_lo - 32).to(tl.float32), x_row, col, mmask, NC, 64,
                   DOT)
        acc = _mac(acc, (d * sc_hi) * (v_hi - 32).to(tl.float32), x_row, col + 64, mmask, NC,
                   64, DOT)
    else:  # Q2_K, Q3_K: four 2-bit runs of 32 per byte row
        l3 = tl.arange(0, 32)[None, None, :]
        j = k0 // 128 + c3
        if QT == _Q2_K:
            qs = _ld(p0, r * (K // 4) + j * 32 + l3, rmask).to(tl.int32)  # [BN, NC, 32]
            d = _ld(p2, r * (K // 256) + j // 2, rmask).to(tl.float32)
            dmin = _ld(p3, r * (K // 256) + j // 2, rmask).to(tl.float32)
        else:
            qs = _ld(p1, r * (K // 4) + j * 32 + l3, rmask).to(tl.int32)
            hm = _ld(p0, r * (K // 8) + (j // 2) * 32 + l3, rmask).to(tl.int32)
            d = _ld(p3, r * (K // 256) + j // 2, rmask).to(tl.float32)
        col = k0 + c2 * 128 + tl.arange(0, 32)[None, :]
        for p in tl.static_range(4):
            v = (qs >> (2 * p)) & 3
            if QT == _Q2_K:
                s = _ld(p1, r * (K // 16) + j * 8 + 2 * p + l3 // 16, rmask).to(tl.int32)
                w = (d * (s & 15).to(tl.float32)) * v.to(tl.float32) \
                    - dmin * (s >> 4).to(tl.float32)
            else:
                v = v - 4 + 4 * ((hm >> (4 * (j % 2) + p)) & 1)
                sc = _ld(p2, r * (K // 16) + j * 8 + 2 * p + l3 // 16, rmask).to(tl.float32)
                w = (d * sc) * v.to(tl.float32)
            acc = _mac(acc, w, x_row, col + 32 * p, mmask, NC, 32, DOT)
    return acc


def chunks_per_step(qtype: int, cols: int, most: int) -> int:
    """NC: the most chunks (a power of two, <= `most`) that divide the row into whole steps."""
    n = cols // CHUNK[qtype]
    nc = 1
    while nc * 2 <= most and n % (nc * 2) == 0:
        nc *= 2
    return nc
