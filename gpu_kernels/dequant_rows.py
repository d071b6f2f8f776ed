"""Quantized rows dequantized whole into float32, for products with many tokens.

    dequant_rows(w, n, row0, gstride, groups)[g, i, k] = W[row0 + g * gstride + i, k]

qmatmul's kernel dequantizes each weight tile once per block of 64 tokens and multiplies in
tf32x3 (three tensor-core products): at 2048 tokens every weight is decoded 32 times, which
made the dense linears a large share of a long prompt (docs/kernel-tuning.md). From
SCRATCH_MIN_TOKENS tokens on, qmatmul
dequantizes the rows once into this scratch (SCRATCH_BYTES at most at a time) and multiplies
with cuBLAS: each weight decoded once. In fp32 the products are exact to fp32 rounding like
tf32x3; a weight with `fp16_prompts` is decoded to fp16 and x's rows are scaled by powers of two
(the largest |x| of a row to 2^14: no overflow, nothing lost to the scale) and rounded to fp16,
so the products run on tensor cores with fp32 sums (~5e-4 relative, tf32's mantissa).
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


FP16_ROW_MAX = 2.0 ** 14  # a row's largest |x| after scaling (fp16's largest finite: 65504)


def fp16_rows(x3: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x3 [M, G, K] fp32 -> (x16 [M, G, K] fp16, scale [M, G, 1] fp32) with x3 ~= x16 * scale:
    each row divided by a power of two (exact) that brings its largest |x| to (2^13, 2^14]."""
    amax = x3.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    scale = torch.exp2(torch.ceil(torch.log2(amax / FP16_ROW_MAX)))  # [M, G, 1]
    return (x3 / scale).half(), scale


# cuBLAS's fp16 products with an fp32 result (aten's mm.dtype / bmm.dtype overloads, newer
# than the oldest torch pyproject.toml allows)
_MM_OUT_DTYPE = hasattr(torch.ops.aten.mm, "dtype") and hasattr(torch.ops.aten.bmm, "dtype")


def _mm16(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [.., M, K] fp16 @ b [.., K, N] fp16 -> fp32 with fp32 sums (cuBLAS on CUDA; elsewhere,
    or on a torch without those overloads, the fp16 values multiplied in fp32: the same
    products, slower)."""
    if a.is_cuda and _MM_OUT_DTYPE:
        mm = torch.mm if a.dim() == 2 else torch.bmm
        return mm(a, b, out_dtype=torch.float32)
    return torch.matmul(a.float(), b.float())


def scratch_matmul(x3: torch.Tensor, w: GpuQuant, n: int, row0: int, gstride: int,
                   y3: torch.Tensor) -> None:
    """y3[m, g, :] = x3[m, g, :] @ rows(g)^T, x3 [M, G, K] fp32, y3 [M, G, n]: the rows
    dequantized into the scratch, as many groups (or, for one group, rows) per round as
    SCRATCH_BYTES holds, each round one cuBLAS product (fp16 operands where w.fp16_prompts)."""
    _, g, k = x3.shape
    dtype = torch.float16 if w.fp16_prompts else torch.float32
    scale = None
    if w.fp16_prompts:
        x3, scale = fp16_rows(x3)
    mm = _mm16 if w.fp16_prompts else torch.matmul  # 2-D or batched
    row_bytes = dtype.itemsize * k
    if g == 1:
        step = max(ROWS, SCRATCH_BYTES // row_bytes // ROWS * ROWS)
        for n0 in range(0, n, step):
            rows = min(step, n - n0)
            wt = dequant_rows(w, rows, row0 + n0, dtype=dtype)[0]  # [rows, K]
            y3[:, 0, n0:n0 + rows] = mm(x3[:, 0, :], wt.T)
    else:
        per = max(1, SCRATCH_BYTES // (row_bytes * n))
        for g0 in range(0, g, per):
            gs = min(per, g - g0)
            wt = dequant_rows(w, n, row0 + g0 * gstride, gstride, gs, dtype)  # [gs, n, K]
            # [gs, M, K] @ [gs, K, n] -> [gs, M, n]
            y3[:, g0:g0 + gs, :] = mm(x3[:, g0:g0 + gs, :].transpose(0, 1),
                                      wt.transpose(1, 2)).transpose(0, 1)
    if scale is not None:
        y3.mul_(scale)
