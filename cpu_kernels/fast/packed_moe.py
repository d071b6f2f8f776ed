"""The fused MoE forward in `fast` mode on packed weights (packed.py, packed_tiles.py).

Same math and phases as moe.py: routing and x's quantization inside the kernel (no per-call
Python work but the call), then phase 1 splits (expert, 16 I rows) across threads and computes
w * silu(gate x) * up x for the expert's tokens, 4 at a time; h is quantized to two int8 planes
per slot; phase 2 splits 16-row blocks of H across threads, each summing over all experts into
its own rows of out (no two threads write the same element). 16 rows are two packed row groups,
one 512-bit tile (packed_tiles).
Past decode the products, not memory waits, set its time (docs/kernel-tuning.md).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from cpu_kernels.exact.routing import route
from cpu_kernels.exact.swiglu import weighted_swiglu
from cpu_kernels.fast.packed_tiles import prefetch_start
from cpu_kernels.fast.q8_activations import quantize_row
from cpu_kernels.fast.tile_set import TileSet, check_covers, tile_family, tile_of
from cpu_kernels.simd.clock import cycles
from cpu_kernels.simd.task_queue import claim, counters

f32 = np.float32
TILE = 4
CHUNK = 4  # phase-1 tasks (16 rows of one expert each) claimed at once


@njit(parallel=True, nogil=True, cache=True)
def packed_moe_kernel(tiles: TileSet, gate_type: int, gate_pk: np.ndarray, up_type: int,
                      up_pk: np.ndarray, down_type: int, down_pk: np.ndarray, x: np.ndarray,
                      topk_ids: np.ndarray, topk_weights: np.ndarray, limit: float,
                      out: np.ndarray, stamps: np.ndarray, threads: int) -> None:
    # gate_pk, up_pk: [E, I/8, bytes]  down_pk: [E, H/8, bytes]  x: [T, H] f32
    # topk_ids: [T, K] int64  topk_weights: [T, K] f32  out: [T, H] f32
    # limit: the SwiGLU clamp (exact/swiglu.py; inf: none)
    # stamps: [2] or [3] int64, cycle counter at entry, exit (and where phase 1 ended)
    # threads: numba.get_num_threads() of the caller (workers claiming phase 1's tasks)
    # tiles: the TileSet holding the three types (tile_set.py: its numba type selects the tiles)
    stamps[0] = cycles()
    expert_ids, offsets, token_ids, weights = route(topk_ids, topk_weights, gate_pk.shape[0])
    num_used = expert_ids.shape[0]
    inter = 8 * gate_pk.shape[1]  # I is whole 32-groups (down's columns): no padded rows
    num_slots = token_ids.shape[0]
    xq, dx, xqsum, xsum16 = quantize_x(x)
    h = np.empty((num_slots, inter), f32)  # [N, I]
    num_tasks = num_used * ((gate_pk.shape[1] + 1) // 2)  # gate_up_task's: 16 rows each
    lim = f32(limit)
    counter = counters(1)
    # tasks cost what their expert's tokens cost: claimed CHUNK at a time (task_queue.py)
    for _ in prange(threads):
        c = claim(counter)
        while c * CHUNK < num_tasks:
            for task in range(c * CHUNK, min(num_tasks, (c + 1) * CHUNK)):
                gate_up_task(tiles, gate_type, gate_pk, up_type, up_pk, task, xq, dx, xqsum,
                             xsum16, expert_ids, offsets, token_ids, weights, h, lim)
            c = claim(counter)
    if stamps.shape[0] > 2:
        stamps[2] = cycles()
    down_phase(tiles, h, down_type, down_pk, expert_ids, offsets, token_ids, out)
    stamps[1] = cycles()


@njit(cache=True)
def gate_up_task(tiles, gate_type, gate_pk, up_type, up_pk, task, xq, dx, xqsum, xsum16,
                 expert_ids, offsets, token_ids, weights, h, limit) -> None:
    """Phase-1 task `task`: used expert task // pairs, rows 16 (task % pairs) .. +16 of h
    (gate_up_group), pairs = the row-group pairs of I; slots in route's order."""
    groups_i = gate_pk.shape[1]
    pairs_i = (groups_i + 1) // 2
    u = task // pairs_i
    e = expert_ids[u]
    ga = 2 * (task % pairs_i)
    gb = min(ga + 1, groups_i - 1)  # an odd last group pairs with itself
    gate_up_group(tiles, gate_type, gate_pk[e, ga], gate_pk[e, gb], up_type, up_pk[e, ga],
                  up_pk[e, gb], xq, dx, xqsum, xsum16, token_ids, weights, offsets[u],
                  offsets[u + 1], h, 8 * ga, 8 * groups_i, limit)


