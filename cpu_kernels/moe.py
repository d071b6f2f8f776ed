"""The fused routed-expert MoE forward on quantized GGUF blocks.

For each token t: out[t] = sum_k w[t, k] * down_e(silu(gate_e x[t]) * up_e x[t]), e = ids[t, k].
Tokens are grouped by expert (routing.route) and x is prepared inside the kernel, so a call
costs one numba dispatch and no other Python. Every selected expert's rows are read once per
call whatever T is: phase 1 splits (expert, block of I rows) across threads and computes h for the expert's
tokens; phase 2 splits H rows across threads, each summing over all experts into its own rows of
out (no two threads write the same element). Within a task each weight row is decoded once per
tile of up to 4 of its tokens (tile_dot); an i-quant row once for all its tokens, into a
scratch row (iquant_decode). `fast` mode on packable types (the K-quants, Q8_0/Q5_0 and every
i-quant) runs packed_moe instead
(amx_bf16_moe where the CPU has AMX and the call has >= MIN_TOKENS tokens).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numba
import numpy as np
from numba import njit, prange

from cpu_kernels.amx.amx_bf16_moe import (
    MIN_TOKENS,
    TILE_CONFIG_BF16,
    amx_bf16_moe_kernel,
    runs_on_amx,
)
from cpu_kernels.exact.iquant_decode import decode_row, is_table_coded, scratch
from cpu_kernels.exact.matmul import check_mode
from cpu_kernels.exact.routing import route
from cpu_kernels.exact.rowdot import prepare_row
from cpu_kernels.exact.swiglu import weighted_swiglu
from cpu_kernels.exact.tile_dot import TILE, tile_dot
from cpu_kernels.fast.packed import pack
from cpu_kernels.fast.packed_moe import packed_moe
from cpu_kernels.fast.q8_activations import quantize_row
from cpu_kernels.fast.tile_set import TileSet, check_covers, k_quants_of, tile_family
from cpu_kernels.formats.qtypes import row_nbytes
from cpu_kernels.formats.weights import ExpertWeights
from cpu_kernels.simd.clock import cycles

if TYPE_CHECKING:
    from cpu_kernels.fast.packed import PackedExperts

f32 = np.float32
ROWS_PER_TASK = 16


@njit(inline="always", cache=True)
def _tile_tokens(ids: np.ndarray, k0: int, nt: int) -> tuple[int, int, int, int]:
    """The activation rows ids[k0 .. k0+nt) of a tile, padded with the last one."""
    return (ids[k0], ids[k0 + min(1, nt - 1)], ids[k0 + min(2, nt - 1)],
            ids[k0 + min(3, nt - 1)])


@njit(parallel=True, nogil=True, cache=True)
def _moe_kernel(gate_type: int, gate_w: np.ndarray, up_type: int, up_w: np.ndarray,
                down_type: int, down_w: np.ndarray, i_lo: int, i_hi: int, d_lo: int, d_hi: int,
                fast: bool, x: np.ndarray, topk_ids: np.ndarray, topk_weights: np.ndarray,
                limit: float, out: np.ndarray, stamps: np.ndarray) -> None:
    # gate_w, up_w: [E, I, bytes]  down_w: [E, H, bytes]  x: [T, H] f32  topk_ids: [T, K] int64
    # topk_weights: [T, K] f32  out: [T, H] f32. Intermediate rows i_lo:i_hi only: those rows
    # of gate/up and bytes d_lo:d_hi of each down row. stamps: [2] int64, cycles at entry, exit.
    # limit: the SwiGLU clamp (exact/swiglu.py; inf: none)
    stamps[0] = cycles()
    lim = f32(limit)
    expert_ids, offsets, token_ids, weights = route(topk_ids, topk_weights, gate_w.shape[0])
    num_tokens, hidden = x.shape
    num_used = expert_ids.shape[0]
    num_slots = token_ids.shape[0]
    inter = i_hi - i_lo
    # each mode leaves the other's activation buffers empty: its kernels never read them
    # x: exact sums xs [T, H/32]; fast xq [T, H] int8  dx, xqsum [T, H/32]  xsum16 [T, H/16]
    xs = np.empty((num_tokens, 0 if fast else hidden // 32), f32)
    xq = np.empty((num_tokens, hidden if fast else 0), np.int8)
    dx = np.empty((num_tokens, hidden // 32 if fast else 0), f32)
    xqsum = np.empty((num_tokens, hidden // 32 if fast else 0), f32)
    xsum16 = np.empty((num_tokens, hidden // 16 if fast else 0), np.int32)
    for t in prange(num_tokens):
        if fast:
            quantize_row(x[t], xq[t], xq[t, :0], dx[t], xqsum[t], xsum16[t])
        else:
            prepare_row(x[t], xs[t], xq[t], dx[t], False)
    # h [N, Is] f32 and its sums hs [N, Is/32]; fast: int16 in two planes hq [2N, Is] int8
    # hd, hqsum [N, Is/32]  hsum16 [N, Is/16]
    h = np.empty((num_slots, inter), f32)
    hs = np.empty((num_slots, inter // 32), f32)
    hq = np.empty((2 * num_slots if fast else num_slots, inter if fast else 0), np.int8)
    hd = np.empty((num_slots, inter // 32 if fast else 0), f32)
    hqsum = np.empty((num_slots, inter // 32 if fast else 0), f32)
    hsum16 = np.empty((num_slots, inter // 16 if fast else 0), np.int32)
    gate_iq, up_iq, down_iq = (is_table_coded(gate_type), is_table_coded(up_type),
                               is_table_coded(down_type))
    tasks_i = (inter + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for task in prange(num_used * tasks_i):
        u = task // tasks_i
        r0 = (task % tasks_i) * ROWS_PER_TASK
        e = expert_ids[u]
        g64, gsc = scratch(gate_type, hidden)
        up64, usc = scratch(up_type, hidden)
        for r in range(r0, min(inter, r0 + ROWS_PER_TASK)):
            grow = gate_w[e, i_lo + r]
            urow = up_w[e, i_lo + r]
            decode_row(gate_type, grow, g64, gsc)
            decode_row(up_type, urow, up64, usc)
            for k0 in range(offsets[u], offsets[u + 1], TILE):
                nt = min(TILE, offsets[u + 1] - k0)
                t0, t1, t2, t3 = _tile_tokens(token_ids, k0, nt)
                g = tile_dot(fast, gate_type, grow, x, xs, xq, 0, dx, xqsum, t0, t1, t2, t3, nt,
                             gate_iq, g64, gsc)
                v = tile_dot(fast, up_type, urow, x, xs, xq, 0, dx, xqsum, t0, t1, t2, t3, nt,
                             up_iq, up64, usc)
                for i in range(nt):
                    h[k0 + i, r] = weighted_swiglu(weights[k0 + i], g[i], v[i], lim)
    for k in prange(num_slots):
        prepare_row(h[k], hs[k], hq[k], hd[k], False)
        if fast:  # h as int16 in two planes: int8 h would double fast mode's error
            quantize_row(h[k], hq[k], hq[num_slots + k], hd[k], hqsum[k], hsum16[k])
    h_lo = num_slots * inter if fast else 0
    tasks_h = (hidden + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for task in prange(tasks_h):
        r0 = task * ROWS_PER_TASK
        r1 = min(hidden, r0 + ROWS_PER_TASK)
        for t in range(out.shape[0]):
            for r in range(r0, r1):
                out[t, r] = 0.0
        d64, dsc = scratch(down_type, inter)
        for u in range(num_used):
            e = expert_ids[u]
            for r in range(r0, r1):
                drow = down_w[e, r, d_lo:d_hi]
                decode_row(down_type, drow, d64, dsc)
                for k0 in range(offsets[u], offsets[u + 1], TILE):
                    nt = min(TILE, offsets[u + 1] - k0)
                    y = tile_dot(fast, down_type, drow, h, hs, hq, h_lo, hd, hqsum, k0,
                                 k0 + min(1, nt - 1), k0 + min(2, nt - 1), k0 + min(3, nt - 1),
                                 nt, down_iq, d64, dsc)
                    for i in range(nt):
                        out[token_ids[k0 + i], r] += y[i]
    stamps[1] = cycles()


def moe_forward(x: np.ndarray, topk_ids: np.ndarray, topk_weights: np.ndarray,
                experts: ExpertWeights, out: np.ndarray, mode: str = "exact",
                use_amx: bool = True) -> None:
    """Routed-expert MoE on GGUF blocks, written into `out`.

    x: [T, H] float32  topk_ids: [T, K] int  topk_weights: [T, K] float32  out: [T, H] float32.
    `mode`: "exact" (float32 math on the exactly dequantized weights) or "fast" (x quantized to
    int8 per 32-group for gate/up, h to int16 in two int8 planes for down; integer dot products
    on the exact weights). `fast` packs the experts on its first call (`packed.pack`,
    better done at load time) and runs the packed kernels; types without a packed layout run
    scalar kernels on the blocks (down then in float32 on the exact h). Where the CPU has AMX,
    experts with >= MIN_TOKENS tokens in the call run bf16 tiles instead (x, h and the exact
    weights rounded to bf16, float32 sums: amx_bf16_moe.py); `use_amx` off keeps every expert
    on VNNI (for benchmarks and tests).
    """
    fast = check_mode(mode)
    check_inputs(x, topk_ids, topk_weights, experts, out)
    packed = pack(experts).packed if fast else None
    run_moe(x, topk_ids, topk_weights, experts, packed, 0, out, fast, np.empty(2, np.int64),
            use_amx=use_amx)


def check_inputs(x: np.ndarray, topk_ids: np.ndarray, topk_weights: np.ndarray,
                 experts: ExpertWeights, out: np.ndarray) -> None:
    """Raise ValueError unless the shapes fit each other and the expert ids are in range (or
    negative: a slot served elsewhere, skipped)."""
    num_tokens, hidden = x.shape
    if hidden != experts.hidden_size or out.shape != x.shape:
        raise ValueError(f"x {x.shape}, out {out.shape} do not fit experts H={experts.hidden_size}")
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != num_tokens:
        raise ValueError(f"topk_ids {topk_ids.shape} / weights {topk_weights.shape} vs T={num_tokens}")
    if topk_ids.size and topk_ids.max() >= experts.num_experts:
        raise ValueError(f"expert ids outside [0, {experts.num_experts}) (negative: skipped)")


def busiest_expert(topk_ids: np.ndarray) -> int:
    """The most rows any one expert takes in topk_ids [T, K] (negative ids, the experts held
    elsewhere, are no expert's): 0 when none is picked."""
    ids = topk_ids.ravel()
    return int(np.bincount(ids[ids >= 0], minlength=1).max())


def run_moe(x: np.ndarray, topk_ids: np.ndarray, topk_weights: np.ndarray,
            experts: ExpertWeights, packed: PackedExperts | None, i_lo: int, out: np.ndarray,
            fast: bool, stamps: np.ndarray, i_hi: int | None = None, use_amx: bool = True,
            tiles: TileSet | None = None) -> None:
    """The MoE restricted to intermediate rows i_lo:i_hi (default: to the end), into `out`.

    `packed` (fast mode only) holds exactly those rows when given; otherwise the blocks run.
    Experts with >= MIN_TOKENS tokens run AMX bf16 tiles where the CPU has AMX (amx_bf16_moe.py),
    unless `use_amx` is off. `tiles` (packed only): the tile set the kernels compile in, holding
    the layer's types (tile_set.py; default their broad family); a model passes the same set for
    all its layers, so one kernel serves them all.
    The sum of `out` over slices that cover 0:I is the MoE. Inputs are checked by the caller.
    stamps: [2] int64, the kernel's cycle counter at entry and exit.
    """
    # one dtype each: every other would compile the whole kernel again
    x = np.ascontiguousarray(x, dtype=np.float32)
    limit = float(experts.swiglu_limit)
    topk_ids = np.ascontiguousarray(topk_ids, dtype=np.int64)
    topk_weights = np.ascontiguousarray(topk_weights, dtype=np.float32)
    if packed is not None:
        pk = packed
        types = (pk.gate.qtype, pk.up.qtype, pk.down.qtype)
        tiles = tile_family(*types) if tiles is None else tiles
        check_covers(tiles, *types)
        # AMX only where some expert reaches its threshold: otherwise (decode, or many experts
        # with few tokens each) the VNNI kernel does the same work without the bf16 activations
        if (use_amx and x.shape[0] >= MIN_TOKENS
                and runs_on_amx(*types) and busiest_expert(topk_ids) >= MIN_TOKENS):
            amx_bf16_moe_kernel(k_quants_of(tiles), pk.gate.qtype, pk.gate.data, pk.up.qtype,
                                pk.up.data, pk.down.qtype, pk.down.data, x, topk_ids,
                                topk_weights, limit, out, stamps, TILE_CONFIG_BF16, MIN_TOKENS,
                                numba.get_num_threads())
            return
        packed_moe(pk.gate.qtype, pk.gate.data, pk.up.qtype, pk.up.data, pk.down.qtype,
                   pk.down.data, x, topk_ids, topk_weights, limit, out, stamps,
                   numba.get_num_threads(), tiles)
        return
    i_hi = experts.intermediate_size if i_hi is None else i_hi
    g, u, d = experts.gate, experts.up, experts.down
    _moe_kernel(g.qtype, g.blocks, u.qtype, u.blocks, d.qtype, d.blocks, i_lo, i_hi,
                row_nbytes(d.qtype, i_lo), row_nbytes(d.qtype, i_hi), fast, x, topk_ids,
                topk_weights, limit, out, stamps)
