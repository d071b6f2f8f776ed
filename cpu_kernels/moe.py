"""The fused routed-expert MoE forward on quantized GGUF blocks.

For each token t: out[t] = sum_k w[t, k] * down_e(silu(gate_e x[t]) * up_e x[t]), e = ids[t, k].
Tokens are grouped by expert, so every selected expert's rows are read once per call whatever T
is: phase 1 splits (expert, block of I rows) across threads and computes h for the expert's
tokens; phase 2 splits H rows across threads, each summing over all experts into its own rows of
out (no two threads write the same element). Within a task each weight row is decoded once per
tile of up to 4 of its tokens (tile_dot). `fast` mode on packable types runs packed_moe instead.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from cpu_kernels.matmul import check_mode
from cpu_kernels.packed_moe import packed_moe_kernel
from cpu_kernels.q8_activations import Q8Activations, quantize_row
from cpu_kernels.rowdot import prepare_activations, prepare_row
from cpu_kernels.tile_dot import TILE, tile_dot
from cpu_kernels.weights import ExpertWeights

f32 = np.float32
ROWS_PER_TASK = 16


def group_by_expert(topk_ids: np.ndarray, topk_weights: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(expert_ids [U], offsets [U+1], token_ids [N], weights [N]) with N = T*K.

    Slots offsets[u]:offsets[u+1] are the (token, weight) pairs routed to expert_ids[u].
    """
    flat = topk_ids.reshape(-1).astype(np.int64)
    order = np.argsort(flat, kind="stable")
    expert_ids, counts = np.unique(flat[order], return_counts=True)
    offsets = np.zeros(expert_ids.size + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    token_ids = order // topk_ids.shape[1]
    weights = np.ascontiguousarray(topk_weights.reshape(-1)[order], dtype=np.float32)
    return expert_ids, offsets, token_ids, weights


@njit(inline="always", cache=True)
def _tile_tokens(ids: np.ndarray, k0: int, nt: int) -> tuple[int, int, int, int]:
    """The activation rows ids[k0 .. k0+nt) of a tile, padded with the last one."""
    return (ids[k0], ids[k0 + min(1, nt - 1)], ids[k0 + min(2, nt - 1)],
            ids[k0 + min(3, nt - 1)])


@njit(parallel=True, nogil=True, cache=True)
def _moe_kernel(gate_type: int, gate_w: np.ndarray, up_type: int, up_w: np.ndarray,
                down_type: int, down_w: np.ndarray, fast: bool, x: np.ndarray, xs: np.ndarray,
                xq: np.ndarray, dx: np.ndarray, xqsum: np.ndarray, xsum4: np.ndarray,
                expert_ids: np.ndarray, offsets: np.ndarray, token_ids: np.ndarray,
                weights: np.ndarray, h: np.ndarray, hs: np.ndarray,
                hq: np.ndarray, hd: np.ndarray, hqsum: np.ndarray, hsum4: np.ndarray,
                out: np.ndarray) -> None:
    # gate_w, up_w: [E, I, bytes]  down_w: [E, H, bytes]  x: [T, H]  xs, dx, xqsum: [T, H/32]
    # xq: [T, H] (fast)  xsum4: [T, H/4]  expert_ids: [U]  offsets: [U+1]
    # token_ids, weights: [N]  h: [N, I] with its sums / int8 forms (by mode)  out: [T, H]
    num_used = expert_ids.shape[0]
    inter = gate_w.shape[1]
    hidden = down_w.shape[1]
    tasks_i = (inter + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for task in prange(num_used * tasks_i):
        u = task // tasks_i
        r0 = (task % tasks_i) * ROWS_PER_TASK
        e = expert_ids[u]
        for r in range(r0, min(inter, r0 + ROWS_PER_TASK)):
            grow = gate_w[e, r]
            urow = up_w[e, r]
            for k0 in range(offsets[u], offsets[u + 1], TILE):
                nt = min(TILE, offsets[u + 1] - k0)
                t0, t1, t2, t3 = _tile_tokens(token_ids, k0, nt)
                g = tile_dot(fast, gate_type, grow, x, xs, xq, 0, dx, xqsum, t0, t1, t2, t3, nt)
                v = tile_dot(fast, up_type, urow, x, xs, xq, 0, dx, xqsum, t0, t1, t2, t3, nt)
                for i in range(nt):
                    # the routing weight scales h: down is linear, so w * down(h) = down(w * h)
                    h[k0 + i, r] = weights[k0 + i] * v[i] * g[i] / (f32(1.0) + np.exp(-g[i]))
    num_slots = h.shape[0]
    for k in prange(num_slots):
        prepare_row(h[k], hs[k], hq[k], hd[k], False)
        if fast:  # h as int16 in two planes: int8 h would double fast mode's error
            quantize_row(h[k], hq[k], hq[num_slots + k], hd[k], hqsum[k], hsum4[k])
    h_lo = num_slots * inter if fast else 0
    tasks_h = (hidden + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for task in prange(tasks_h):
        r0 = task * ROWS_PER_TASK
        r1 = min(hidden, r0 + ROWS_PER_TASK)
        for t in range(out.shape[0]):
            for r in range(r0, r1):
                out[t, r] = 0.0
        for u in range(num_used):
            e = expert_ids[u]
            for r in range(r0, r1):
                drow = down_w[e, r]
                for k0 in range(offsets[u], offsets[u + 1], TILE):
                    nt = min(TILE, offsets[u + 1] - k0)
                    y = tile_dot(fast, down_type, drow, h, hs, hq, h_lo, hd, hqsum, k0,
                                 k0 + min(1, nt - 1), k0 + min(2, nt - 1), k0 + min(3, nt - 1),
                                 nt)
                    for i in range(nt):
                        out[token_ids[k0 + i], r] += y[i]


def moe_forward(x: np.ndarray, topk_ids: np.ndarray, topk_weights: np.ndarray,
                experts: ExpertWeights, out: np.ndarray, mode: str = "exact") -> None:
    """Routed-expert MoE on GGUF blocks, written into `out`.

    x: [T, H] float32  topk_ids: [T, K] int  topk_weights: [T, K] float32  out: [T, H] float32.
    `mode`: "exact" (float32 math on the exactly dequantized weights) or "fast" (x quantized to
    int8 per 32-group for gate/up, h to int16 in two int8 planes for down; integer dot products
    on the exact weights). `fast` packs the experts on its first call (`ExpertWeights.pack()`,
    better done at load time) and runs the packed kernels; types without a packed layout run
    scalar kernels on the blocks (down then in float32 on the exact h).
    """
    fast = check_mode(mode)
    num_tokens, hidden = x.shape
    inter = experts.intermediate_size
    if hidden != experts.hidden_size or out.shape != x.shape:
        raise ValueError(f"x {x.shape}, out {out.shape} do not fit experts H={experts.hidden_size}")
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != num_tokens:
        raise ValueError(f"topk_ids {topk_ids.shape} / weights {topk_weights.shape} vs T={num_tokens}")
    if topk_ids.size and (topk_ids.min() < 0 or topk_ids.max() >= experts.num_experts):
        raise ValueError(f"expert ids outside [0, {experts.num_experts})")
    x = np.ascontiguousarray(x, dtype=np.float32)
    expert_ids, offsets, token_ids, weights = group_by_expert(topk_ids, topk_weights)
    num_slots = token_ids.size
    # each mode passes empty buffers for the other's activations: its kernels never read them
    xs = np.empty((num_tokens, 0 if fast else hidden // 32), np.float32)
    if fast:
        xa, ha = Q8Activations.of(x), Q8Activations.empty(num_slots, inter, planes=2)
    else:
        prepare_activations(x, xs, np.empty((num_tokens, 0), np.int8),
                            np.empty((num_tokens, 0), np.float32), False)
        xa, ha = Q8Activations.empty(num_tokens, 0), Q8Activations.empty(num_slots, 0)
    h = np.empty((num_slots, inter), np.float32)
    pk = experts.pack().packed if fast else None
    if pk is not None:
        packed_moe_kernel(pk.gate.qtype, pk.gate.data, pk.up.qtype, pk.up.data, pk.down.qtype,
                          pk.down.data, xa.xq, xa.dx, xa.xqsum, xa.xsum4.reshape(-1), expert_ids,
                          offsets, token_ids, weights, h, ha.xq, ha.dx, ha.xqsum, ha.xsum4, out)
        return
    hs = np.empty((num_slots, inter // 32), np.float32)
    g, u, d = experts.gate, experts.up, experts.down
    _moe_kernel(g.qtype, g.blocks, u.qtype, u.blocks, d.qtype, d.blocks, fast, x, xs, xa.xq,
                xa.dx, xa.xqsum, xa.xsum4, expert_ids, offsets, token_ids, weights,
                h, hs, ha.xq, ha.dx, ha.xqsum, ha.xsum4, out)
