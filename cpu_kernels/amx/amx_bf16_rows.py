"""Per-task AMX bf16 products of the `fast` MoE (amx_bf16_moe.py): one expert's 16 weight rows
against its tokens.

`gate_up_rows`: h[slots, r0:r0+16] = w * silu(gate x) * up x for an expert's n slots, from two
packed row groups of gate and of up. `down_rows`: out[tokens, r0:r0+16] += down(h) for an
expert's n slots, from two packed row groups of down. Activations are bf16 rows in slot order
with ROW_PAD spare columns (activation_rows). Up to 32 tokens, each weight tile is dequantized
AHEAD steps before its products into a ring of RING tiles (the vector units and AMX work side by
side); with more, the 16 rows are dequantized whole into the per-thread buffer first and every
pair of 16-token blocks runs over them. Tile registers: tmm0/1 and tmm6/7 accumulate (gate and
up of token blocks 0 and 1), tmm2/5 hold activations, tmm3/4 weights.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels.amx.amx_bf16_tiles import TILE_BYTES, bf16_weight_tile, bf16_weight_tiles
from cpu_kernels.exact.swiglu import weighted_swiglu
from cpu_kernels.simd.amx import (
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
    tile_store_0,
    tile_store_1,
    tile_store_6,
    tile_store_7,
    tile_zero_0,
    tile_zero_1,
    tile_zero_6,
    tile_zero_7,
)

f32 = np.float32
# zero rows after the activations: the last pair of 16-token blocks reads whole tiles
PAD_ROWS = 32
# activation rows are ROW_PAD bf16 longer than their data: a tile's 16 rows 2H or 2I bytes apart
# (multiples of 4 KiB) would fall in one L1 set and evict each other
ROW_PAD = 32
# few-token experts dequantize each weight tile AHEAD steps before its products, into a ring of
# RING tiles: a tile load waits for the stores that wrote its tile to leave the store buffer
AHEAD, RING = 2, 4


@njit(cache=True)
def activation_rows(num_slots, cols):
    """[num_slots + PAD_ROWS, cols + ROW_PAD] bf16 rows for the caller to fill: only the padding
    rows are zeroed (tiles read them, results never do; the padding columns are never read),
    not the whole array: zeroing ~15 MB at T=1024 would be a serial part of every call."""
    rows = np.empty((num_slots + PAD_ROWS, cols + ROW_PAD), np.uint16)
    rows[num_slots:] = 0
    return rows


@njit(cache=True)
def gate_up_rows(gate_type, g_a, g_b, up_type, u_a, u_b, xs, weights, s0, n, h, r0, gbuf, ubuf,
                 c, cfg, limit):
    # g_a, g_b, u_a, u_b: packed row groups (rows r0..r0+7, r0+8..r0+15) of gate and up
    # xs [N + 32, H + ROW_PAD] bf16 bits (slot order)  h [N, I] f32  gbuf, ubuf [H * 32] u8
    # c [1024] f32: gate [16 tokens, 16 rows] of block 0 at 0, up at 256; block 1 at 512, 768
    # limit: the SwiGLU clamp, float32 (exact/swiglu.py)
    hidden, row = xs.shape[1] - ROW_PAD, xs.shape[1]
    stride, steps = 2 * row, hidden // 32
    if n <= 32:
        _gate_up_streamed(gate_type, g_a, g_b, up_type, u_a, u_b, xs, s0, n, gbuf, ubuf, c, cfg)
        _swiglu_into_h(c, weights, s0, n, h, r0, limit)
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
        two = tb + 16 < n
        for t in range(steps):
            tile_load_3(gbuf, TILE_BYTES * t, 64)
            tile_load_4(ubuf, TILE_BYTES * t, 64)
            tile_load_2(xs, a0 + 32 * t, stride)
            bf16_dp_0_2_3()
            bf16_dp_1_2_4()
            if two:
                tile_load_5(xs, a0 + 16 * row + 32 * t, stride)
                bf16_dp_6_5_3()
                bf16_dp_7_5_4()
        _store_sums(c)
        _swiglu_into_h(c, weights, s0 + tb, min(32, n - tb), h, r0, limit)
    tile_release()


@njit(cache=True)
def _gate_up_streamed(gate_type, g_a, g_b, up_type, u_a, u_b, xs, s0, n, gbuf, ubuf, c, cfg):
    """c = the gate/up sums of n <= 32 tokens, each weight tile dequantized AHEAD steps before
    its products into a ring of RING tiles: the vector units dequantize tile t + AHEAD while AMX
    multiplies tile t (with few tokens the products alone would leave them idle)."""
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
def _swiglu_into_h(c, weights, s0, n, h, r0, limit):
    """h[s0 + i, r0:r0+16] = w * swiglu(gate, up) for the i < n <= 32 tokens whose sums c
    holds."""
    lanes = min(16, h.shape[1] - r0)
    for i in range(n):
        o = 512 * (i // 16) + 16 * (i % 16)  # gate; up 256 after it
        w = weights[s0 + i]
        for lane in range(lanes):
            h[s0 + i, r0 + lane] = weighted_swiglu(w, c[o + lane], c[o + 256 + lane], limit)


@njit(cache=True)
def down_rows(down_type, d_a, d_b, hs, s0, n, token_ids, out, r0, lanes, dbuf, c, cfg):
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