@njit(cache=True)
def gate_up_group(tiles, gate_type, gate_a, gate_b, up_type, up_a, up_b, xq, dx, xqsum, xsum16,
                  token_ids, weights, k_lo, k_hi, h, r0, inter, limit):
    """h[k, r0:r0+16] = w_k * swiglu(gate x_t, up x_t) for the slots k_lo:k_hi of one expert
    (t = token_ids[k]); gate_a/b, up_a/b: two row groups [bytes] (rows r0..r0+7, r0+8..r0+15;
    b = a for an odd last group). Rows >= inter are padding."""
    gres = np.empty(4 * 16, f32)
    ures = np.empty(4 * 16, f32)
    lanes = min(16, inter - r0)
    for k0 in range(k_lo, k_hi, TILE):
        nt = min(TILE, k_hi - k0)
        t0, t1 = token_ids[k0], token_ids[k0 + min(1, nt - 1)]
        t2, t3 = token_ids[k0 + min(2, nt - 1)], token_ids[k0 + min(3, nt - 1)]
        tile_of(tiles, gate_type, gate_a, gate_b, xq, 0, dx, xqsum, xsum16, t0, t1, t2, t3, nt,
                gres)
        tile_of(tiles, up_type, up_a, up_b, xq, 0, dx, xqsum, xsum16, t0, t1, t2, t3, nt, ures)
        for i in range(nt):
            w = weights[k0 + i]
            for lane in range(lanes):
                h[k0 + i, r0 + lane] = weighted_swiglu(w, gres[16 * i + lane],
                                                       ures[16 * i + lane], limit)


@njit(cache=True)
def down_group(tiles, down_type, down_a, down_b, hq, h_lo, hd, hqsum, hsum_flat, token_ids, k_lo,
               k_hi, out, r0, lanes):
    """out[t, r0:r0+lanes] += down(h_k) for the slots k_lo:k_hi of one expert (t = token_ids[k]);
    down_a/b: two row groups [bytes] (b = a for an odd last group, then lanes <= 8); h as two
    int8 planes (hq, lo plane at flat offset h_lo)."""
    res = np.empty(4 * 16, f32)
    for k0 in range(k_lo, k_hi, TILE):
        nt = min(TILE, k_hi - k0)
        tile_of(tiles, down_type, down_a, down_b, hq, h_lo, hd, hqsum, hsum_flat, k0,
                k0 + min(1, nt - 1), k0 + min(2, nt - 1), k0 + min(3, nt - 1), nt, res)
        for i in range(nt):
            t = token_ids[k0 + i]
            for lane in range(lanes):
                out[t, r0 + lane] += res[16 * i + lane]


