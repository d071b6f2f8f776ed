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

from cpu_kernels import qtypes as qt
from cpu_kernels.simd import b32_and, b32_or, b32_shl, b32_shr, f32x8_zero, load_b32
from cpu_kernels.simd_bf16 import store_bf16_pair_rows
from cpu_kernels.simd_rows import f32x8_mul, load_f32x8_at, load_i8x8_f32, load_u8x8_f32

TILE_BYTES = 1024  # 16 tile rows x 64 bytes: 32 columns of 16 weight rows
Q4_K, Q6_K, Q8_0, Q5_0 = qt.Q4_K, qt.Q6_K, qt.Q8_0, qt.Q5_0
BF16_TILE_TYPES = (Q4_K, Q6_K, Q8_0, Q5_0)


def has_bf16_tiles(qtype: int) -> bool:
    return qtype in BF16_TILE_TYPES


@njit(cache=True)
def bf16_weight_tiles(qtype, pk_a, pk_b, cols, buf):
    """buf[:cols * 32] = the bf16 B tiles of rows pk_a (0-7) and pk_b (8-15), `cols` columns."""
    if qtype == Q4_K:
        _q4_k_tiles(pk_a, pk_b, cols // 256, buf)
    elif qtype == Q6_K:
        _q6_k_tiles(pk_a, pk_b, cols // 256, buf)
    elif qtype == Q8_0:
        _q8_0_tiles(pk_a, pk_b, cols // 32, buf)
    else:
        _q5_0_tiles(pk_a, pk_b, cols // 32, buf)


@njit(cache=True)
def q4_k_scales(pk, b, j):
    """(d * scale, dmin * min) of sub-block j of super-block b, for the group's 8 rows."""
    o = 1216 * b
    c, hi = j >> 1, (j & 1) * 8
    s = f32x8_mul(load_u8x8_f32(pk, o + 1024 + 16 * c + hi), load_f32x8_at(pk, o + 1152))
    m = f32x8_mul(load_u8x8_f32(pk, o + 1088 + 16 * c + hi), load_f32x8_at(pk, o + 1184))
    return s, m


@njit(cache=True)
def _q4_k_tiles(pk_a, pk_b, blocks, buf):
    # 1216 B per block: nibbles (chunk c, step s: low = sub-block 2c, high = 2c + 1), scales
    for b in range(blocks):
        o = 1216 * b
        for c in range(4):
            sa0, ma0 = q4_k_scales(pk_a, b, 2 * c)
            sb0, mb0 = q4_k_scales(pk_b, b, 2 * c)
            sa1, ma1 = q4_k_scales(pk_a, b, 2 * c + 1)
            sb1, mb1 = q4_k_scales(pk_b, b, 2 * c + 1)
            t = TILE_BYTES * (8 * b + 2 * c)
            for s in range(8):
                va, vb = load_b32(pk_a, o + 256 * c + 32 * s), load_b32(pk_b, o + 256 * c + 32 * s)
                store_bf16_pair_rows(buf, t + 128 * s, b32_and(va, 15), b32_and(vb, 15), 0,
                                     sa0, ma0, sb0, mb0)
                store_bf16_pair_rows(buf, t + TILE_BYTES + 128 * s, b32_shr(va, 4),
                                     b32_shr(vb, 4), 0, sa1, ma1, sb1, mb1)


@njit(cache=True)
def _q6_k_codes(pk, o, i):
    """The 6-bit codes of step i of the 16-column sub-block at byte o (96 B: n01, n23, highs)."""
    nib = load_b32(pk, o + 32 * (i >> 1))
    low = b32_and(nib, 15) if i % 2 == 0 else b32_shr(nib, 4)
    high = b32_and(b32_shr(load_b32(pk, o + 64), 2 * i), 3)
    return b32_or(low, b32_shl(high, 4))


@njit(cache=True)
def _q6_k_tiles(pk_a, pk_b, blocks, buf):
    # 1696 B per block: 16 sub-blocks x 96 B, int8 scales [16][8] at 1536, f32 d [8] at 1664
    zero = f32x8_zero()
    for b in range(blocks):
        o = 1696 * b
        da, db = load_f32x8_at(pk_a, o + 1664), load_f32x8_at(pk_b, o + 1664)
        for p in range(16):
            sa = f32x8_mul(load_i8x8_f32(pk_a, o + 1536 + 8 * p), da)
            sb = f32x8_mul(load_i8x8_f32(pk_b, o + 1536 + 8 * p), db)
            t = TILE_BYTES * (8 * b + p // 2) + 512 * (p % 2)  # steps 4 (p % 2) + i
            for i in range(4):
                store_bf16_pair_rows(buf, t + 128 * i, _q6_k_codes(pk_a, o + 96 * p, i),
                                     _q6_k_codes(pk_b, o + 96 * p, i), 32, sa, zero, sb, zero)


@njit(cache=True)
def _q8_0_tiles(pk_a, pk_b, blocks, buf):
    # 288 B per block: 8 steps x 32 B of code + 128, f32 d [8] at 256
    zero = f32x8_zero()
    for b in range(blocks):
        o = 288 * b
        da, db = load_f32x8_at(pk_a, o + 256), load_f32x8_at(pk_b, o + 256)
        for s in range(8):
            store_bf16_pair_rows(buf, TILE_BYTES * b + 128 * s, load_b32(pk_a, o + 32 * s),
                                 load_b32(pk_b, o + 32 * s), 128, da, zero, db, zero)


@njit(cache=True)
def _q5_0_codes(pk, o, s):
    """Codes of step s of the Q5_0 block at byte o: nibble | bit 4 (bit s of the high bytes)."""
    nib = load_b32(pk, o + 32 * (s >> 1))
    low = b32_and(nib, 15) if s % 2 == 0 else b32_shr(nib, 4)
    return b32_or(low, b32_shl(b32_and(b32_shr(load_b32(pk, o + 128), s), 1), 4))


@njit(cache=True)
def _q5_0_tiles(pk_a, pk_b, blocks, buf):
    # 192 B per block: nibbles of steps 0|1, 2|3, 4|5, 6|7; bit 4 of step s in bit s; f32 d [8]
    zero = f32x8_zero()
    for b in range(blocks):
        o = 192 * b
        da, db = load_f32x8_at(pk_a, o + 160), load_f32x8_at(pk_b, o + 160)
        for s in range(8):
            store_bf16_pair_rows(buf, TILE_BYTES * b + 128 * s, _q5_0_codes(pk_a, o, s),
                                 _q5_0_codes(pk_b, o, s), 16, da, zero, db, zero)


@njit(cache=True)
def to_bf16(src, dst):
    """dst[:] = bf16 bits (uint16) of the float32 row src, round to nearest even."""
    bits = src.view(np.uint32)
    for i in range(src.shape[0]):
        b = bits[i]
        dst[i] = np.uint16((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1)))
                           >> np.uint32(16))

