"""The `fast` MoE with gate/up on AMX tiles: packed Q4_K gate/up (the Q4_K_M mix), any packed down.

The same integers as packed_moe (x int8 per 32-group, the packed unsigned codes), so the result
equals it up to float32 summation order; only the gate/up products of experts with at least
`min_tokens` tokens move from VNNI (8 rows x 4 tokens per tile) to AMX (16 rows x 16 tokens per
tdpbsud). Experts with fewer tokens, and the down projection, run packed_moe's VNNI tiles: the
per-sub-block epilogue (int32 -> float with row and token scales) dominates AMX's time, and for
down's two activation planes and Q6_K's 16-column sub-blocks it costs more than VNNI saves.

Phase 1 splits (expert, block of 16 I rows) across threads. x's int8 rows are gathered in slot
order (xs), so an expert's tokens are consecutive rows of an activation tile, and their scales
and sums transposed ([H/32, N]) so the epilogue reads them in order. Per 32-column sub-block the
gate and up weight tiles are built once, then every block of 16 of the expert's tokens runs one
tdpbsud each, then one epilogue covers all the expert's tokens. Activation tiles read whole
blocks of 16 rows: xs carries 16 zero rows of padding; results past an expert's tokens are
never read.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from cpu_kernels import qtypes as qt
from cpu_kernels.amx import (
    HAS_AMX,
    dp_0_2_3,
    dp_1_2_4,
    dp_6_5_3,
    dp_7_5_4,
    tile_config,
    tile_load_2,
    tile_load_3,
    tile_load_4,
    tile_load_5,
    tile_release,
    tile_shapes,
    tile_store_0,
    tile_store_1,
    tile_store_6,
    tile_store_7,
    tile_zero_0,
    tile_zero_1,
    tile_zero_6,
    tile_zero_7,
)
from cpu_kernels.amx_tiles import q4_k_epilogue, q4_k_scales, q4_k_weight_tiles
from cpu_kernels.clock import cycles
from cpu_kernels.packed_moe import down_phase, gate_up_group, quantize_x
from cpu_kernels.routing import route

f32 = np.float32
Q4_K = qt.Q4_K
# Experts with fewer tokens run VNNI: measured on Sapphire Rapids (V3 shapes, one thread), AMX
# gate/up is 0.8x VNNI's speed at 4 tokens, 1.0x at 8, 1.1x at 12, 1.3x at 16-32.
MIN_TOKENS = 12
TILE_CONFIG = tile_shapes(32)
TILE_CONFIG.flags.writeable = False


def runs_on_amx(gate_type: int, up_type: int) -> bool:
    """Whether fast mode on packed experts with these gate/up types uses amx_moe_kernel."""
    return HAS_AMX and gate_type == Q4_K and up_type == Q4_K


@njit(cache=True)
def _amx_gate_up(g_a, g_b, u_a, u_b, xs, dx_t, xqsum_t, weights, s0, n, h, r0, cfg):
    # g_a, g_b, u_a, u_b: packed row groups (rows r0..r0+7, r0+8..r0+15) of gate and up
    # xs [N + 16, H] int8  dx_t, xqsum_t [H/32, N] f32 (slot order)  h [N, I] f32
    hidden, inter = xs.shape[1], h.shape[1]
    blocks = (n + 15) // 16
    acc_g = np.zeros(blocks * 256, f32)  # [n padded to 16, 16 rows]
    acc_u = np.zeros(blocks * 256, f32)
    tiles = np.empty(2048, np.uint8)  # gate 2c, 2c+1 | up 2c, 2c+1: 8 x 64 bytes each
    c_g = np.empty(blocks * 256, np.int32)  # every block's products before the epilogue
    c_u = np.empty(blocks * 256, np.int32)
    tile_config(cfg)
    for b in range(hidden // 256):
        for c in range(4):
            q4_k_weight_tiles(g_a, g_b, b, c, tiles, 0)
            q4_k_weight_tiles(u_a, u_b, b, c, tiles, 1024)
            for half in range(2):
                g = 8 * b + 2 * c + half
                tile_load_3(tiles, 512 * half, 64)
                tile_load_4(tiles, 1024 + 512 * half, 64)
                # even blocks in tmm0/1 (A in tmm2), odd ones in tmm6/7 (A in tmm5): tile
                # registers are not renamed, alternating lets stores overlap products
                for tb in range(0, blocks, 2):
                    tile_zero_0()
                    tile_zero_1()
                    tile_load_2(xs, (s0 + 16 * tb) * hidden + 32 * g, hidden)
                    dp_0_2_3()
                    dp_1_2_4()
                    if tb + 1 < blocks:
                        tile_zero_6()
                        tile_zero_7()
                        tile_load_5(xs, (s0 + 16 * tb + 16) * hidden + 32 * g, hidden)
                        dp_6_5_3()
                        dp_7_5_4()
                    tile_store_0(c_g, 256 * tb, 64)
                    tile_store_1(c_u, 256 * tb, 64)
                    if tb + 1 < blocks:
                        tile_store_6(c_g, 256 * tb + 256, 64)
                        tile_store_7(c_u, 256 * tb + 256, 64)
                dxg, qg = dx_t[g, s0:s0 + n], xqsum_t[g, s0:s0 + n]
                sa, ma = q4_k_scales(g_a, b, g % 8)
                sb, mb = q4_k_scales(g_b, b, g % 8)
                q4_k_epilogue(c_g, n, acc_g, sa, sb, ma, mb, dxg, qg)
                sa, ma = q4_k_scales(u_a, b, g % 8)
                sb, mb = q4_k_scales(u_b, b, g % 8)
                q4_k_epilogue(c_u, n, acc_u, sa, sb, ma, mb, dxg, qg)
    tile_release()
    lanes = min(16, inter - r0)
    for i in range(n):
        # the routing weight scales h: down is linear, so w * down(h) = down(w * h)
        w = weights[s0 + i]
        for lane in range(lanes):
            gv = acc_g[16 * i + lane]
            h[s0 + i, r0 + lane] = w * acc_u[16 * i + lane] * gv / (f32(1.0) + np.exp(-gv))


@njit(parallel=True, nogil=True, cache=True)
def amx_moe_kernel(gate_pk: np.ndarray, up_pk: np.ndarray, down_type: int, down_pk: np.ndarray,
                   x: np.ndarray, topk_ids: np.ndarray, topk_weights: np.ndarray,
                   out: np.ndarray, stamps: np.ndarray, cfg: np.ndarray, min_tokens: int) -> None:
    # gate_pk, up_pk: [E, I/8, bytes] packed Q4_K  down_pk: [E, H/8, bytes]  x: [T, H] f32
    # topk_ids: [T, K] int64  topk_weights: [T, K] f32  out: [T, H] f32  stamps: [2] int64
    # cfg: the tile configuration, amx.tile_shapes(32)
    stamps[0] = cycles()
    expert_ids, offsets, token_ids, weights = route(topk_ids, topk_weights, gate_pk.shape[0])
    hidden = x.shape[1]
    num_used = expert_ids.shape[0]
    inter = 8 * gate_pk.shape[1]
    num_slots = token_ids.shape[0]
    xq, dx, xqsum, xsum4 = quantize_x(x)
    # slot order: xs [N + 16, H] int8 (16 rows of padding)  dx_t, xqsum_t [H/32, N]
    xs = np.zeros((num_slots + 16, hidden), np.int8)
    dx_t = np.empty((hidden // 32, num_slots), f32)
    xqsum_t = np.empty((hidden // 32, num_slots), f32)
    for k in prange(num_slots):
        t = token_ids[k]
        xs[k] = xq[t]
        for g in range(hidden // 32):
            dx_t[g, k] = dx[t, g]
            xqsum_t[g, k] = xqsum[t, g]
    h = np.empty((num_slots, inter), f32)  # [N, I]
    groups_i = gate_pk.shape[1]
    blocks_i = (groups_i + 1) // 2
    for task in prange(num_used * blocks_i):
        u = task // blocks_i
        e = expert_ids[u]
        ga = 2 * (task % blocks_i)
        gb = min(ga + 1, groups_i - 1)  # an odd last group pairs with itself (lanes unused)
        k_lo, k_hi = offsets[u], offsets[u + 1]
        if k_hi - k_lo >= min_tokens:
            _amx_gate_up(gate_pk[e, ga], gate_pk[e, gb], up_pk[e, ga], up_pk[e, gb], xs, dx_t,
                         xqsum_t, weights, k_lo, k_hi - k_lo, h, 8 * ga, cfg)
        else:
            for rg in range(ga, gb + 1):
                gate_up_group(Q4_K, gate_pk[e, rg], Q4_K, up_pk[e, rg], xq, dx, xqsum, xsum4,
                              token_ids, weights, k_lo, k_hi, h, 8 * rg, inter)
    down_phase(h, down_type, down_pk, expert_ids, offsets, token_ids, out)
    stamps[1] = cycles()
