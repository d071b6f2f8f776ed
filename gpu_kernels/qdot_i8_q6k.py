"""The Q6_K decode product on integer activations: qdot_i8's design for Q6_K's 6-bit codes.

    qmatmul_i8_q6k(xq, w)   y [M, N] = W's signed codes times x's (quantize_x), scaled per 16

A Q6_K super-block of 256 weights is two halves of 128: 64 bytes of low nibbles (ql), 32 bytes
of 2-bit high parts (qh), a signed byte scale per 16 weights, and one f16 d. Within a half,
byte l of ql and qh hold columns l, l + 32, l + 64, l + 96 (ggml's order):
    c(l)      = (ql[l] & 15)      | ((qh[l] >> 0) & 3) << 4
    c(l + 32) = (ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4
    c(l + 64) = (ql[l] >> 4)      | ((qh[l] >> 4) & 3) << 4
    c(l + 96) = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4,   w = d * sc[col / 16] * (c - 32)
so a word of 4 ql bytes and a word of 4 qh bytes give four words of codes, each 4 consecutive
columns, with masks and shifts alone; `c - 32` is taken per byte without borrows (each byte's top
bit set first), and the signed codes meet x in `dp2a.s32.s32` (int16 x) or `dp4a.s32.s32`
(int8 x). Then, per 16 weights, y += d * sc * d_x * (sum of code * q), an exact int32 sum: the
only error is x's rounding, as for Q4_K (qdot_i8.py). `qmatmul_i8_q6k_ref` defines the result.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu_kernels import qtypes as qt
from gpu_kernels.dequant_ref import dequantize
from gpu_kernels.device_function import device_function, interpreter_rows
from gpu_kernels.qdot import chunks_per_step
from gpu_kernels.qdot_i8 import _ASM, XQ, dequantize_x, product_output
from gpu_kernels.qformat import GpuQuant

_TOP = tl.constexpr(-0x7F7F7F80)  # 0x80808080 as an int32: each byte's top bit
_OFFSET = tl.constexpr(0x20202020)  # 32 in each byte


@device_function
def _signed(v):
    """Four unsigned byte codes in [0, 64) -> the same bytes minus 32, as signed bytes."""
    return ((v | _TOP) - _OFFSET) ^ _TOP


@device_function
def _sdot(codes, xw, X16: tl.constexpr, ASM: tl.constexpr):
    """Per word of 4 signed byte codes [..]: its dot with its 4 columns of x (xw: x's word
    for it; int16 x in pair order, the second word 4 on)."""
    if X16:
        a0 = tl.load(xw)
        a1 = tl.load(xw + 4)
        if ASM:
            lo = tl.inline_asm_elementwise("dp2a.lo.s32.s32 $0, $1, $2, $3;", "=r,r,r,r",
                                           [a0, codes, tl.zeros_like(codes)], dtype=tl.int32,
                                           is_pure=True, pack=1)
            return tl.inline_asm_elementwise("dp2a.hi.s32.s32 $0, $1, $2, $3;", "=r,r,r,r",
                                             [a1, codes, lo], dtype=tl.int32, is_pure=True,
                                             pack=1)
        b0, b1 = (codes << 24) >> 24, (codes << 16) >> 24
        b2, b3 = (codes << 8) >> 24, codes >> 24
        return (((a0 << 16) >> 16) * b0 + (a0 >> 16) * b1
                + ((a1 << 16) >> 16) * b2 + (a1 >> 16) * b3)
    a = tl.load(xw)
    if ASM:
        return tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r",
                                         [a, codes, tl.zeros_like(codes)], dtype=tl.int32,
                                         is_pure=True, pack=1)
    return (((a << 24) >> 24) * ((codes << 24) >> 24) + ((a << 16) >> 24) * ((codes << 16) >> 24)
            + ((a << 8) >> 24) * ((codes << 8) >> 24) + (a >> 24) * (codes >> 24))


@triton.jit
def _q6k_i8_kernel(xq_p, xd_p, y_p, ql_p, qh_p, sc_p, d_p, M, N, G, row0, gstride, KL, KH,
                   KX, KS, KD, sym, syg, BM: tl.constexpr, BN: tl.constexpr, NC: tl.constexpr,
                   X16: tl.constexpr, ASM: tl.constexpr):
    """y[m, g, n] for BM tokens x BN rows of group g (W's rows row0 + g * gstride + n; x's row
    m * G + g); a K step is NC halves of 128 columns, each 2 x 8 words of ql and 8 of qh.
    KL, KH, KX: int32 words of ql / qh / x per row; KS: scales (K / 16), KD: d's (K / 256)."""
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    m = tl.program_id(1) * BM + tl.arange(0, BM)
    g0 = tl.program_id(2)
    # [.., 2, 4] per scale of a 32-column run: sub-block (16 columns) s, word u within it; the
    # 4-d forms index the scales, the 5-d ones the words
    r4 = (row0 + g0 * gstride + tl.where(n < N, n, 0)).to(tl.int64)[None, :, None, None]
    mm4 = (tl.where(m < M, m, 0).to(tl.int64) * G + g0)[:, None, None, None]  # x's rows
    c4 = tl.arange(0, NC)[None, None, :, None]  # [1, 1, NC, 1]
    s4 = tl.arange(0, 2)[None, None, None, :]  # [1, 1, 1, 2]
    r, mm, s = r4[:, :, :, :, None], mm4[:, :, :, :, None], s4[:, :, :, :, None]
    u = tl.arange(0, 4)[None, None, None, None, :]
    acc = tl.zeros((BM, BN, NC, 2), dtype=tl.float32)  # scaled integer dots, per 16 columns
    for j0 in range(0, KS // 8, NC):
        j4 = j0 + c4  # half super-block
        j = j4[:, :, :, :, None]
        lo = tl.load(ql_p + r * KL + j * 16 + s * 4 + u)  # [1, BN, NC, 2, 4] ql bytes 0..31
        hi = tl.load(ql_p + r * KL + j * 16 + 8 + s * 4 + u)  # ql bytes 32..63
        qh = tl.load(qh_p + r * KH + j * 8 + s * 4 + u)
        d = tl.load(d_p + r4 * KD + j4 // 2).to(tl.float32)  # [1, BN, NC, 1]
        sc = sc_p + r4 * KS + j4 * 8 + s4  # [1, BN, NC, 2]
        xd = xd_p + mm4 * (KS // 2) + j4 * 4  # [BM, 1, NC, 1]
        for q in tl.static_range(4):  # the 32-column runs: ql's low / high nibbles, qh's bits
            nib = lo if q % 2 == 0 else hi
            if q >= 2:
                nib = nib >> 4
            codes = _signed((nib & 0x0F0F0F0F) | (((qh >> (2 * q)) & 0x03030303) << 4))
            if X16:  # 32 columns are 16 words of x: sub-block s at 8 s, its pairs u and u + 4
                xw = xq_p + mm * KX + j * 64 + q * 16 + s * 8 + u
            else:
                xw = xq_p + mm * KX + j * 32 + q * 8 + s * 4 + u
            # x's pointers in the codes' shape (qdot_i8.py: one layout for both loads)
            xw = tl.broadcast_to(xw, (BM, BN, NC, 2, 4))
            dots = tl.sum(_sdot(codes, xw, X16, ASM), axis=4)  # [BM, BN, NC, 2]
            acc += (d * tl.load(sc + 2 * q).to(tl.float32)) * tl.load(xd + q) \
                * dots.to(tl.float32)
    y = tl.sum(tl.sum(acc, axis=3), axis=2)  # [BM, BN]
    tl.store(y_p + g0.to(tl.int64) * syg + m.to(tl.int64)[:, None] * sym + n[None, :], y,
             mask=(m < M)[:, None] & (n < N)[None, :])


# (rows per program, halves per K step, warps): first or second of the sweep on every one-token
# shape but V3's dense down (scripts/probe_int_products.py --qtype Q6_K, docs/kernel-tuning.md)
Q6K_TILES = (4, 8, 1)


def qmatmul_i8_q6k(xq: XQ, w: GpuQuant, out_rows: int | None = None, row0: int = 0,
                   gstride: int = 0, groups: int = 1, out: torch.Tensor | None = None,
                   tiles: tuple[int, int, int] | None = None) -> torch.Tensor:
    """xq (quantize_x of x [M, K] or [M, G, K]) times W's Q6_K rows -> [M, N] or [M, G, N]
    fp32 (qdot_i8.qmatmul_i8's contract)."""
    if w.qtype != qt.Q6_K:
        raise ValueError(f"qmatmul_i8_q6k takes Q6_K, not {qt.name(w.qtype)}")
    k = w.cols
    m, n, y, y3 = product_output(xq, w, out_rows, row0, groups, out)
    bn, nc, warps = tiles or Q6K_TILES
    bn = bn if tiles is not None else interpreter_rows(bn)
    nc = chunks_per_step(qt.Q6_K, k, nc)
    bm = max(1, triton.next_power_of_2(m))
    ql, qh, sc, d = w.planes
    _q6k_i8_kernel[(triton.cdiv(n, bn), triton.cdiv(m, bm), groups)](
        xq.q.view(torch.int32), xq.d, y3, ql.view(torch.int32), qh.view(torch.int32), sc, d,
        m, n, groups, row0, gstride, k // 8, k // 16, k * xq.q.element_size() // 4, k // 16,
        k // 256, y3.stride(0), y3.stride(1), BM=bm, BN=bn, NC=nc,
        X16=xq.q.dtype == torch.int16, ASM=_ASM, num_warps=warps)
    return y if out is not None or groups > 1 else y.reshape(m, n)


def qmatmul_i8_q6k_ref(xq: XQ, w: GpuQuant, out_rows: int | None = None, row0: int = 0,
                       gstride: int = 0, groups: int = 1) -> torch.Tensor:
    """float64 reference -> [M, G, N] fp32: W's dequantization times x as the kernel sees it
    (q * d per block of 32)."""
    n = w.rows - row0 if out_rows is None else out_rows
    wq = dequantize(w).double().cpu()  # [R, K]
    xhat = dequantize_x(xq).cpu().reshape(-1, groups, w.cols)  # [M, G, K]
    idx = row0 + gstride * torch.arange(groups)[:, None] + torch.arange(n)[None, :]  # [G, n]
    return torch.einsum("mgk,gnk->mgn", xhat, wq[idx]).float()
