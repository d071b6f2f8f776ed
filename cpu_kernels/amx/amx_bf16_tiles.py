"""bf16 AMX weight tiles from packed row groups, and bf16 activation rows (amx_bf16_moe.py).

`bf16_weight_tiles` dequantizes 16 weight rows (two packed row groups of 8: rows 0-7 from pk_a,
8-15 from pk_b) over all their columns into `buf`: tile t (columns 32t..32t+31) at bytes
1024t..1024t+1023, in tdpbf16ps's B layout (simd_bf16.py). Weights are the exact dequantized
values rounded to bf16 (round to nearest even). Types: Q4_K, Q6_K, Q8_0, Q5_0 (`has_bf16_tiles`);
the rest stay on the VNNI kernels.

`to_bf16` rounds float32 rows to bf16 bits the same way (activations, AMX's A tiles).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels.fast.packed_tiles import PREFETCH
from cpu_kernels.formats import qtypes as qt
from cpu_kernels.simd.simd import (
    b32_and,
    b32_or,
    b32_shl,
    b32_shr,
    f32x8_mul,
    f32x8_zero,
    load_b32,
    load_f32x8_at,
    load_i8x8_f32,
    load_u8x8_f32,
    prefetch,
)
from cpu_kernels.simd.simd_bf16 import store_bf16_pair_rows

TILE_BYTES = 1024  # 16 tile rows x 64 bytes: 32 columns of 16 weight rows
Q4_K, Q6_K, Q8_0, Q5_0 = qt.Q4_K, qt.Q6_K, qt.Q8_0, qt.Q5_0
BF16_TILE_TYPES = (Q4_K, Q6_K, Q8_0, Q5_0)


def has_bf16_tiles(qtype: int) -> bool:
    return qtype in BF16_TILE_TYPES


@njit(cache=True)
def bf16_weight_tiles(qtype, pk_a, pk_b, cols, buf):
    """buf[:cols * 32] = the bf16 B tiles of rows pk_a (0-7) and pk_b (8-15), `cols` columns."""
    for t in range(cols // 32):
        bf16_weight_tile(qtype, pk_a, pk_b, t, buf, TILE_BYTES * t)


@njit(inline="always", cache=True)
def bf16_weight_tile(qtype, pk_a, pk_b, t, buf, off):
    """buf[off:off + 1024] = B tile t (columns 32t..32t+31) of rows pk_a (0-7), pk_b (8-15)."""
    # packed bytes per tile (a block's share); hint the lines PREFETCH bytes ahead (packed_tiles)
    per = 152 if qtype == Q4_K else 212 if qtype == Q6_K else 288 if qtype == Q8_0 else 192
    ahead = per * t + PREFETCH
    for line in range(0, per, 64):
        prefetch(pk_a, ahead + line)
        prefetch(pk_b, ahead + line)
    if qtype == Q4_K:
        _q4_k_tile(pk_a, pk_b, t, buf, off)
    elif qtype == Q6_K:
        _q6_k_tile(pk_a, pk_b, t, buf, off)
    elif qtype == Q8_0:
        _q8_0_tile(pk_a, pk_b, t, buf, off)
    else:
        _q5_0_tile(pk_a, pk_b, t, buf, off)


@njit(inline="always", cache=True)
def q4_k_scales(pk, b, j):
    """(d * scale, dmin * min) of sub-block j of super-block b, for the group's 8 rows."""
    o = 1216 * b
    c, hi = j >> 1, (j & 1) * 8
    s = f32x8_mul(load_u8x8_f32(pk, o + 1024 + 16 * c + hi), load_f32x8_at(pk, o + 1152))
    m = f32x8_mul(load_u8x8_f32(pk, o + 1088 + 16 * c + hi), load_f32x8_at(pk, o + 1184))
    return s, m


@njit(inline="always", cache=True)
def _q4_k_tile(pk_a, pk_b, t, buf, off):
    # 1216 B per block: nibbles (chunk c, step s: low = sub-block 2c, high = 2c + 1), scales
    b, j = t // 8, t % 8
    sa, ma = q4_k_scales(pk_a, b, j)
    sb, mb = q4_k_scales(pk_b, b, j)
    o = 1216 * b + 256 * (j >> 1)
    for s in range(8):
        va, vb = load_b32(pk_a, o + 32 * s), load_b32(pk_b, o + 32 * s)
        if j & 1:  # high nibbles (constant shifts: bytes have no variable one)
            va, vb = b32_shr(va, 4), b32_shr(vb, 4)
        else:
            va, vb = b32_and(va, 15), b32_and(vb, 15)
        store_bf16_pair_rows(buf, off + 128 * s, va, vb, 0, sa, ma, sb, mb)


