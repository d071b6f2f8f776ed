"""Matrix products on quantized weights, dequantized tile by tile inside the kernel.

    qmatmul(x, w)      y[m, g, n] = sum_k x[m, g, k] * W[row0 + g * gstride + n, k]
    qmatmul_t(x, w)    y[m, g, k] = sum_n x[m, g, n] * W[row0 + g * gstride + n, k]

W is a `GpuQuant` [rows, K]; g batches groups of rows (MLA's per-head products: the heads of
kv_b, k_b or v_b), row0 skips rows (the value half of a legacy kv_b). x and y are fp32.

How a tile is multiplied depends on the token count M:
- M = 1 on a weight with `x_bits` of a type in INT_PRODUCTS (Q4_K, Q6_K): x quantized per 32
  columns, integer dot products (qdot_i8.py, qdot_i8_q6k.py; int16 x: ~3e-5 relative error,
  1.5-3.8x the fp32 speed).
- M <= 8 (decode): fp32 products summed over k in registers: exact to fp32 rounding.
- M > 8: tensor cores, `tl.dot` in tf32x3 (three tf32 products: fp32 accuracy, ~1e-6).
- M >= dequant_rows.SCRATCH_MIN_TOKENS (long prompts): the rows dequantized once into an fp32
  scratch and multiplied by cuBLAS in fp32 (dequant_rows.py).
The weights are read once per program and M-block: decode reads each weight once.
qmatmul's per-type bodies are qdot.py's (wide loads of the packed codes); qmatmul_t (only MLA's
legacy kv_b absorption uses it) reads dequant_tile.py's gathered tiles, and at decode on Q4_K
and Q6_K rows the codes as they lie (qmatmul_t_kquant.py).
`qmatmul_ref` and `qmatmul_t_ref` (torch on the reference dequantization) define the result.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu_kernels import qmatmul_t_kquant as kquant_t
from gpu_kernels import qtypes as qt
from gpu_kernels.dequant_ref import dequantize
from gpu_kernels.dequant_rows import SCRATCH_MIN_TOKENS, scratch_matmul
from gpu_kernels.dequant_tile import dequant_tile, plane_args
from gpu_kernels.device_function import interpreter_rows
from gpu_kernels.qdot import CHUNK, PART, chunks_per_step, qdot_step
from gpu_kernels.qdot_i8 import XQ, qmatmul_i8, quantize_x
from gpu_kernels.qdot_i8_q6k import qmatmul_i8_q6k
from gpu_kernels.qformat import GpuQuant

DOT_MIN_TOKENS = 9  # from this many tokens on, tiles go through tensor cores
# one-token products on integer activations, by weight type (each beside its float64 reference)
INT_PRODUCTS = {qt.Q4_K: qmatmul_i8, qt.Q6_K: qmatmul_i8_q6k}


@triton.jit(do_not_specialize=["M"])
def _qmm_kernel(x_ptr, y_ptr, p0, p1, p2, p3, p4, p5, M, N, K, row0, gstride,
                sxm, sxg, sym, syg, QT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                NC: tl.constexpr, STEP: tl.constexpr, L: tl.constexpr, DOT: tl.constexpr,
                STAGES: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    g = tl.program_id(2)
    n = pid_n * BN + tl.arange(0, BN)  # [BN]
    m = pid_m * BM + tl.arange(0, BM)  # [BM]
    nmask = n < N
    mmask = m < M
    r = (row0 + g * gstride + n).to(tl.int64)[:, None, None]  # [BN, 1, 1]
    x_row = x_ptr + g.to(tl.int64) * sxg + m.to(tl.int64)[:, None] * sxm  # [BM, 1]
    if DOT:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN, L), dtype=tl.float32)  # products, summed after the loop
    for k0 in tl.range(0, K, STEP, num_stages=STAGES):
        acc = qdot_step(QT, acc, x_row, mmask, p0, p1, p2, p3, p4, p5, r,
                        nmask[:, None, None], K, k0, NC, DOT)
    if not DOT:
        acc = tl.sum(acc, axis=2)
    y = y_ptr + g.to(tl.int64) * syg + m.to(tl.int64)[:, None] * sym + n[None, :]
    tl.store(y, acc, mask=mmask[:, None] & nmask[None, :])


@triton.jit(do_not_specialize=["M"])
def _qmm_t_kernel(x_ptr, y_ptr, p0, p1, p2, p3, p4, p5, M, N, K, row0, gstride,
                  sxm, sxg, sym, syg, QT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                  BK: tl.constexpr, DOT: tl.constexpr):
    pid_k = tl.program_id(0)
    pid_m = tl.program_id(1)
    g = tl.program_id(2)
    e = (pid_k * BK + tl.arange(0, BK))[None, :]  # [1, BK]
    m = pid_m * BM + tl.arange(0, BM)
    mmask = m < M
    x_row = x_ptr + g.to(tl.int64) * sxg + m.to(tl.int64)[:, None] * sxm  # [BM, 1]
    acc = tl.zeros((BM, BK), dtype=tl.float32)
    for n0 in range(0, N, BN):
        n = n0 + tl.arange(0, BN)
        nmask = n < N
        r = (row0 + g * gstride + n).to(tl.int64)[:, None]
        w = dequant_tile(QT, p0, p1, p2, p3, p4, p5, r, e, K, nmask[:, None])  # [BN, BK]
        x = tl.load(x_row + n[None, :], mask=mmask[:, None] & nmask[None, :], other=0.0)  # [BM, BN]
        if DOT:
            acc += tl.dot(x, w, input_precision="tf32x3")
        else:
            acc += tl.sum(x[:, :, None] * w[None, :, :], axis=1)
    y = y_ptr + g.to(tl.int64) * syg + m.to(tl.int64)[:, None] * sym + e
    tl.store(y, acc, mask=mmask[:, None])


T_ROWS = 32  # rows per step of the transposed product's decode path
# with few groups (heads) the grid is small: a group's rows in one step, narrower programs
FEW_GROUPS, FEW_GROUPS_TILES = 64, (128, 32, 4)


def _bk(w: GpuQuant) -> int:
    return 64 if w.cols % 64 == 0 else 32


def _check(x: torch.Tensor, w: GpuQuant, width: int) -> torch.Tensor:
    if x.dtype != torch.float32:
        x = x.float()
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.shape[-1] != width:
        raise ValueError(f"x has {x.shape[-1]} features, the weight takes {width}")
    if w.cols % 32:
        raise ValueError(f"weight rows of {w.cols} columns: need a multiple of 32")
    return x


def _as_3d(x: torch.Tensor) -> torch.Tensor:
    return x if x.dim() == 3 else x.reshape(-1, 1, x.shape[-1])


# One token count per tile class of _tiles: a step of each compiles every product variant a
# step can need (the model runner's start-up warm-up runs them).
TOKEN_CLASSES = (1, 2, 4, 8, 16, 32, 64)


def _tiles(m: int) -> tuple[int, bool]:
    """(BM, uses tensor cores) for m tokens."""
    if m < DOT_MIN_TOKENS:
        return max(1, triton.next_power_of_2(m)), False
    return (16 if m <= 16 else 32 if m <= 32 else 64), True


def qmatmul(x: torch.Tensor, w: GpuQuant, out_rows: int | None = None, row0: int = 0,
            gstride: int = 0, out: torch.Tensor | None = None,
            tiles: tuple[int, ...] | None = None, xq: XQ | None = None) -> torch.Tensor:
    """x: [M, K] or [M, G, K] -> [M, N] or [M, G, N] fp32, N = out_rows (default all rows).
    `tiles` (rows per program, weights per K step, warps[, stages]) overrides the defaults.
    `xq`: x already quantized to w.x_bits by its producer (fused.add_rmsnorm, silu_mul),
    taken when the integer path applies (see uses_int_path)."""
    n_rows = w.rows - row0 if out_rows is None else out_rows
    x = _check(x, w, w.cols)
    x3 = _as_3d(x)
    m, g, _ = x3.shape
    y = out if out is not None else torch.empty(*x.shape[:-1], n_rows, dtype=torch.float32,
                                                 device=x.device)
    y3 = y.reshape(m, g, n_rows)
    if tiles is None and m >= SCRATCH_MIN_TOKENS:  # many tokens: decode each weight once
        scratch_matmul(x3, w, n_rows, row0, gstride, y3)
        return y
    bm, dot = _tiles(m)
    if tiles is None and uses_int_path(w, m):
        if xq is None or xq.q.element_size() * 8 != w.x_bits:
            xq = quantize_x(x3, w.x_bits)
        INT_PRODUCTS[w.qtype](xq, w, n_rows, row0, gstride, g, out=y3)
        return y
    bn, step, warps, stages = _product_tiles(w.qtype, bm, dot, tiles, w.cols)
    bn = bn if tiles is not None else interpreter_rows(bn)
    nc = chunks_per_step(w.qtype, w.cols, max(1, step // CHUNK[w.qtype]))
    grid = (triton.cdiv(n_rows, bn), triton.cdiv(m, bm), g)
    _qmm_kernel[grid](x3, y3, *plane_args(w.planes), m, n_rows, w.cols, row0, gstride,
                      x3.stride(0), x3.stride(1), y3.stride(0), y3.stride(1),
                      QT=w.qtype, BM=bm, BN=bn, NC=nc, STEP=nc * CHUNK[w.qtype],
                      L=nc * PART[w.qtype], DOT=dot, STAGES=stages, num_warps=warps)
    return y


def uses_int_path(w: GpuQuant, tokens: int) -> bool:
    """Whether a product of `tokens` rows of x with w takes integer activations."""
    return tokens == 1 and w.x_bits > 0 and w.qtype in INT_PRODUCTS


# (rows per program, weights per K step, warps, pipeline stages). Decode is bound by memory
# latency: many small programs, the products kept in registers until the end of the K loop
# (BM tokens take a step 1/BM as long); the shapes per type are swept (docs/kernel-tuning.md).
# Tensor-core tiles take more rows.
DECODE_TILES = {None: (2, 1024, 2, 1), qt.Q4_K: (2, 1024, 1, 1), qt.Q5_K: (2, 512, 2, 3),
                qt.Q6_K: (1, 1024, 1, 1), qt.Q2_K: (2, 512, 2, 1), qt.Q3_K: (2, 512, 2, 1)}
# Per token count (BM), where measured better than DECODE_TILES (docs/kernel-tuning.md): 2-8
# tokens take more rows per program, so each weight's dequantization serves more products.
TOKEN_TILES = {(qt.F32, 1): (1, 2048, 4, 1), (qt.Q8_0, 1): (1, 512, 1, 1),
               (qt.Q8_0, 2): (4, 1024, 4, 1),
               (qt.Q8_0, 4): (8, 1024, 4, 1), (qt.Q8_0, 8): (16, 1024, 8, 1),
               (qt.Q4_K, 2): (4, 1024, 4, 1), (qt.Q4_K, 4): (4, 1024, 4, 1),
               (qt.Q4_K, 8): (4, 512, 2, 1), (qt.Q6_K, 4): (4, 512, 2, 1),
               (qt.Q6_K, 8): (4, 512, 2, 1)}
SHORT_ROW_TILES = {qt.Q8_0: (8, 256, 2, 1)}  # one token, rows of <= SHORT_ROW columns
SHORT_ROW = 256  # columns
DOT_TILES = (32, 64, 8, 1)


def _product_tiles(qtype: int, bm: int, dot: bool, tiles: tuple[int, ...] | None,
                   cols: int) -> tuple[int, int, int, int]:
    if tiles is None and not dot:
        short = SHORT_ROW_TILES.get(qtype) if bm == 1 and cols <= SHORT_ROW else None
        tiles = short or TOKEN_TILES.get((qtype, bm)) or DECODE_TILES.get(
            qtype, DECODE_TILES[None])
    if tiles is None:
        tiles = DOT_TILES
    bn, step, warps, stages = (*tiles, 1)[:4]
    if not dot:
        step = step // bm
    if dot:
        # tl.dot's smallest tile is 16; types whose step is 128 wide take 16 rows (no spills)
        bn = 16 if CHUNK[qtype] > step else max(bn, 16)
    return bn, max(step, CHUNK[qtype]), warps, stages


def qmatmul_t(x: torch.Tensor, w: GpuQuant, in_rows: int, row0: int = 0, gstride: int = 0,
              out: torch.Tensor | None = None,
              tiles: tuple[int, int, int] | None = None) -> torch.Tensor:
    """x: [M, G, in_rows] -> [M, G, K] fp32 (x times rows row0 + g * gstride + [0, in_rows)).
    `tiles` (rows per step, columns per program, warps) overrides the defaults."""
    x = _check(x, w, in_rows)
    x3 = _as_3d(x)
    m, g, _ = x3.shape
    y = out if out is not None else torch.empty(*x.shape[:-1], w.cols, dtype=torch.float32,
                                                 device=x.device)
    y3 = y.reshape(m, g, w.cols)
    bm, dot = _tiles(m)
    # many heads (V3's 128): the codes as they lie; with few (V2-Lite's 16) a head's chunks
    # make too small a grid and the gathered tiles are faster (docs/kernel-tuning.md)
    if tiles is None and not dot and g >= FEW_GROUPS and kquant_t.takes(w, m):
        kquant_t.qmatmul_t_kquant(x3, w, in_rows, row0, gstride, y3)
        return y
    bn, bk, warps = tiles if tiles is not None else gathered_tiles(w, g, in_rows, m)
    grid = (w.cols // bk, triton.cdiv(m, bm), g)
    _qmm_t_kernel[grid](x3, y3, *plane_args(w.planes), m, in_rows, w.cols, row0, gstride,
                        x3.stride(0), x3.stride(1), y3.stride(0), y3.stride(1),
                        QT=w.qtype, BM=bm, BN=bn, BK=bk, DOT=dot, num_warps=warps)
    return y


def gathered_tiles(w: GpuQuant, groups: int, in_rows: int, tokens: int) -> tuple[int, int, int]:
    """qmatmul_t's default (rows per step, columns per program, warps) for its gathered-tile
    body."""
    if tokens >= DOT_MIN_TOKENS:
        return 32, _bk(w), 8
    # decode: the rows (a head's nope dims, 128) in 4 steps, not 8: the grid is only
    # cols / BK x heads programs, each a chain of dependent steps; with fewer than FEW_GROUPS
    # heads (V2-Lite's 16) in one step over twice the programs
    if groups < FEW_GROUPS and in_rows <= FEW_GROUPS_TILES[0] \
            and w.cols % FEW_GROUPS_TILES[1] == 0:
        return FEW_GROUPS_TILES
    return T_ROWS, _bk(w), 4


def _group_rows(w: GpuQuant, n: int, g: int, row0: int, gstride: int) -> torch.Tensor:
    """Rows [G, n] of the reference matrix that group g reads."""
    idx = row0 + gstride * torch.arange(g)[:, None] + torch.arange(n)[None, :]
    return dequantize(w)[idx.to(w.device)]  # [G, n, K]


def qmatmul_ref(x: torch.Tensor, w: GpuQuant, out_rows: int | None = None, row0: int = 0,
                gstride: int = 0) -> torch.Tensor:
    """The float64 reference of qmatmul, returned as fp32."""
    n = w.rows - row0 if out_rows is None else out_rows
    x3 = _as_3d(x).double()
    wg = _group_rows(w, n, x3.shape[1], row0, gstride).double()  # [G, n, K]
    y = torch.einsum("mgk,gnk->mgn", x3, wg)
    return y.reshape(*x.shape[:-1], n).float()


def qmatmul_t_ref(x: torch.Tensor, w: GpuQuant, in_rows: int, row0: int = 0,
                  gstride: int = 0) -> torch.Tensor:
    x3 = _as_3d(x).double()
    wg = _group_rows(w, in_rows, x3.shape[1], row0, gstride).double()  # [G, n, K]
    y = torch.einsum("mgn,gnk->mgk", x3, wg)
    return y.reshape(*x.shape[:-1], w.cols).float()
