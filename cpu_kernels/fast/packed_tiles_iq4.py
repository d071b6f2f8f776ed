"""`fast` tiles on packed IQ4_XS, IQ4_NL and MXFP4: 4-bit codes naming 16 levels.

The layout and the loop are packed_tiles.py's (16 rows of two row groups in 16 lanes, 4 columns
per lane and step, one vpdpbusd per activation row and step); one byte-table lookup per vector
(simd_lookup: a vpshufb) turns the codes into level + 128, unsigned for vpdpbusd, and
128 * (the 32 activations' sum) comes off per group.

Packed per 8 rows (packed_iquants.py has the numpy definition):
    IQ4_XS, 256 columns (1120 B = 1.029x): per sub-block s of 32 columns 4 steps of 32 bytes
        (byte 4r + j of step k: the GGUF byte 4k + j of row r's sub-block: low nibble column
        4k + j, high nibble 16 + 4k + j); int8 scales - 32 [8 sub][8 rows]; f32 d [8];
        w = d * (scale - 32) * level
    IQ4_NL, 32 columns (160 B = 1.111x): the 4 steps; f32 d [8]; w = d * level
    MXFP4, 32 columns (136 B = 1.000x): the 4 steps; u8 k [8] = max(e - 1, 0) of the E8M0
        scale e; w = 2^(e - 128) * level (MXFP4_LEVELS), read as the float with bits k << 23
        (a block with e <= 1, scale <= 2^-127, reads as 0)
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels.fast.packed_tiles import _prefetch_block, dp_planes, plane_sum, store_tiles
from cpu_kernels.formats.iquant_tables import IQ4_LEVELS, MXFP4_LEVELS
from cpu_kernels.simd.simd_lookup import lookup16
from cpu_kernels.simd.simd_pairs import (
    b64_and,
    b64_shr,
    f32x16_mul,
    f32x16_zero,
    fma_i32x16,
    i32x16_sub_s,
    i32x16_zero,
    load_b64,
    load_exp2x16_f32,
    load_f32x16_at,
    load_i8x16_f32,
)

i32 = np.int32
IQ4_XS_BYTES, IQ4_NL_BYTES, MXFP4_BYTES = 1120, 160, 136


def _levels_of(table: np.ndarray, name: str):
    """A function: the 4 steps at byte q as table levels + 128 (unsigned for vpdpbusd):
    (low nibbles, high nibbles) of each."""
    levels = lookup16([int(v) + 128 for v in table])

    def codes(pa, pb, q):
        v0, v1 = load_b64(pa, pb, q), load_b64(pa, pb, q + 32)
        v2, v3 = load_b64(pa, pb, q + 64), load_b64(pa, pb, q + 96)
        return (levels(b64_and(v0, 15)), levels(b64_and(v1, 15)), levels(b64_and(v2, 15)),
                levels(b64_and(v3, 15)), levels(b64_shr(v0, 4)), levels(b64_shr(v1, 4)),
                levels(b64_shr(v2, 4)), levels(b64_shr(v3, 4)))
    codes.__qualname__ = name  # a name of its own: see packed_dot._specialize
    return njit(cache=True)(codes)


_iq4_levels = _levels_of(IQ4_LEVELS, "iq4_levels")
_mx_levels = _levels_of(MXFP4_LEVELS, "mxfp4_levels")


@njit(cache=True)
def _group32(c, xq, xo, lo_off, two, xsum16, scale, acc):
    """acc + (dot of a group's levels c - 128 * sum of its 32 activations) * scale."""
    z = i32x16_zero()
    h, lo = dp_planes(z, z, c[0], xq, xo, lo_off, two, False)
    h, lo = dp_planes(h, lo, c[1], xq, xo + 4, lo_off, two, False)
    h, lo = dp_planes(h, lo, c[2], xq, xo + 8, lo_off, two, False)
    h, lo = dp_planes(h, lo, c[3], xq, xo + 12, lo_off, two, False)
    h, lo = dp_planes(h, lo, c[4], xq, xo + 16, lo_off, two, False)
    h, lo = dp_planes(h, lo, c[5], xq, xo + 20, lo_off, two, False)
    h, lo = dp_planes(h, lo, c[6], xq, xo + 24, lo_off, two, False)
    h, lo = dp_planes(h, lo, c[7], xq, xo + 28, lo_off, two, False)
    offset = i32(xsum16[xo >> 4] + xsum16[(xo >> 4) + 1]) << 7
    return fma_i32x16(i32x16_sub_s(plane_sum(h, lo, two), offset), scale, acc)


@njit(inline="always", cache=True)
def iq4_tile(block_bytes, pa, pb, xq, lo_off, dx, xsum16, t0, t1, t2, t3, res, nt, two):
    """IQ4_XS (block_bytes 1120), IQ4_NL (160) or MXFP4 (136)."""
    cols = xq.shape[1]
    subs = 8 if block_bytes == IQ4_XS_BYTES else 1
    mx = block_bytes == MXFP4_BYTES
    f0, f1, f2, f3 = f32x16_zero(), f32x16_zero(), f32x16_zero(), f32x16_zero()
    for b in range(pa.shape[0] // block_bytes):
        o = b * block_bytes
        _prefetch_block(pa, pb, o, block_bytes)
        if mx:
            dv = load_exp2x16_f32(pa, pb, o + 128)
        else:
            dv = load_f32x16_at(pa, pb, o + 128 * subs + (64 if subs == 8 else 0))
        for s in range(subs):
            sv = f32x16_mul(load_i8x16_f32(pa, pb, o + 1024 + 8 * s), dv) if subs == 8 else dv
            c = _mx_levels(pa, pb, o) if mx else _iq4_levels(pa, pb, o + 128 * s)
            xb = b * 32 * subs + 32 * s
            g = xb >> 5
            f0 = _group32(c, xq, t0 * cols + xb, lo_off, two, xsum16,
                          f32x16_mul(sv, dx[t0, g]), f0)
            if nt > 1:
                f1 = _group32(c, xq, t1 * cols + xb, lo_off, two, xsum16,
                              f32x16_mul(sv, dx[t1, g]), f1)
                if nt > 2:
                    f2 = _group32(c, xq, t2 * cols + xb, lo_off, two, xsum16,
                                  f32x16_mul(sv, dx[t2, g]), f2)
                    if nt > 3:
                        f3 = _group32(c, xq, t3 * cols + xb, lo_off, two, xsum16,
                                      f32x16_mul(sv, dx[t3, g]), f3)
    store_tiles(res, f0, f1, f2, f3, nt)
