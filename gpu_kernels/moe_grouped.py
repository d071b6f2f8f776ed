"""Routed experts on the GPU for many tokens at once, every expert in one launch per product.

    moe_experts(x, ids, weights, (gate, up), down)[t] =
        sum_k weights[t, k] * down_e(silu(gate_e x_t) * up_e x_t),   e = ids[t, k]

(with a `limit`, DeepSeek-V4's clamped SwiGLU: min(gate_e x_t, limit) and up_e x_t clamped to
[-limit, limit] inside).

An expert tensor is the GGUF's [E, R, K] as one GpuQuant of E * R rows (expert e's row n is
e * R + n), in the file's blocks: nothing is dequantized outside the kernel. The N * K
(token, choice) pairs are sorted by expert into blocks of BM pairs (`align`, on the device):
each block holds pairs of one expert, padded with -1, so a program multiplies BM gathered rows
of x by BN rows of that expert's weight with qdot.py's per-type bodies (tensor cores, tf32x3,
from DOT_MIN_TOKENS pairs an expert on; fp32 products below). A pair whose expert id is
negative (an expert this tensor does not hold) is left out: its term is 0.

Nothing synchronizes with the host: the block count is bounded (cdiv(NK, BM) + min(E, NK)),
blocks past the real count exit at once, so the launches can run inside a CUDA graph.
`moe_experts_ref` (float64 on the reference dequantization) defines the result.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gpu_kernels.dequant_ref import dequantize
from gpu_kernels.dequant_tile import plane_args
from gpu_kernels.device_function import interpreter_rows
from gpu_kernels.fused import silu_mul
from gpu_kernels.qdot import CHUNK, PART, chunks_per_step, qdot_step
from gpu_kernels.qformat import GpuQuant
from gpu_kernels.qmatmul import _product_tiles, _tiles


@triton.jit
def block_pairs(slots_ptr, blk, BM: tl.constexpr):
    """Block blk's BM pair indices (int64; padding read as pair 0) and which are real."""
    s = tl.load(slots_ptr + blk * BM + tl.arange(0, BM))  # [BM] pair index, -1 padding
    mmask = s >= 0
    return tl.where(mmask, s, 0).to(tl.int64), mmask


