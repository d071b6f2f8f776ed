"""Q4_K weight tiles and result epilogues of the AMX `fast` kernel (amx_moe.py).

A weight tile covers 16 rows (two packed row groups, A = rows 0-7, B = rows 8-15) and one
32-column sub-block (8 tile rows). Tile row s holds, per weight row, its 4 codes of k-step s:
the packed 32-byte vectors of the two groups side by side, nibbles taken apart as the VNNI tiles
do (packed_tiles.py).

The epilogue turns stored int32 results (row i = activation row i, lane n = weight row n) into
float: the sub-block's per-row scales times the activation row's scale, minus the mins times
the activation row's sum, added to acc[i] (16 float32 per activation row).

pk_a, pk_b: [row_group_bytes] uint8  tiles: uint8 scratch  c: [n * 16] int32
acc: [n * 16] float32  dx, xqsum: [n] float32, the activation rows' scale and scaled sum.
"""

from __future__ import annotations

from numba import njit

from cpu_kernels.simd import b32_and, b32_shr, fma_i32, load_b32, load_i32x8
from cpu_kernels.simd_rows import (
    f32x8_fnma,
    f32x8_mul,
    load_f32x8,
    load_f32x8_at,
    load_u8x8_f32,
    store_b32,
    store_f32x8,
)

Q4_K_BYTES = 1216  # packed bytes per 8 rows x 256 columns


@njit(cache=True)
def q4_k_weight_tiles(pk_a, pk_b, b, c, tiles, off):
    """Tiles of sub-blocks 2c (at off) and 2c + 1 (at off + 512) of super-block b."""
    o = b * Q4_K_BYTES + 256 * c
    for s in range(8):
        va, vb = load_b32(pk_a, o + 32 * s), load_b32(pk_b, o + 32 * s)
        store_b32(tiles, off + 64 * s, b32_and(va, 15))
        store_b32(tiles, off + 64 * s + 32, b32_and(vb, 15))
        store_b32(tiles, off + 512 + 64 * s, b32_and(b32_shr(va, 4), 15))
        store_b32(tiles, off + 512 + 64 * s + 32, b32_and(b32_shr(vb, 4), 15))


@njit(cache=True)
def q4_k_scales(pk, b, j):
    """(d * scale, dmin * min) of sub-block j of super-block b, for the group's 8 rows."""
    o = b * Q4_K_BYTES
    c, hi = j >> 1, (j & 1) * 8
    s = f32x8_mul(load_u8x8_f32(pk, o + 1024 + 16 * c + hi), load_f32x8_at(pk, o + 1152))
    m = f32x8_mul(load_u8x8_f32(pk, o + 1088 + 16 * c + hi), load_f32x8_at(pk, o + 1184))
    return s, m


@njit(cache=True)
def q4_k_epilogue(c, n, acc, s_a, s_b, m_a, m_b, dx, xqsum):
    """acc[i] += c[i] * (row scales x dx[i]) - row mins x xqsum[i], i < n (activation rows)."""
    for i in range(n):
        d, q = dx[i], xqsum[i]
        a = fma_i32(load_i32x8(c, 16 * i), f32x8_mul(s_a, d), load_f32x8(acc, 16 * i))
        store_f32x8(acc, 16 * i, f32x8_fnma(a, m_a, q))
        a = fma_i32(load_i32x8(c, 16 * i + 8), f32x8_mul(s_b, d), load_f32x8(acc, 16 * i + 8))
        store_f32x8(acc, 16 * i + 8, f32x8_fnma(a, m_b, q))
