"""Decode products on int8 activations: x quantized per 32 columns, integer dot products.

    quantize_x(x)          x [M, K] fp32 -> XQ(q int8 [M, K], d fp32 [M, K/32], s fp32 [M, K/32])
    qmatmul_i8(xq, w)      y [M, N] = the product of W's codes with q, scaled per 32 columns

Why: a one-token product in fp32 (qdot.py) spends ~570 warp instructions per KB of Q4_K
weights (nibble splits, int->float conversions, fp32 FMAs and Triton's layout conversions),
which bounds its speed whatever the tile (docs/kernel-tuning.md). Multiplying 4 codes by 4 int8 x
in one `dp4a` (as llama.cpp's CUDA mmvq does, with x in q8_1) needs no conversion per weight:
a 4-byte word of nibbles is two masks and two dp4a, and the scales apply once per 32 weights.

x is quantized per block of 32 columns: d = max|x| / 127, q = round(x / d) (half away from 0),
s = the block's exact fp32 sum (for the sub-blocks' mins, so they carry no rounding of x).
Then for a Q4_K sub-block of 32 weights w = d_w * sc * c - dmin * mn (codes c in [0, 16)):
    sum_i w_i x_i  ~=  d_w * sc * d_x * sum_i c_i q_i  -  dmin * mn * s
with sum_i c_i q_i exact in int32. The only error is x's rounding (relative ~1e-3 of a row's
product for Gaussian x: `qmatmul_i8_ref` states it; tests bound it).

`dp4a` is PTX inline assembly; Triton's interpreter (CI's CPU runs) cannot run it, so the
kernel takes ASM=False there and forms the same integer products from shifts and masks.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from gpu_kernels import qtypes as qt
from gpu_kernels.dequant_ref import dequantize
from gpu_kernels.device_function import INTERPRETED, device_function, interpreter_rows
from gpu_kernels.qdot import chunks_per_step
from gpu_kernels.qformat import GpuQuant

QBLOCK = 32  # columns per x scale


class XQ(NamedTuple):
    """x quantized per 32 columns: q int16 (pair order) or int8 [M, K], d fp32 [M, K/32]
    (scales), s fp32 [M, K/32] (exact sums)."""

    q: torch.Tensor
    d: torch.Tensor
    s: torch.Tensor


# Triton's interpreter runs no PTX; it is chosen before kernel modules are imported
_ASM = not INTERPRETED


@device_function
def quant_store(x, b, bmask, q_row, d_row, s_row, QMAX: tl.constexpr, PAIRS: tl.constexpr):
    """Quantize x [NB, 32] (blocks b [NB] of one row, bmask: blocks in the row) and store the
    codes at q_row (the row's first element; pair order when PAIRS), scales at d_row, sums at
    s_row. Fused kernels call it on the rows they produce."""
    e = tl.arange(0, 32)[None, :]  # [1, 32] column in the block
    amax = tl.max(tl.abs(x), axis=1)  # [NB]
    inv = tl.where(amax > 0, QMAX / tl.maximum(amax, 1e-30), 0.0)
    v = x * inv[:, None]
    q = tl.where(v >= 0, tl.floor(v + 0.5), -tl.floor(0.5 - v))
    if PAIRS:  # see pair_order
        at = b[:, None] * 32 + (e // 16) * 16 + ((e % 4) // 2) * 8 + ((e // 4) % 4) * 2 + e % 2
    else:
        at = b[:, None] * 32 + e
    tl.store(q_row + at, q.to(q_row.dtype.element_ty), mask=bmask[:, None])
    tl.store(d_row + b, amax / QMAX, mask=bmask)
    tl.store(s_row + b, tl.sum(x, axis=1), mask=bmask)


@triton.jit
def _quant_x_kernel(x_ptr, q_ptr, d_ptr, s_ptr, K, G, sxm, sxg, NB: tl.constexpr,
                    QMAX: tl.constexpr, PAIRS: tl.constexpr):
    """One program: NB blocks of 32 columns of row m = (token, group) of x [M, G, K]."""
    m = tl.program_id(1).to(tl.int64)
    b = tl.program_id(0) * NB + tl.arange(0, NB)  # [NB] block
    bmask = b < K // 32
    col = b[:, None] * 32 + tl.arange(0, 32)[None, :]  # [NB, 32]
    x = tl.load(x_ptr + (m // G) * sxm + (m % G) * sxg + col, mask=bmask[:, None], other=0.0)
    quant_store(x, b, bmask, q_ptr + m * K, d_ptr + m * (K // 32), s_ptr + m * (K // 32),
                QMAX, PAIRS)


_QMAX = {8: 127.0, 16: 32767.0}
_QDTYPE = {8: torch.int8, 16: torch.int16}


def empty_xq(rows: int, k: int, bits: int, device: torch.device) -> XQ | None:
    """Buffers for `rows` rows of x quantized to `bits`; None for bits 0 (fp32 x)."""
    if not bits:
        return None
    if k % QBLOCK:
        raise ValueError(f"x has {k} columns: integer products need a multiple of {QBLOCK}")
    return XQ(torch.empty(rows, k, dtype=_QDTYPE[bits], device=device),
              torch.empty(rows, k // QBLOCK, dtype=torch.float32, device=device),
              torch.empty(rows, k // QBLOCK, dtype=torch.float32, device=device))


def pair_order(k: int) -> torch.Tensor:
    """Where int16 x's columns are stored: within each 16 columns the pairs (0,1) (4,5) (8,9)
    (12,13), then (2,3) (6,7) (10,11) (14,15). A word u of 4 byte codes (columns 4u..4u+3)
    meets its two words of x at u and u + 4: two 16-byte loads of the same shape as the codes'."""
    e = torch.arange(k)
    c = e % 16
    return e - c + ((c % 4) // 2) * 8 + ((c // 4) % 4) * 2 + c % 2


def quantize_x(x: torch.Tensor, bits: int = 16) -> XQ:
    """x [M, K] or [M, G, K] fp32 (K a multiple of 32, unit stride) -> XQ of `bits` (8 or 16;
    16 in pair_order) with M * G rows (token-major)."""
    x3 = x if x.dim() == 3 else x.reshape(x.shape[0], 1, x.shape[-1])
    m, g, k = x3.shape
    xq = empty_xq(m * g, k, bits, x.device)
    nb = 16
    _quant_x_kernel[(triton.cdiv(k // QBLOCK, nb), m * g)](
        x3, xq.q, xq.d, xq.s, k, g, x3.stride(0), x3.stride(1), NB=nb, QMAX=_QMAX[bits],
        PAIRS=bits == 16, num_warps=1)
    return xq


def quantize_x_ref(x: torch.Tensor, bits: int = 16) -> XQ:
    qmax = _QMAX[bits]
    x = x.reshape(-1, x.shape[-1])  # [M * G, K]
    xb = x.float().reshape(x.shape[0], -1, QBLOCK)  # [M * G, K/32, 32]
    amax = xb.abs().amax(dim=-1)  # [M, K/32]
    inv = torch.where(amax > 0, qmax / amax.clamp_min(1e-30), torch.zeros_like(amax))
    v = xb * inv[..., None]
    q = torch.where(v >= 0, torch.floor(v + 0.5), -torch.floor(0.5 - v))
    q = q.to(_QDTYPE[bits]).reshape(x.shape)
    if bits == 16:
        q = torch.empty_like(q).index_copy_(1, pair_order(x.shape[1]).to(q.device), q)
    return XQ(q, amax / qmax, xb.sum(dim=-1))


def dequantize_x(xq: XQ) -> torch.Tensor:
    """x as the products see it, [M, K] float64 in column order."""
    q = xq.q
    if q.dtype == torch.int16:
        q = q[:, pair_order(q.shape[1]).to(q.device)]
    return q.double() * xq.d.double().repeat_interleave(QBLOCK, dim=1)


@device_function
def _dp4a(a, b, ASM: tl.constexpr):
    """sum over the 4 bytes of unsigned a times signed b, elementwise (int32 words)."""
    if ASM:
        return tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r",
                                         [a, b, tl.zeros_like(a + b)], dtype=tl.int32,
                                         is_pure=True, pack=1)
    else:
        return ((a & 255) * ((b << 24) >> 24) + ((a >> 8) & 255) * ((b << 16) >> 24)
                + ((a >> 16) & 255) * ((b << 8) >> 24) + ((a >> 24) & 255) * (b >> 24))


@device_function
def _dp2a(a, b, HI: tl.constexpr, c, ASM: tl.constexpr):
    """c + the two signed 16-bit halves of a times bytes 0-1 (HI: 2-3) of unsigned b."""
    if ASM:
        if HI:
            return tl.inline_asm_elementwise("dp2a.hi.s32.u32 $0, $1, $2, $3;", "=r,r,r,r",
                                             [a, b, c], dtype=tl.int32, is_pure=True, pack=1)
        else:
            return tl.inline_asm_elementwise("dp2a.lo.s32.u32 $0, $1, $2, $3;", "=r,r,r,r",
                                             [a, b, c], dtype=tl.int32, is_pure=True, pack=1)
    else:
        sh: tl.constexpr = 16 if HI else 0
        return (c + ((a << 16) >> 16) * ((b >> sh) & 255)
                + (a >> 16) * ((b >> (sh + 8)) & 255))


@device_function
def _xdot(codes, xw, X16: tl.constexpr, ASM: tl.constexpr):
    """Per word of 4 unsigned byte codes [.., 4]: its dot with its 4 columns of x (xw points
    at x's word for it: int8 x; int16 x in pair order, the second word 4 on)."""
    if X16:
        return _dp2a(tl.load(xw + 4), codes, True,
                     _dp2a(tl.load(xw), codes, False, tl.zeros_like(codes), ASM), ASM)
    else:
        return _dp4a(codes, tl.load(xw), ASM)


@triton.jit
def _q4k_i8_kernel(xq_p, xd_p, xs_p, y_p, qs_p, sc_p, mn_p, d_p, dm_p, M, N, G, row0,
                   gstride, KW, KX, KS, KD, sym, syg, BM: tl.constexpr, BN: tl.constexpr,
                   NC: tl.constexpr, X16: tl.constexpr, ASM: tl.constexpr):
    """y[m, g, n] for BM tokens x BN rows of group g (W's rows row0 + g * gstride + n; x's
    row m * G + g); a K step is NC 64-chunks of 32 bytes, each read as 2 x 4 words (16-byte
    loads). KW, KX: int32 words of codes / of x per row; KS, KD: sub-blocks (K / 32) and
    super-blocks (K / 256) per row."""
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    m = tl.program_id(1) * BM + tl.arange(0, BM)
    g0 = tl.program_id(2)
    r = (row0 + g0 * gstride + tl.where(n < N, n, 0)).to(tl.int64)[None, :, None, None]
    mm = (tl.where(m < M, m, 0).to(tl.int64) * G + g0)[:, None, None, None]  # x's rows
    c = tl.arange(0, NC)[None, None, :, None]  # [1, 1, NC, 1]
    hu = (tl.arange(0, 2)[:, None] * 4 + tl.arange(0, 4)[None, :])[None, None, None]  # [.., 2, 4]
    acc = tl.zeros((BM, BN, NC, 2), dtype=tl.float32)  # scaled integer dots, per 16 bytes
    acc_min = tl.zeros((BM, BN, NC, 1), dtype=tl.float32)  # the sub-blocks' min terms
    for j0 in range(0, KW // 8, NC):
        j = j0 + c  # [1, 1, NC, 1] chunk
        w = tl.load(qs_p + (r * KW + j * 8)[:, :, :, :, None] + hu)  # [1, BN, NC, 2, 4]
        if X16:  # the low nibbles' 32 columns are 16 words of x, the high ones 16 more
            xw = xq_p + (mm * KX + j * 32)[:, :, :, :, None] + (hu // 4) * 8 + hu % 4
            hi_at: tl.constexpr = 16
        else:
            xw = xq_p + (mm * KX + j * 16)[:, :, :, :, None] + hu
            hi_at: tl.constexpr = 8
        # x's pointers take the codes' shape, so both loads get one layout (16-byte loads,
        # each thread's words in its registers): broadcasting x instead makes Triton move
        # the codes through shared memory and sum the words across threads
        xw = tl.broadcast_to(xw, (BM, BN, NC, 2, 4))
        s_lo = tl.sum(_xdot(w & 0x0F0F0F0F, xw, X16, ASM), axis=4)  # [BM, BN, NC, 2]
        s_hi = tl.sum(_xdot((w >> 4) & 0x0F0F0F0F, xw + hi_at, X16, ASM), axis=4)
        g = r * KS + 2 * j  # [1, BN, NC, 1] sub-block of the low nibbles
        gx = mm * KS + 2 * j  # [BM, 1, NC, 1]
        d = tl.load(d_p + r * KD + j // 4).to(tl.float32)
        dmin = tl.load(dm_p + r * KD + j // 4).to(tl.float32)
        acc += (d * tl.load(sc_p + g).to(tl.float32)) * tl.load(xd_p + gx) * s_lo.to(tl.float32)
        acc += (d * tl.load(sc_p + g + 1).to(tl.float32)) * tl.load(xd_p + gx + 1) \
            * s_hi.to(tl.float32)
        acc_min += dmin * (tl.load(mn_p + g).to(tl.float32) * tl.load(xs_p + gx)
                           + tl.load(mn_p + g + 1).to(tl.float32) * tl.load(xs_p + gx + 1))
    y = tl.sum(tl.sum(acc, axis=3) - tl.sum(acc_min, axis=3), axis=2)  # [BM, BN]
    tl.store(y_p + g0.to(tl.int64) * syg + m.to(tl.int64)[:, None] * sym + n[None, :], y,
             mask=(m < M)[:, None] & (n < N)[None, :])


# (rows per program, 64-chunks per K step, warps): long rows and rows of fewer than 1024
# columns, as swept (scripts/probe_int_products.py, docs/kernel-tuning.md)
LONG_TILES, SHORT_TILES = (4, 16, 2), (8, 4, 1)


def qmatmul_i8(xq: XQ, w: GpuQuant, out_rows: int | None = None, row0: int = 0,
               gstride: int = 0, groups: int = 1, out: torch.Tensor | None = None,
               tiles: tuple[int, int, int] | None = None) -> torch.Tensor:
    """xq (quantize_x of x [M, K] or [M, G, K]) times W's rows -> [M, N] or [M, G, N] fp32:
    y[m, g, n] = x[m, g] . W[row0 + g * gstride + n] (qmatmul's contract)."""
    if w.qtype != qt.Q4_K:
        raise ValueError(f"qmatmul_i8 takes Q4_K, not {qt.name(w.qtype)}")
    k = w.cols
    m, n, y, y3 = product_output(xq, w, out_rows, row0, groups, out)
    bn, nc, warps = tiles or (LONG_TILES if (k // 64) % 16 == 0 else SHORT_TILES)
    bn = bn if tiles is not None else interpreter_rows(bn)
    nc = chunks_per_step(qt.Q4_K, k, nc)
    bm = max(1, triton.next_power_of_2(m))
    qs, sc, mn, d, dmin = w.planes
    _q4k_i8_kernel[(triton.cdiv(n, bn), triton.cdiv(m, bm), groups)](
        xq.q.view(torch.int32), xq.d, xq.s, y3, qs.view(torch.int32), sc, mn, d, dmin,
        m, n, groups, row0, gstride, k // 8, k * xq.q.element_size() // 4, k // 32, k // 256,
        y3.stride(0), y3.stride(1), BM=bm, BN=bn, NC=nc, X16=xq.q.dtype == torch.int16,
        ASM=_ASM, num_warps=warps)
    return y if out is not None or groups > 1 else y.reshape(m, n)


def product_output(xq: XQ, w: GpuQuant, out_rows: int | None, row0: int, groups: int,
                   out: torch.Tensor | None) -> tuple:
    """An integer product's (tokens M, rows N, y, y as [M, G, N]), x's width checked."""
    rows, k = xq.q.shape
    if k != w.cols:
        raise ValueError(f"x has {k} features, the weight takes {w.cols}")
    m = rows // groups
    n = w.rows - row0 if out_rows is None else out_rows
    y = out if out is not None else torch.empty(m, groups, n, dtype=torch.float32,
                                                 device=xq.q.device)
    return m, n, y, y.reshape(m, groups, n)


def qmatmul_i8_ref(xq: XQ, w: GpuQuant, out_rows: int | None = None, row0: int = 0,
                   gstride: int = 0, groups: int = 1) -> torch.Tensor:
    """float64 reference of qmatmul_i8 -> [M, G, N] fp32: W's dequantization times x as the
    kernel sees it (q * d per block), each sub-block's min term against the block's exact sum."""
    mn, dmin = w.planes[2].cpu(), w.planes[4].cpu()  # planes: qs, sc, mn, d, dmin
    n = w.rows - row0 if out_rows is None else out_rows
    wq = dequantize(w).double().cpu()  # [R, K]
    mins = dmin.double().repeat_interleave(8, dim=1) * mn.double()  # [R, K/32]: -w's min part
    scaled = wq + mins.repeat_interleave(QBLOCK, dim=1)  # [R, K]: d * sc * code
    xhat = dequantize_x(xq).cpu().reshape(-1, groups, w.cols)  # [M, G, K]
    xs = xq.s.double().cpu().reshape(-1, groups, w.cols // QBLOCK)  # [M, G, K/32]
    idx = row0 + gstride * torch.arange(groups)[:, None] + torch.arange(n)[None, :]  # [G, n]
    y = torch.einsum("mgk,gnk->mgn", xhat, scaled[idx]) - torch.einsum(
        "mgb,gnb->mgn", xs, mins[idx])
    return y.float()