@triton.jit
def _grouped_kernel(x_ptr, y_ptr, slots_ptr, bexp_ptr, p0, p1, p2, p3, p4, p5, R, K, XDIV,
                    sxm, sym, QT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                    NC: tl.constexpr, STEP: tl.constexpr, L: tl.constexpr, DOT: tl.constexpr,
                    STAGES: tl.constexpr):
    pid_n = tl.program_id(0)
    blk = tl.program_id(1)
    e = tl.load(bexp_ptr + blk)
    if e >= 0:  # blocks past the real count hold -1
        s, mmask = block_pairs(slots_ptr, blk, BM)  # [BM]
        x_row = x_ptr + (s // XDIV)[:, None] * sxm  # [BM, 1]
        n = pid_n * BN + tl.arange(0, BN)  # [BN]
        nmask = n < R
        r = (e.to(tl.int64) * R + n)[:, None, None]  # [BN, 1, 1]
        if DOT:
            acc = tl.zeros((BM, BN), dtype=tl.float32)
        else:
            acc = tl.zeros((BM, BN, L), dtype=tl.float32)
        for k0 in tl.range(0, K, STEP, num_stages=STAGES):
            acc = qdot_step(QT, acc, x_row, mmask, p0, p1, p2, p3, p4, p5, r,
                            nmask[:, None, None], K, k0, NC, DOT)
        if not DOT:
            acc = tl.sum(acc, axis=2)
        y = y_ptr + s[:, None] * sym + n[None, :]
        tl.store(y, acc, mask=mmask[:, None] & nmask[None, :])


# Tensor-core tiles of the grouped launches (rows per program, weights per K step, warps,
# stages): about half qmatmul's DOT_TILES time on a MoE layer (docs/kernel-tuning.md)
DOT_TILES = (64, 64, 4, 1)


def block_rows(pairs: int, experts: int) -> int:
    """BM for `pairs` (token, choice) pairs over `experts`: the product tile class of the
    pairs an expert gets on average (routing is skewed: a hot expert gets many more)."""
    return _tiles(max(1, pairs // max(1, min(experts, pairs))))[0]


def align(ids: torch.Tensor, num_experts: int, bm: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [N, K] expert per pair (negative: not held) -> (slots [B * bm] int32: pair indices
    t * K + k grouped by expert, each expert's run padded to whole blocks with -1;
    block_expert [B] int32: each block's expert, -1 past the last). B is the static bound
    cdiv(NK, bm) + min(E, NK), so nothing waits for the device."""
    flat = ids.reshape(-1).long()
    nk, dev = flat.numel(), flat.device
    # a padded row's ids may be anything: only ids of held experts count
    held = (flat >= 0) & (flat < num_experts)
    key = torch.where(held, flat, num_experts)  # left-out pairs sort last, into a dump slot
    # scatter_add rather than bincount: bincount reads its maximum back to the host, which a
    # CUDA graph capture refuses (hot experts run inside the captured decode step)
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=dev).scatter_add_(
        0, key, torch.ones_like(key))[:num_experts]  # [E]
    blocks = (counts + bm - 1) // bm  # [E]
    block_end = torch.cumsum(blocks, 0)  # [E]
    nb = triton.cdiv(nk, bm) + min(num_experts, nk)
    order = torch.argsort(key, stable=True)  # [NK] pairs by expert
    sorted_key = key[order]
    first = torch.cumsum(counts, 0) - counts  # [E] first sorted position of each expert
    e = sorted_key.clamp(max=num_experts - 1)
    dest = (block_end[e] - blocks[e]) * bm + torch.arange(nk, device=dev) - first[e]
    dest = torch.where(sorted_key < num_experts, dest, nb * bm)  # the dump slot
    slots = torch.full((nb * bm + 1,), -1, dtype=torch.int32, device=dev)
    slots[dest] = order.to(torch.int32)
    block = torch.arange(nb, device=dev)
    owner = torch.searchsorted(block_end, block, right=True)  # [B] expert of each block
    block_expert = torch.where(block < block_end[-1], owner, -1).to(torch.int32)
    return slots[:nb * bm], block_expert


def grouped_matmul(x: torch.Tensor, w: GpuQuant, rows: int, slots: torch.Tensor,
                   block_expert: torch.Tensor, bm: int, x_div: int, out: torch.Tensor,
                   tiles: tuple[int, ...] | None = None, fp16: bool = False) -> torch.Tensor:
    """out[p, :rows] = x[p // x_div] @ W_e^T for every pair p in `slots` (e its block's
    expert, W_e rows e * rows + [0, rows) of w). x [*, K] f32 rows dense; out [NK, >= rows]
    (a column slice is fine: its rows are strided). Other rows of out are untouched.
    `tiles` (rows per program, weights per K step, warps[, stages]) overrides the defaults;
    `fp16`: tensor-core tiles in fp16 instead of tf32x3 (qdot._mac)."""
    if x.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError("grouped_matmul needs x's and out's last dims dense")
    if x.shape[-1] != w.cols or w.rows % rows:
        raise ValueError(f"x of {x.shape[-1]} features and {w.rows} weight rows for "
                         f"experts of {rows} rows x {w.cols}")
    dot = bm > 8
    bn, step, warps, stages = _product_tiles(w.qtype, bm, dot,
                                             tiles or (DOT_TILES if dot else None), w.cols)
    bn = bn if tiles is not None else interpreter_rows(bn)
    nc = chunks_per_step(w.qtype, w.cols, max(1, step // CHUNK[w.qtype]))
    grid = (triton.cdiv(rows, bn), block_expert.shape[0])
    _grouped_kernel[grid](x, out, slots, block_expert, *plane_args(w.planes), rows, w.cols,
                          x_div, x.stride(0), out.stride(0), QT=w.qtype, BM=bm, BN=bn, NC=nc,
                          STEP=nc * CHUNK[w.qtype], L=nc * PART[w.qtype],
                          DOT=2 if dot and fp16 else dot, STAGES=stages, num_warps=warps)
    return out


def moe_experts(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                gate_up: tuple[GpuQuant, ...], down: GpuQuant, num_experts: int,
                bm: int | None = None, limit: float = math.inf, **tiling) -> torch.Tensor:
    """x [N, H] f32, ids [N, K] (negative: not held here), weights [N, K] -> [N, H] f32.
    gate_up: (gate, up), each [E * I, H] rows, or the fused GGUF layout's one [E * 2I, H]
    tensor (each expert's gate rows, then its up rows); down: [E * H, I].
    `bm` (pairs per block, a qmatmul.TOKEN_CLASSES value) overrides block_rows: a warm-up
    compiles every variant with one token. `limit`: the SwiGLU's clamp (inf: none).
    `tiling`: grouped_matmul's tiles and fp16."""
    bm = bm or block_rows(ids.numel(), num_experts)

    def product(a, w, rows, slots, block_expert, x_div, out):
        grouped_matmul(a, w, rows, slots, block_expert, bm, x_div, out, **tiling)
    return grouped_experts(x, ids, weights, gate_up, down, num_experts, bm, product,
                           limit=limit)


def grouped_experts(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                    gate_up: tuple[GpuQuant, ...], down: GpuQuant, num_experts: int, bm: int,
                    product, dtype: torch.dtype = torch.float32,
                    limit: float = math.inf) -> torch.Tensor:
    """The MoE around a grouped product (moe_experts' arguments; the pairs grouped by expert in
    blocks of `bm`): product(a, w, rows, slots, block_expert, x_div, out) writes
    out[p, :rows] = a[p // x_div] @ W_e^T for every pair p, W_e rows e * rows + [0, rows) of w.
    The activations it gets (x, then h) are in `dtype`; `limit` clamps the SwiGLU."""
    n, k = ids.shape
    slots, block_expert = align(ids, num_experts, bm)
    xa = x.to(dtype)
    widths = [w.rows // num_experts for w in gate_up]
    gu = torch.empty(n * k, sum(widths), dtype=torch.float32, device=x.device)  # [NK, 2I]
    col = 0
    for w, width in zip(gate_up, widths):
        product(xa, w, width, slots, block_expert, k, gu[:, col:col + width])
        col += width
    h = down.rows // num_experts
    y = torch.zeros(n * k, h, dtype=torch.float32, device=x.device)  # left-out pairs: 0
    product(silu_mul(gu, limit=limit).to(dtype), down, h, slots, block_expert, 1, y)
    held = torch.where(ids >= 0, weights.float(), 0.0)  # [N, K]
    return torch.einsum("nkh,nk->nh", y.view(n, k, h), held)


def moe_experts_ref(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                    gate: GpuQuant, up: GpuQuant, down: GpuQuant, num_experts: int,
                    limit: float = math.inf) -> torch.Tensor:
    """Float64 reference, one pair at a time; fp32 out."""
    wg, wu, wd = (dequantize(m).double() for m in (gate, up, down))
    inter, h = gate.rows // num_experts, down.rows // num_experts
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for t, k in torch.nonzero(ids >= 0).tolist():
        e = int(ids[t, k])
        xt = x[t].double()
        g = wg[e * inter:(e + 1) * inter] @ xt
        u = wu[e * inter:(e + 1) * inter] @ xt
        g, u = g.clamp(max=limit), u.clamp(min=-limit, max=limit)
        out[t] += float(weights[t, k]) * (wd[e * h:(e + 1) * h] @ (torch.nn.functional.silu(g) * u))
    return out.float()
