"""The `fast` MoE with experts' products on AMX bf16 tiles (Sapphire Rapids and later).

An expert with at least `min_tokens` tokens in a call has its weights dequantized once per call,
16 rows at a time, to bf16 tiles (amx_bf16_tiles.py: the exact weights rounded to bf16), and its
tokens multiplied against them with tdpbf16ps, 16 tokens x 16 rows x 32 columns per
instruction, accumulating in float32 tiles over the whole row: no per-block scales to apply
afterwards, so nothing but the tile products runs per token. The dequantization costs the same
whether the expert has 12 tokens or 400; VNNI's per-token unpacking grows with them. Up to 32
tokens, each tile is dequantized two steps ahead of its products into a small ring (the vector
units and AMX work side by side); with more, a task dequantizes its 16 rows whole into a
per-thread buffer first, then runs every pair of 16-token blocks over it. Experts with fewer
tokens, and types without bf16 tiles (Q2_K, Q3_K), run packed_moe's VNNI tiles in the same call.

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

from cpu_kernels.amx import (
    HAS_AMX,
    bf16_dp_0_2_3,
    bf16_dp_1_2_4,
    bf16_dp_6_5_3,
    bf16_dp_7_5_4,
    tile_config,
    tile_load_2,
    tile_load_3,
    tile_load_4,
    tile_load_5,
    tile_release,
    tile_shapes_bf16,
    tile_store_0,
    tile_store_1,
    tile_store_6,
    tile_store_7,
    tile_zero_0,
    tile_zero_1,
    tile_zero_6,
    tile_zero_7,
)
from cpu_kernels.amx_bf16_tiles import (
    BF16_TILE_TYPES,
    TILE_BYTES,
    bf16_weight_tile,
    bf16_weight_tiles,
    has_bf16_tiles,
    to_bf16,
)
from cpu_kernels.clock import cycles
from cpu_kernels.packed_moe import down_group, gate_up_group, quantize_h, quantize_x
from cpu_kernels.routing import route

f32 = np.float32
TILE_CONFIG_BF16 = tile_shapes_bf16()
TILE_CONFIG_BF16.flags.writeable = False
PAD_ROWS = 32
# activation rows are ROW_PAD bf16 longer than their data: a tile's 16 rows 2H or 2I bytes apart
# (multiples of 4 KiB) would fall in one L1 set and evict each other
ROW_PAD = 32
# few-token experts dequantize each weight tile AHEAD steps before its products, into a ring of
# RING tiles: a tile load waits for the stores that wrote its tile to leave the store buffer
AHEAD, RING = 2, 4
# Experts with fewer tokens run VNNI: measured on Sapphire Rapids (V3 shapes, the whole MoE), AMX
# bf16 runs 0.5x VNNI's speed at 4 tokens per expert, 1.0x at 8, 1.6x at 16, 2.2x at 32, 4x at
# 64-128 on one thread; on 16 threads a threshold of 8 made T=32 (4-12 tokens per expert)
# slower than VNNI alone (62-74 vs 60-62 ms), at 16 tokens AMX wins 2x.
MIN_TOKENS = 12


def runs_on_amx(gate_type: int, up_type: int, down_type: int) -> bool:
    """Whether fast mode on packed experts of these types uses amx_bf16_moe_kernel."""
    return HAS_AMX and ((has_bf16_tiles(gate_type) and has_bf16_tiles(up_type))
                        or has_bf16_tiles(down_type))


@njit(cache=True)
def _activation_rows(num_slots, cols):
    """[num_slots + PAD_ROWS, cols + ROW_PAD] bf16 rows for the caller to fill: only the padding
    rows are zeroed (tiles read them, results never do; the padding columns are never read),
    not the whole array: zeroing ~15 MB at T=1024 would be a serial part of every call."""
    rows = np.empty((num_slots + PAD_ROWS, cols + ROW_PAD), np.uint16)
    rows[num_slots:] = 0
    return rows


@njit(cache=True)
def _tiles_ok(qtype):
    return qtype in BF16_TILE_TYPES


@njit(cache=True)
def _gate_up(gate_type, g_a, g_b, up_type, u_a, u_b, xs, weights, s0, n, h, r0, gbuf, ubuf, c,
             cfg):
    # g_a, g_b, u_a, u_b: packed row groups (rows r0..r0+7, r0+8..r0+15) of gate and up
    # xs [N + 32, H + ROW_PAD] bf16 bits (slot order)  h [N, I] f32  gbuf, ubuf [H * 32] u8
    # c [1024] f32: gate [16 tokens, 16 rows] of block 0 at 0, up at 256; block 1 at 512, 768
    hidden, row = xs.shape[1] - ROW_PAD, xs.shape[1]
    stride, steps = 2 * row, hidden // 32
    if n <= 32:
        _gate_up_streamed(gate_type, g_a, g_b, up_type, u_a, u_b, xs, s0, n, gbuf, ubuf, c, cfg)
        _silu_into_h(c, weights, s0, n, h, r0)
        return
    bf16_weight_tiles(gate_type, g_a, g_b, hidden, gbuf)
    bf16_weight_tiles(up_type, u_a, u_b, hidden, ubuf)
    tile_config(cfg)
    for tb in range(0, n, 32):  # two 16-token blocks per pass: tmm2 -> tmm0/1, tmm5 -> tmm6/7
        a0 = (s0 + tb) * row
        tile_zero_0()
        tile_zero_1()
        tile_zero_6()
        tile_zero_7()
        if tb + 16 < n:
            for t in range(steps):
                tile_load_3(gbuf, TILE_BYTES * t, 64)
                tile_load_4(ubuf, TILE_BYTES * t, 64)
                tile_load_2(xs, a0 + 32 * t, stride)
                bf16_dp_0_2_3()
                bf16_dp_1_2_4()
                tile_load_5(xs, a0 + 16 * row + 32 * t, stride)
                bf16_dp_6_5_3()
                bf16_dp_7_5_4()
        else:
            for t in range(steps):
                tile_load_3(gbuf, TILE_BYTES * t, 64)
                tile_load_4(ubuf, TILE_BYTES * t, 64)
                tile_load_2(xs, a0 + 32 * t, stride)
                bf16_dp_0_2_3()
                bf16_dp_1_2_4()
        _store_sums(c)
        _silu_into_h(c, weights, s0 + tb, min(32, n - tb), h, r0)
    tile_release()


@njit(cache=True)
def _gate_up_streamed(gate_type, g_a, g_b, up_type, u_a, u_b, xs, s0, n, gbuf, ubuf, c, cfg):
    """c = the gate/up sums of n <= 32 tokens, each weight tile dequantized one step ahead of
    its products into 2-tile ping-pong buffers: the vector units dequantize tile t + 1 while
    AMX multiplies tile t (with few tokens the products alone would leave them idle)."""
    hidden, row = xs.shape[1] - ROW_PAD, xs.shape[1]
    stride, steps, a0 = 2 * row, hidden // 32, s0 * row
    for t in range(min(AHEAD, steps)):
        bf16_weight_tile(gate_type, g_a, g_b, t, gbuf, TILE_BYTES * t)
        bf16_weight_tile(up_type, u_a, u_b, t, ubuf, TILE_BYTES * t)
    tile_config(cfg)
    tile_zero_0()
    tile_zero_1()
    tile_zero_6()
    tile_zero_7()
    for t in range(steps):
        cur, nxt = TILE_BYTES * (t % RING), TILE_BYTES * ((t + AHEAD) % RING)
        tile_load_3(gbuf, cur, 64)
        tile_load_4(ubuf, cur, 64)
        tile_load_2(xs, a0 + 32 * t, stride)
        bf16_dp_0_2_3()
        bf16_dp_1_2_4()
        if n > 16:
            tile_load_5(xs, a0 + 16 * row + 32 * t, stride)
            bf16_dp_6_5_3()
            bf16_dp_7_5_4()
        if t + AHEAD < steps:
            bf16_weight_tile(gate_type, g_a, g_b, t + AHEAD, gbuf, nxt)
            bf16_weight_tile(up_type, u_a, u_b, t + AHEAD, ubuf, nxt)
    _store_sums(c)
    tile_release()


@njit(inline="always", cache=True)
def _store_sums(c):
    tile_store_0(c, 0, 64)
    tile_store_1(c, 256, 64)
    tile_store_6(c, 512, 64)
    tile_store_7(c, 768, 64)


@njit(cache=True)
def _silu_into_h(c, weights, s0, n, h, r0):
    """h[s0 + i, r0:r0+16] = w * silu(gate) * up for the i < n <= 32 tokens whose sums c holds."""
    lanes = min(16, h.shape[1] - r0)
    for i in range(n):
        o = 512 * (i // 16) + 16 * (i % 16)  # gate; up 256 after it
        w = weights[s0 + i]  # down is linear: w * down(h) = down(w * h)
        for lane in range(lanes):
            g = c[o + lane]
            h[s0 + i, r0 + lane] = w * c[o + 256 + lane] * g / (f32(1.0) + np.exp(-g))


@njit(cache=True)
def _down(down_type, d_a, d_b, hs, s0, n, token_ids, out, r0, lanes, dbuf, c, cfg):
    # d_a, d_b: packed row groups (H rows r0..r0+7, r0+8..r0+15) of down
    # hs [N + 32, I + ROW_PAD] bf16 bits (slot order)  out [T, H] f32  dbuf [I * 32] u8
    # c [1024] f32
    inter, row = hs.shape[1] - ROW_PAD, hs.shape[1]
    stride, steps = 2 * row, inter // 32
    streamed = n <= 32  # dequantize AHEAD tiles ahead into a ring (see _gate_up_streamed)
    if not streamed:
        bf16_weight_tiles(down_type, d_a, d_b, inter, dbuf)
    else:
        for t in range(min(AHEAD, steps)):
            bf16_weight_tile(down_type, d_a, d_b, t, dbuf, TILE_BYTES * t)
    tile_config(cfg)
    for tb in range(0, n, 32):  # two 16-token blocks per pass: tmm2 -> tmm0, tmm5 -> tmm6
        a0 = (s0 + tb) * row
        tile_zero_0()
        tile_zero_6()
        two = tb + 16 < n
        for t in range(steps):
            b = TILE_BYTES * (t % RING) if streamed else TILE_BYTES * t
            tile_load_3(dbuf, b, 64)
            tile_load_2(hs, a0 + 32 * t, stride)
            bf16_dp_0_2_3()
            if two:
                tile_load_5(hs, a0 + 16 * row + 32 * t, stride)
                bf16_dp_6_5_3()
            if streamed and t + AHEAD < steps:
                bf16_weight_tile(down_type, d_a, d_b, t + AHEAD, dbuf,
                                 TILE_BYTES * ((t + AHEAD) % RING))
        tile_store_0(c, 0, 64)
        tile_store_6(c, 256, 64)
        for i in range(min(32, n - tb)):
            tok = token_ids[s0 + tb + i]
            for lane in range(lanes):
                out[tok, r0 + lane] += c[16 * i + lane]
    tile_release()


@njit(parallel=True, nogil=True, cache=True)
def amx_bf16_moe_kernel(gate_type: int, gate_pk: np.ndarray, up_type: int, up_pk: np.ndarray,
                        down_type: int, down_pk: np.ndarray, x: np.ndarray, topk_ids: np.ndarray,
                        topk_weights: np.ndarray, out: np.ndarray, stamps: np.ndarray,
                        cfg: np.ndarray, min_tokens: int, threads: int) -> None:
    # gate_pk, up_pk: [E, I/8, bytes]  down_pk: [E, H/8, bytes] (packed)  x: [T, H] f32
    # topk_ids: [T, K] int64  topk_weights: [T, K] f32  out: [T, H] f32  stamps: [2] int64
    # cfg: TILE_CONFIG_BF16; an expert with >= min_tokens slots runs on AMX
    # threads: numba.get_num_threads() of the calling thread (numba's own call of it here would
    # keep the kernel out of the on-disk cache); every get_thread_id() is below it
    stamps[0] = cycles()
    expert_ids, offsets, token_ids, weights = route(topk_ids, topk_weights, gate_pk.shape[0])
    num_tokens, hidden = x.shape
    num_used, num_slots = expert_ids.shape[0], token_ids.shape[0]
    groups_i, groups_h = gate_pk.shape[1], down_pk.shape[1]
    inter = 8 * groups_i
    # per-thread scratch: 16 rows of weight tiles (x2 for gate and up), one C tile set
    wbuf = np.empty((threads, 2, max(hidden, inter) * 32), np.uint8)
    cbuf = np.empty((threads, 1024), f32)
    xq, dx, xqsum, xsum4 = quantize_x(x)  # for the experts that stay on VNNI
    xs = _activation_rows(num_slots, hidden)  # [N + 32, H + 32] bf16
    for k in prange(num_slots):
        to_bf16(x[token_ids[k]], xs[k, :hidden])
    h = np.empty((num_slots, inter), f32)  # [N, I]
    gate_up_tiles = _tiles_ok(gate_type) and _tiles_ok(up_type)
    blocks_i = (groups_i + 1) // 2
    for task in prange(num_used * blocks_i):
        u = task // blocks_i
        e = expert_ids[u]
        ga = 2 * (task % blocks_i)
        gb = min(ga + 1, groups_i - 1)  # an odd last group pairs with itself (lanes unused)
        k_lo, k_hi = offsets[u], offsets[u + 1]
        if gate_up_tiles and k_hi - k_lo >= min_tokens:
            tid = numba.get_thread_id()
            _gate_up(gate_type, gate_pk[e, ga], gate_pk[e, gb], up_type, up_pk[e, ga],
                     up_pk[e, gb], xs, weights, k_lo, k_hi - k_lo, h, 8 * ga, wbuf[tid, 0],
                     wbuf[tid, 1], cbuf[tid], cfg)
        else:
            for rg in range(ga, gb + 1):
                gate_up_group(gate_type, gate_pk[e, rg], up_type, up_pk[e, rg], xq, dx, xqsum,
                              xsum4, token_ids, weights, k_lo, k_hi, h, 8 * rg, inter)
    hq, h_lo, hd, hqsum, hsum_flat = quantize_h(h)  # for the experts that stay on VNNI
    hs = _activation_rows(num_slots, inter)  # [N + 32, I + 32] bf16
    for k in prange(num_slots):
        to_bf16(h[k], hs[k, :inter])
    down_tiles = _tiles_ok(down_type)
    for blk in prange((groups_h + 1) // 2):
        ga = 2 * blk
        gb = min(ga + 1, groups_h - 1)
        r0 = 8 * ga
        lanes = min(8 * (gb - ga + 1), hidden - r0)
        for t in range(num_tokens):
            for lane in range(lanes):
                out[t, r0 + lane] = 0.0
        for u in range(num_used):
            e, k_lo, k_hi = expert_ids[u], offsets[u], offsets[u + 1]
            if down_tiles and k_hi - k_lo >= min_tokens:
                tid = numba.get_thread_id()
                _down(down_type, down_pk[e, ga], down_pk[e, gb], hs, k_lo, k_hi - k_lo,
                      token_ids, out, r0, lanes, wbuf[tid, 0], cbuf[tid], cfg)
            else:
                for rg in range(ga, gb + 1):
                    down_group(down_type, down_pk[e, rg], hq, h_lo, hd, hqsum, hsum_flat,
                               token_ids, k_lo, k_hi, out, 8 * rg, min(8, hidden - 8 * rg))
    stamps[1] = cycles()
