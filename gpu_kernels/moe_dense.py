"""Routed experts for long prompts on weights dequantized once: every expert of a layer (or of a
streamed unit) decoded into fp16 rows, then each product a grouped fp16 GEMM on the tensor cores.

    moe_experts_dense(x, ids, weights, gate_up16, down16, E)[t] =
        sum_k weights[t, k] * down_e(silu(gate_e x_t) * up_e x_t),   e = ids[t, k]

moe_grouped.py decodes each weight tile inside the product, once per block of pairs: with
hundreds of pairs an expert (a prompt of thousands of tokens) every weight is decoded many times
and the products run far below the tensor cores' rate. Here the decode runs once per weight
(dequant_rows.py, fp16 out: the values fast mode's fp16 tiles multiply anyway) and the product
reads plain fp16 rows, so the cost is the weights' one decode plus dense GEMMs. x and h are
rounded to fp16 as in moe_grouped's fp16 tiles (fast mode's error budget). The pairs are grouped
by expert with moe_grouped.align; nothing synchronizes with the host.
`moe_grouped.moe_experts_ref` (float64) defines the result.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gpu_kernels.dequant_rows import dequant_rows
from gpu_kernels.moe_grouped import block_pairs, grouped_experts
from gpu_kernels.qformat import GpuQuant

# rows per program (pairs), weights per program, K per step, warps, stages
TILES = (128, 128, 64, 8, 3)
# (token, choice) pairs per expert (on average over the layer's experts) from which products run
# here rather than on moe_grouped's tiles: the decode's fixed cost against the tiles' repeated
# decoding (the crossovers measured: docs/long-prompts.md)
DENSE_MIN_PAIRS_PER_EXPERT = 96


@triton.jit
def _dense_kernel(x_ptr, w_ptr, y_ptr, slots_ptr, bexp_ptr, R, K, XDIV, sxm, sym,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):
    pid_n = tl.program_id(0)
    blk = tl.program_id(1)
    e = tl.load(bexp_ptr + blk)
    if e >= 0:  # blocks past the real count hold -1
        s, mmask = block_pairs(slots_ptr, blk, BM)  # [BM]
        n = pid_n * BN + tl.arange(0, BN)  # [BN]
        nmask = n < R
        x_row = x_ptr + (s // XDIV)[:, None] * sxm  # [BM, 1]
        w_row = w_ptr + (e.to(tl.int64) * R + n)[None, :] * K  # [1, BN]
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in tl.range(0, K, BK, num_stages=STAGES):
            k = k0 + tl.arange(0, BK)
            a = tl.load(x_row + k[None, :], mask=mmask[:, None], other=0.0)  # [BM, BK] fp16
            b = tl.load(w_row + k[:, None], mask=nmask[None, :], other=0.0)  # [BK, BN] fp16
            acc = tl.dot(a, b, acc)
        y = y_ptr + s[:, None] * sym + n[None, :]
        tl.store(y, acc, mask=mmask[:, None] & nmask[None, :])


def dense_rows(w: GpuQuant) -> torch.Tensor:
    """w's rows dequantized once: [rows, K] fp16."""
    return dequant_rows(w, w.rows, dtype=torch.float16)[0]


def fits(k: int) -> bool:
    """Whether products over K columns tile (K whole steps of TILES' BK)."""
    return k % TILES[2] == 0


def grouped_dense(x16: torch.Tensor, w16: torch.Tensor, rows: int, slots: torch.Tensor,
                  block_expert: torch.Tensor, x_div: int, out: torch.Tensor) -> torch.Tensor:
    """out[p, :rows] = x16[p // x_div] @ W_e^T for every pair p in `slots` (W_e: rows
    e * rows + [0, rows) of w16 [E * rows, K] fp16); x16 [*, K] fp16; out [NK, >= rows] f32
    (a column slice is fine). `slots`/`block_expert`: moe_grouped.align's, at TILES' BM."""
    bm, bn, bk, warps, stages = TILES
    k = w16.shape[1]
    if x16.shape[-1] != k or not fits(k) or x16.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError(f"grouped_dense: x {tuple(x16.shape)} against weights of {k} columns "
                         f"(a multiple of {bk}), last dims dense")
    grid = (triton.cdiv(rows, bn), block_expert.shape[0])
    _dense_kernel[grid](x16, w16, out, slots, block_expert, rows, k, x_div, x16.stride(0),
                        out.stride(0), BM=bm, BN=bn, BK=bk, STAGES=stages, num_warps=warps)
    return out


def moe_experts_dense(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                      gate_up: tuple[GpuQuant, ...], down: GpuQuant,
                      num_experts: int, limit: float = math.inf) -> torch.Tensor:
    """moe_grouped.moe_experts' contract. Each tensor is decoded into fp16 just before its
    product and dropped after it: one tensor's fp16 rows at a time."""
    def product(a, w, rows, slots, block_expert, x_div, out):
        grouped_dense(a, dense_rows(w), rows, slots, block_expert, x_div, out)
    return grouped_experts(x, ids, weights, gate_up, down, num_experts, TILES[0], product,
                           torch.float16, limit)