@njit(inline="always", cache=True)
def _q6_k_codes(pk, o):
    """The 6-bit codes of steps 0..3 of the 16-column sub-block at byte o (96 B: nibbles of
    steps 0|1, of 2|3, 2-bit highs of steps 0..3); constant shifts (bytes have no variable one)."""
    n01, n23, hb = load_b32(pk, o), load_b32(pk, o + 32), load_b32(pk, o + 64)
    return (b32_or(b32_and(n01, 15), b32_shl(b32_and(hb, 3), 4)),
            b32_or(b32_shr(n01, 4), b32_shl(b32_and(b32_shr(hb, 2), 3), 4)),
            b32_or(b32_and(n23, 15), b32_shl(b32_and(b32_shr(hb, 4), 3), 4)),
            b32_or(b32_shr(n23, 4), b32_shl(b32_shr(hb, 6), 4)))


@njit(inline="always", cache=True)
def _q6_k_tile(pk_a, pk_b, t, buf, off):
    # 1696 B per block: 16 sub-blocks x 96 B, int8 scales [16][8] at 1536, f32 d [8] at 1664;
    # tile t: sub-blocks 2 (t % 8) and 2 (t % 8) + 1 of block t // 8
    zero = f32x8_zero()
    o = 1696 * (t // 8)
    da, db = load_f32x8_at(pk_a, o + 1664), load_f32x8_at(pk_b, o + 1664)
    for q in range(2):
        p = 2 * (t % 8) + q
        sa = f32x8_mul(load_i8x8_f32(pk_a, o + 1536 + 8 * p), da)
        sb = f32x8_mul(load_i8x8_f32(pk_b, o + 1536 + 8 * p), db)
        a0, a1, a2, a3 = _q6_k_codes(pk_a, o + 96 * p)
        b0, b1, b2, b3 = _q6_k_codes(pk_b, o + 96 * p)
        r = off + 512 * q
        store_bf16_pair_rows(buf, r, a0, b0, 32, sa, zero, sb, zero)
        store_bf16_pair_rows(buf, r + 128, a1, b1, 32, sa, zero, sb, zero)
        store_bf16_pair_rows(buf, r + 256, a2, b2, 32, sa, zero, sb, zero)
        store_bf16_pair_rows(buf, r + 384, a3, b3, 32, sa, zero, sb, zero)


@njit(inline="always", cache=True)
def _q8_0_tile(pk_a, pk_b, t, buf, off):
    # 288 B per block (= tile): 8 steps x 32 B of code + 128, f32 d [8] at 256
    zero = f32x8_zero()
    o = 288 * t
    da, db = load_f32x8_at(pk_a, o + 256), load_f32x8_at(pk_b, o + 256)
    for s in range(8):
        store_bf16_pair_rows(buf, off + 128 * s, load_b32(pk_a, o + 32 * s),
                             load_b32(pk_b, o + 32 * s), 128, da, zero, db, zero)


@njit(inline="always", cache=True)
def _q5_0_tile(pk_a, pk_b, t, buf, off):
    # 192 B per block (= tile): nibbles of steps 0|1, 2|3, 4|5, 6|7; bit 4 of step s in bit s;
    # f32 d [8] at 160. The high bits are shifted down one step at a time: constant shifts only
    # (x86 has no variable byte shift)
    zero = f32x8_zero()
    o = 192 * t
    da, db = load_f32x8_at(pk_a, o + 160), load_f32x8_at(pk_b, o + 160)
    ha, hb = load_b32(pk_a, o + 128), load_b32(pk_b, o + 128)
    for m in range(4):
        na, nb = load_b32(pk_a, o + 32 * m), load_b32(pk_b, o + 32 * m)
        ca = b32_or(b32_and(na, 15), b32_shl(b32_and(ha, 1), 4))
        cb = b32_or(b32_and(nb, 15), b32_shl(b32_and(hb, 1), 4))
        store_bf16_pair_rows(buf, off + 256 * m, ca, cb, 16, da, zero, db, zero)
        ha, hb = b32_shr(ha, 1), b32_shr(hb, 1)
        ca = b32_or(b32_shr(na, 4), b32_shl(b32_and(ha, 1), 4))
        cb = b32_or(b32_shr(nb, 4), b32_shl(b32_and(hb, 1), 4))
        store_bf16_pair_rows(buf, off + 256 * m + 128, ca, cb, 16, da, zero, db, zero)
        ha, hb = b32_shr(ha, 1), b32_shr(hb, 1)


@njit(cache=True)
def to_bf16(src, dst):
    """dst[:] = bf16 bits (uint16) of the float32 row src, round to nearest even."""
    bits = src.view(np.uint32)
    for i in range(src.shape[0]):
        b = bits[i]
        dst[i] = np.uint16((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1)))
                           >> np.uint32(16))

