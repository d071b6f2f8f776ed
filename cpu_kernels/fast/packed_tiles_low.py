"""`fast` tiles on packed Q2_K and Q3_K weights (see packed.py): same contract as packed_tiles.

Both have 16-column sub-blocks (4 steps of 4 columns), so each sub-block gets its own integer
dot per activation row and one float multiply-add. Q2_K's offset (dmin * min) has its own scale,
so it is a second float term on the activation sum of the sub-block; Q3_K's codes are stored as
c = q + 4 and the offset 4 is removed in int32 like Q6_K's 32.

pa, pb: [row_group_bytes] uint8 (rows 0-7 and 8-15)  xq: [P * n, C] int8 (plane lo at flat
offset lo_off)  dx: [n, C/32] f32  xsum16: [n * C/16] int32 (flat)  res: [64] f32 (see packed_tiles)
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels.fast.packed_tiles import _prefetch_block, dp_planes, plane_sum, store_tiles
from cpu_kernels.simd.simd_pairs import (
    b64_and,
    b64_or,
    b64_shl,
    b64_shr,
    f32x16_fnma,
    f32x16_mul,
    f32x16_zero,
    fma_i32x16,
    i32x16_sub_s,
    i32x16_zero,
    load_b64,
    load_f32x16_at,
    load_i8x16_f32,
    load_u4x16_f32,
)

f32 = np.float32


@njit(cache=True)
def _sub_dot(q0, q1, q2, q3, xq, xo, lo_off, two):
    """Integer dots of 16 rows' codes of one sub-block (4 steps) with activations from xo."""
    z = i32x16_zero()
    h, lo = dp_planes(z, z, q0, xq, xo, lo_off, two)
    h, lo = dp_planes(h, lo, q1, xq, xo + 4, lo_off, two)
    h, lo = dp_planes(h, lo, q2, xq, xo + 8, lo_off, two)
    h, lo = dp_planes(h, lo, q3, xq, xo + 12, lo_off, two)
    return plane_sum(h, lo, two)


@njit(cache=True)
def _q2k_sub(q0, q1, q2, q3, xq, xo, lo_off, two, sv, mv, dx, xsum16, t, g, acc):
    s = _sub_dot(q0, q1, q2, q3, xq, xo, lo_off, two)
    d = dx[t, g]
    acc = fma_i32x16(s, f32x16_mul(sv, d), acc)
    return f32x16_fnma(acc, mv, d * f32(xsum16[xo >> 4]))


@njit(cache=True)
def _q3k_sub(q0, q1, q2, q3, xq, xo, lo_off, two, sv, dx, xsum16, t, g, acc):
    s = i32x16_sub_s(_sub_dot(q0, q1, q2, q3, xq, xo, lo_off, two), xsum16[xo >> 4] << 2)
    return fma_i32x16(s, f32x16_mul(sv, dx[t, g]), acc)


@njit(inline="always", cache=True)
def q2_k_tile(pa, pb, xq, lo_off, dx, xsum16, t0, t1, t2, t3, res, nt, two):
    cols = xq.shape[1]
    f0, f1, f2, f3 = f32x16_zero(), f32x16_zero(), f32x16_zero(), f32x16_zero()
    for b in range(pa.shape[0] // 704):
        o = b * 704
        _prefetch_block(pa, pb, o, 704)
        dv = load_f32x16_at(pa, pb, o + 640)
        mv = load_f32x16_at(pa, pb, o + 672)
        for p in range(16):
            v = load_b64(pa, pb, o + 32 * p)
            q0 = b64_and(v, 3)
            q1 = b64_and(b64_shr(v, 2), 3)
            q2 = b64_and(b64_shr(v, 4), 3)
            q3 = b64_shr(v, 6)
            sv = f32x16_mul(load_u4x16_f32(pa, pb, o + 512 + 8 * p, 0), dv)
            mn = f32x16_mul(load_u4x16_f32(pa, pb, o + 512 + 8 * p, 4), mv)
            xb = b * 256 + 16 * p
            g = xb >> 5
            f0 = _q2k_sub(q0, q1, q2, q3, xq, t0 * cols + xb, lo_off, two, sv, mn, dx, xsum16, t0,
                          g, f0)
            if nt > 1:
                f1 = _q2k_sub(q0, q1, q2, q3, xq, t1 * cols + xb, lo_off, two, sv, mn, dx, xsum16,
                              t1, g, f1)
                if nt > 2:
                    f2 = _q2k_sub(q0, q1, q2, q3, xq, t2 * cols + xb, lo_off, two, sv, mn, dx,
                                  xsum16, t2, g, f2)
                    if nt > 3:
                        f3 = _q2k_sub(q0, q1, q2, q3, xq, t3 * cols + xb, lo_off, two, sv, mn, dx,
                                      xsum16, t3, g, f3)
    store_tiles(res, f0, f1, f2, f3, nt)


@njit(inline="always", cache=True)
def q3_k_tile(pa, pb, xq, lo_off, dx, xsum16, t0, t1, t2, t3, res, nt, two):
    cols = xq.shape[1]
    f0, f1, f2, f3 = f32x16_zero(), f32x16_zero(), f32x16_zero(), f32x16_zero()
    for b in range(pa.shape[0] // 928):
        o = b * 928
        _prefetch_block(pa, pb, o, 928)
        dv = load_f32x16_at(pa, pb, o + 896)
        for p in range(16):
            v = load_b64(pa, pb, o + 32 * p)
            hb = b64_shr(load_b64(pa, pb, o + 512 + 32 * (p >> 1)), 4 * (p & 1))
            q0 = b64_or(b64_and(v, 3), b64_and(b64_shl(hb, 2), 4))
            q1 = b64_or(b64_and(b64_shr(v, 2), 3), b64_and(b64_shl(hb, 1), 4))
            q2 = b64_or(b64_and(b64_shr(v, 4), 3), b64_and(hb, 4))
            q3 = b64_or(b64_shr(v, 6), b64_and(b64_shr(hb, 1), 4))
            sv = f32x16_mul(load_i8x16_f32(pa, pb, o + 768 + 8 * p), dv)
            xb = b * 256 + 16 * p
            g = xb >> 5
            f0 = _q3k_sub(q0, q1, q2, q3, xq, t0 * cols + xb, lo_off, two, sv, dx, xsum16, t0, g,
                          f0)
            if nt > 1:
                f1 = _q3k_sub(q0, q1, q2, q3, xq, t1 * cols + xb, lo_off, two, sv, dx, xsum16,
                              t1, g, f1)
                if nt > 2:
                    f2 = _q3k_sub(q0, q1, q2, q3, xq, t2 * cols + xb, lo_off, two, sv, dx, xsum16,
                                  t2, g, f2)
                    if nt > 3:
                        f3 = _q3k_sub(q0, q1, q2, q3, xq, t3 * cols + xb, lo_off, two, sv, dx,
                                      xsum16, t3, g, f3)
    store_tiles(res, f0, f1, f2, f3, nt)
