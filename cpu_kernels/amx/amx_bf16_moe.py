"""The `fast` MoE with experts' products on AMX bf16 tiles (Sapphire Rapids and later).

An expert with at least `min_tokens` tokens in a call has its weights dequantized once per call,
16 rows at a time, to bf16 tiles (amx_bf16_tiles.py: the exact weights rounded to bf16), and its
tokens multiplied against them with tdpbf16ps, 16 tokens x 16 rows x 32 columns per
instruction, accumulating in float32 tiles over the whole row (amx_bf16_rows.py): no per-block
scales to apply afterwards, so nothing but the tile products runs per token. The
dequantization costs the same whether the expert has 12 tokens or 400; VNNI's per-token
unpacking grows with them. Experts with fewer tokens, and types without bf16 tiles (Q2_K,
Q3_K), run packed_moe's VNNI tiles in the same call.

Activations: x rounded to bf16 (gate/up), h rounded to bf16 (down), both gathered in slot order
so an expert's tokens are consecutive rows of an A tile; 32 zero rows of padding let the last
pair of 16-token blocks read whole tiles (results past an expert's tokens are never read).

Phase 1 splits (expert, block of 16 I rows) across threads: h = w * silu(gate x) * up x. Phase 2
splits blocks of 16 H rows across threads, each summing over all experts into its own rows of
out (no two threads write the same element).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from cpu_kernels.amx.amx_bf16_rows import activation_rows, down_rows, gate_up_rows
from cpu_kernels.amx.amx_bf16_tiles import BF16_TILE_TYPES, has_bf16_tiles, to_bf16
from cpu_kernels.exact.routing import route
from cpu_kernels.fast.packed_moe import (
    CHUNK,
    down_group,
    gate_up_group,
    quantize_h,
    quantize_x,
)
from cpu_kernels.fast.packed_tiles import prefetch_start
from cpu_kernels.formats import qtypes as qt
from cpu_kernels.simd.amx import HAS_AMX, tile_shapes_bf16
from cpu_kernels.simd.clock import cycles
from cpu_kernels.simd.task_queue import claim, counters

f32 = np.float32
TILE_CONFIG_BF16 = tile_shapes_bf16()
TILE_CONFIG_BF16.flags.writeable = False
# Experts with fewer tokens run VNNI. AMX's cost per expert is nearly flat up to 16 tokens (its
# dequantization), VNNI's grows with every 4 tokens: they cross near 12 (docs/kernel-tuning.md).
MIN_TOKENS = 12


def runs_on_amx(gate_type: int, up_type: int, down_type: int) -> bool:
    """Whether fast mode on packed experts of these types uses amx_bf16_moe_kernel. Not for a
    layer with an i-quant: its VNNI half calls the K-quant tiles alone (tile_set.KQUANT_TILES)."""
    return HAS_AMX and not any(t in qt.TABLE_CODED for t in (gate_type, up_type, down_type)) and (
        (has_bf16_tiles(gate_type) and has_bf16_tiles(up_type)) or has_bf16_tiles(down_type))


@njit(cache=True)
def _tiles_ok(qtype):
    return qtype in BF16_TILE_TYPES


@njit(parallel=True, nogil=True, cache=True)
def amx_bf16_moe_kernel(tiles, gate_type: int, gate_pk: np.ndarray, up_type: int,
                        up_pk: np.ndarray, down_type: int, down_pk: np.ndarray, x: np.ndarray,
                        topk_ids: np.ndarray, topk_weights: np.ndarray, limit: float,
                        out: np.ndarray, stamps: np.ndarray, cfg: np.ndarray, min_tokens: int,
                        threads: int) -> None:
    # gate_pk, up_pk: [E, I/8, bytes]  down_pk: [E, H/8, bytes] (packed)  x: [T, H] f32
    # topk_ids: [T, K] int64  topk_weights: [T, K] f32  out: [T, H] f32
    # limit: the SwiGLU clamp (exact/swiglu.py; inf: none)
    # stamps: [2] or [3] int64, cycle counter at entry, exit (and where phase 1 ended)
    # tiles: a TileSet holding the three types, for the experts left on VNNI (tile_set.py)
    # cfg: TILE_CONFIG_BF16; an expert with >= min_tokens slots runs on AMX
    # threads: numba.get_num_threads() of the calling thread (numba's own call of it here would
    # keep the kernel out of the on-disk cache); every get_thread_id() is below it
    stamps[0] = cycles()
    expert_ids, offsets, token_ids, weights = route(topk_ids, topk_weights, gate_pk.shape[0])
    num_tokens, hidden = x.shape
    num_used, num_slots = expert_ids.shape[0], token_ids.shape[0]
    groups_i, groups_h = gate_pk.shape[1], down_pk.shape[1]
    inter = 8 * groups_i
    # per-thread scratch: 16 rows of weight tiles (x2 for gate and up), one set of C tiles
    wbuf = np.empty((threads, 2, max(hidden, inter) * 32), np.uint8)
    cbuf = np.empty((threads, 1024), f32)
    fewest = num_slots
    for u in range(num_used):
        fewest = min(fewest, offsets[u + 1] - offsets[u])
    gate_up_tiles = _tiles_ok(gate_type) and _tiles_ok(up_type)
    down_tiles = _tiles_ok(down_type)
    # int8 activations only where some expert stays on VNNI (an empty slice otherwise)
    vnni_gate_up = fewest < min_tokens or not gate_up_tiles
    vnni_down = fewest < min_tokens or not down_tiles
    xq, dx, xqsum, xsum16 = quantize_x(x if vnni_gate_up else x[:0])
    xs = activation_rows(num_slots, hidden)  # [N + 32, H + 32] bf16
    for k in prange(num_slots):
        to_bf16(x[token_ids[k]], xs[k, :hidden])
    h = np.empty((num_slots, inter), f32)  # [N, I]
    blocks_i = (groups_i + 1) // 2
    num_tasks = num_used * blocks_i
    lim = f32(limit)
    counter = counters(1)
    # AMX and VNNI experts' tasks differ in cost: claimed CHUNK at a time (task_queue.py)
    for _ in prange(threads):
        tid = numba.get_thread_id()
        c = claim(counter)
        while c * CHUNK < num_tasks:
            for task in range(c * CHUNK, min(num_tasks, (c + 1) * CHUNK)):
                u = task // blocks_i
                e = expert_ids[u]
                ga = 2 * (task % blocks_i)
                gb = min(ga + 1, groups_i - 1)  # an odd last group pairs with itself
                k_lo, k_hi = offsets[u], offsets[u + 1]
                if gate_up_tiles and k_hi - k_lo >= min_tokens:
                    gate_up_rows(gate_type, gate_pk[e, ga], gate_pk[e, gb], up_type,
                                 up_pk[e, ga], up_pk[e, gb], xs, weights, k_lo, k_hi - k_lo, h,
                                 8 * ga, wbuf[tid, 0], wbuf[tid, 1], cbuf[tid], cfg, lim)
                else:
                    gate_up_group(tiles, gate_type, gate_pk[e, ga], gate_pk[e, gb], up_type,
                                  up_pk[e, ga], up_pk[e, gb], xq, dx, xqsum, xsum16, token_ids,
                                  weights, k_lo, k_hi, h, 8 * ga, inter, lim)
            c = claim(counter)
    if stamps.shape[0] > 2:
        stamps[2] = cycles()
    hq, h_lo, hd, hqsum, hsum_flat = quantize_h(h if vnni_down else h[:0])
    hs = activation_rows(num_slots, inter)  # [N + 32, I + 32] bf16
    for k in prange(num_slots):
        to_bf16(h[k], hs[k, :inter])
    for blk in prange((groups_h + 1) // 2):
        ga = 2 * blk
        gb = min(ga + 1, groups_h - 1)
        r0 = 8 * ga
        lanes = min(8 * (gb - ga + 1), hidden - r0)
        for t in range(num_tokens):
            for lane in range(lanes):
                out[t, r0 + lane] = 0.0
        for u in range(num_used):
            if u + 1 < num_used:
                prefetch_start(down_pk[expert_ids[u + 1], ga], down_pk[expert_ids[u + 1], gb])
            e, k_lo, k_hi = expert_ids[u], offsets[u], offsets[u + 1]
            if down_tiles and k_hi - k_lo >= min_tokens:
                tid = numba.get_thread_id()
                down_rows(down_type, down_pk[e, ga], down_pk[e, gb], hs, k_lo, k_hi - k_lo,
                          token_ids, out, r0, lanes, wbuf[tid, 0], cbuf[tid], cfg)
            else:
                down_group(tiles, down_type, down_pk[e, ga], down_pk[e, gb], hq, h_lo, hd, hqsum,
                           hsum_flat, token_ids, k_lo, k_hi, out, r0, lanes)
    stamps[1] = cycles()