@njit(parallel=True, nogil=True, cache=True)
def quantize_x(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x [T, H] f32 as int8 per 32-group: xq [T, H]  dx, xqsum [T, H/32]  xsum16 [T * H/16] (flat)."""
    num_tokens, hidden = x.shape
    xq = np.empty((num_tokens, hidden), np.int8)
    dx = np.empty((num_tokens, hidden // 32), f32)
    xqsum = np.empty((num_tokens, hidden // 32), f32)
    xsum16 = np.empty(num_tokens * (hidden // 16), np.int32)
    for t in prange(num_tokens):
        quantize_row(x[t], xq[t], xq[t, :0], dx[t], xqsum[t],
                     xsum16[t * (hidden // 16):(t + 1) * (hidden // 16)])
    return xq, dx, xqsum, xsum16


@njit(parallel=True, nogil=True, cache=True)
def quantize_h(h: np.ndarray) -> tuple[np.ndarray, int, np.ndarray, np.ndarray, np.ndarray]:
    """h [N, I] f32 as int16 in two int8 planes (int8 h would double fast mode's error):
    hq [2N, I] (lo plane at flat offset h_lo)  hd, hqsum [N, I/32]  hsum_flat [N * I/16]."""
    num_slots, inter = h.shape
    hq = np.empty((2 * num_slots, inter), np.int8)
    hd = np.empty((num_slots, inter // 32), f32)
    hqsum = np.empty((num_slots, inter // 32), f32)
    hsum16 = np.empty((num_slots, inter // 16), np.int32)
    for k in prange(num_slots):
        quantize_row(h[k], hq[k], hq[num_slots + k], hd[k], hqsum[k], hsum16[k])
    return hq, num_slots * inter, hd, hqsum, hsum16.reshape(-1)


@njit(parallel=True, nogil=True, cache=True)
def down_phase(tiles, h, down_type, down_pk, expert_ids, offsets, token_ids, out) -> None:
    """Phase 2: out = sum over each token's slots of down(h_slot); h [N, I] f32 in slot order.

    Groups of 8 H rows are split across threads, each summing over all experts into its own rows
    of out (no two threads write the same element)."""
    hq, h_lo, hd, hqsum, hsum_flat = quantize_h(h)
    for pair in prange((down_pk.shape[1] + 1) // 2):
        down_pair(tiles, down_type, down_pk, pair, hq, h_lo, hd, hqsum, hsum_flat, expert_ids,
                  offsets, token_ids, out)


@njit(cache=True)
def down_pair(tiles, down_type, down_pk, pair, hq, h_lo, hd, hqsum, hsum_flat, expert_ids,
              offsets, token_ids, out) -> None:
    """out[:, 16 pair : 16 pair + 16] = the sum over every used expert of its down rows there
    times its slots' h (quantized: hq, lo plane at h_lo; hd, hqsum, hsum_flat); the rows of
    down_pk's row groups 2 pair and 2 pair + 1 (an odd last group alone)."""
    num_used = expert_ids.shape[0]
    groups_h = down_pk.shape[1]
    ga = 2 * pair
    gb = min(ga + 1, groups_h - 1)
    r0 = 8 * ga
    lanes = min(8 * (gb - ga + 1), out.shape[1] - r0)
    for t in range(out.shape[0]):
        for lane in range(lanes):
            out[t, r0 + lane] = 0.0
    for u in range(num_used):
        if u + 1 < num_used:
            prefetch_start(down_pk[expert_ids[u + 1], ga], down_pk[expert_ids[u + 1], gb])
        e = expert_ids[u]
        down_group(tiles, down_type, down_pk[e, ga], down_pk[e, gb], hq, h_lo, hd, hqsum,
                   hsum_flat, token_ids, offsets[u], offsets[u + 1], out, r0, lanes)


def packed_moe(gate_type: int, gate_pk: np.ndarray, up_type: int, up_pk: np.ndarray,
               down_type: int, down_pk: np.ndarray, x: np.ndarray, topk_ids: np.ndarray,
               topk_weights: np.ndarray, limit: float, out: np.ndarray, stamps: np.ndarray,
               threads: int, tiles: TileSet | None = None) -> None:
    """packed_moe_kernel from Python (shapes there); `tiles` defaults to the broad family of
    the three types (tile_set.tile_family) and must hold them."""
    tiles = tile_family(gate_type, up_type, down_type) if tiles is None else tiles
    check_covers(tiles, gate_type, up_type, down_type)
    packed_moe_kernel(tiles, gate_type, gate_pk, up_type, up_pk, down_type, down_pk, x,
                      topk_ids, topk_weights, limit, out, stamps, threads)
