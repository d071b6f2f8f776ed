"""Quantized rows dequantized whole into float32, for products with many tokens.

    dequant_rows(w, n, row0, gstride, groups)[g, i, k] = W[row0 + g * gstride + i, k]

qmatmul's kernel dequantizes each weight tile once per block of 64 tokens and multiplies in
tf32x3 (three tensor-core products): at 2048 tokens every weight is decoded 32 times, and the
dense linears took 186 ms of a 2048-token V2-Lite prompt's 431 ms on the H200
(`scripts/profile_prefill.py`), ~14 TFLOP/s. From SCRATCH_MIN_TOKENS tokens on, qmatmul
dequantizes the rows once into this scratch (SCRATCH_BYTES at most at a time) and multiplies
with cuBLAS in fp32: each weight decoded once, products exact to fp32 rounding like tf32x3.
The values are dequant_tile's, so they equal dequant_ref's element for element.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu_kernels.dequant_tile import dequant_tile, plane_args
from gpu_kernels.qformat import GpuQuant

SCRATCH_MIN_TOKENS = 256  # tokens from which qmatmul multiplies through the scratch
SCRATCH_BYTES = 64 << 20  # fp32 rows dequantized at a time (the rest in further rounds)
ROWS = 16  # rows per program


@triton.jit
def _dequant_rows_kernel(out_ptr, p0, p1, p2, p3, p4, p5, N, K, row0, gstride,
                         QT: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr):
    pid_r = tl.program_id(0)
    pid_k = tl.program_id(1)
    g = tl.program_id(2)
    i = pid_r * BR + tl.arange(0, BR)  # [BR]
    imask = i < N
    e = (pid_k * BK + tl.arange(0, BK))[None, :]  # [1, BK]
    r = (row0 + g * gstride + i).to(tl.int64)[:, None]  # [BR, 1]
    w = dequant_tile(QT, p0, p1, p2, p3, p4, p5, r, e, K, imask[:, None])  # [BR, BK]
    out = out_ptr + (g.to(tl.int64) * N + i.to(tl.int64))[:, None] * K + e
    tl.store(out, w.to(out_ptr.dtype.element_ty), mask=imask[:, None])


def _bk(cols: int) -> int:
    """Columns per program: whole quant blocks (every type's block divides 32)."""
    return next(b for b in (128, 64, 32) if cols % b == 0)


def dequant_rows(w: GpuQuant, n: int, row0: int = 0, gstride: int = 0,
                 groups: int = 1, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """-> [groups, n, K] `dtype` (fp32, or fp16 rounding each value): rows
    row0 + g * gstride + [0, n) of w for each group g."""
    k, bk = w.cols, _bk(w.cols)
    y = torch.empty(groups, n, k, dtype=dtype, device=w.planes[0].device)
    grid = (triton.cdiv(n, ROWS), k // bk, groups)
    _dequant_rows_kernel[grid](y, *plane_args(w.planes), n, k, row0, gstride,
                               QT=w.qtype, BR=ROWS, BK=bk, num_warps=4)
    return y


def scratch_matmul(x3: torch.Tensor, w: GpuQuant, n: int, row0: int, gstride: int,
                   y3: torch.Tensor) -> None:
    """y3[m, g, :] = x3[m, g, :] @ rows(g)^T, x3 [M, G, K] fp32, y3 [M, G, n]: the rows
    dequantized into the scratch, as many groups (or, for one group, rows) per round as
    SCRATCH_BYTES holds, each round one cuBLAS product."""
    _, g, k = x3.shape
    row_bytes = 4 * k
    if g == 1:
        step = max(ROWS, SCRATCH_BYTES // row_bytes // ROWS * ROWS)
        for n0 in range(0, n, step):
            rows = min(step, n - n0)
            wt = dequant_rows(w, rows, row0 + n0)[0]  # [rows, K]
            y3[:, 0, n0:n0 + rows] = x3[:, 0, :] @ wt.T
        return
    per = max(1, SCRATCH_BYTES // (row_bytes * n))
    for g0 in range(0, g, per):
        gs = min(per, g - g0)
        wt = dequant_rows(w, n, row0 + g0 * gstride, gstride, gs)  # [gs, n, K]
        # [gs, M, K] @ [gs, K, n] -> [gs, M, n]
        y3[:, g0:g0 + gs, :] = torch.bmm(x3[:, g0:g0 + gs, :].transpose(0, 1),
                                         wt.transpose(1, 2)).transpose(0, 1)
