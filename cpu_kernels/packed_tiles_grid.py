"""`fast` tiles on the packed lattice i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
IQ3_S): grid rows gathered per run of 8 columns.

Same contract as packed_tiles.py (16 rows of two row groups pa, pb x up to 4 activation rows,
result dot(exact weights, xq * dx) up to float32 rounding), but a vector holds a run of 8
columns of 8 rows (simd_grid.py): per run and group one gather of the 8 rows' grid rows, then
one vpdpbusd per activation row (and plane) against the run's 8 activations. Per 16 or 32
columns and group: the offset c * sum(x) off one lane per row (integer), one convert and one
multiply-add by (row scales x activation scale). The per-row lane pairs are summed once, when
stored. The blocks are read by grid_blocks.py; their layouts are packed_iquants.py's.
Why gathers: a lattice code names 8 weights, so decoding them a byte at a time (iquant_decode)
costs ~0.4 cycles a weight where the memory streams one in ~0.1 (one core, V3 gate rows:
IQ2_XXS decode + dot 0.42 cycles a weight).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels.grid_blocks import block_bytes, per16, runs, scales
from cpu_kernels.packed_tiles import _prefetch_block, plane_sum
from cpu_kernels.simd_lane_pairs import bcast8x8, i32x16_sub_mul, store_pair_sums
from cpu_kernels.simd_pairs import (
    U7_DOT_DIFFERS,
    dpbusd16,
    dpbusd16_u7,
    f32x16_mul,
    f32x16_zero,
    fma_i32x16,
    i32x16_zero,
)

f32 = np.float32


@njit(cache=True)
def _dp8(hi, lo, w, xq, xo, lo_off, two):
    """Accumulate the run's weights w (every byte < 128) times its 8 activations at flat xq
    index xo (and the lo plane's)."""
    if U7_DOT_DIFFERS:
        hi = dpbusd16_u7(hi, w, bcast8x8(xq, xo))
        if two:
            lo = dpbusd16_u7(lo, w, bcast8x8(xq, xo + lo_off))
    else:
        hi = dpbusd16(hi, w, bcast8x8(xq, xo))
        if two:
            lo = dpbusd16(lo, w, bcast8x8(xq, xo + lo_off))
    return hi, lo


@njit(cache=True)
def _sub16(w0, w1, xq, xo, lo_off, two, c, xsum16, scale, acc):
    """acc + (dot of 2 runs - c * sum of their 16 activations) * scale for one token."""
    z = i32x16_zero()
    h, lo = _dp8(z, z, w0, xq, xo, lo_off, two)
    h, lo = _dp8(h, lo, w1, xq, xo + 8, lo_off, two)
    return fma_i32x16(i32x16_sub_mul(plane_sum(h, lo, two), c, xsum16[xo >> 4]), scale, acc)


@njit(cache=True)
def _sub32(w, xq, xo, lo_off, two, c, xsum16, s_lo, s_hi, dx, halves, acc):
    """The same over a sub-block's 4 runs w: one scale, or one per 16 columns (`halves`)."""
    if halves:
        acc = _sub16(w[0], w[1], xq, xo, lo_off, two, c, xsum16, f32x16_mul(s_lo, dx), acc)
        return _sub16(w[2], w[3], xq, xo + 16, lo_off, two, c, xsum16, f32x16_mul(s_hi, dx), acc)
    z = i32x16_zero()
    h, lo = _dp8(z, z, w[0], xq, xo, lo_off, two)
    h, lo = _dp8(h, lo, w[1], xq, xo + 8, lo_off, two)
    h, lo = _dp8(h, lo, w[2], xq, xo + 16, lo_off, two)
    h, lo = _dp8(h, lo, w[3], xq, xo + 24, lo_off, two)
    xs = xsum16[xo >> 4] + xsum16[(xo >> 4) + 1]
    return fma_i32x16(i32x16_sub_mul(plane_sum(h, lo, two), c, xs), f32x16_mul(s_lo, dx), acc)


@njit(inline="always", cache=True)
def grid_tile(qtype, pa, pb, xq, lo_off, dx, xsum16, t0, t1, t2, t3, res, nt, two):
    cols = xq.shape[1]
    size = block_bytes(qtype)
    halves = per16(qtype)
    fa0, fa1, fa2, fa3 = f32x16_zero(), f32x16_zero(), f32x16_zero(), f32x16_zero()
    fb0, fb1, fb2, fb3 = f32x16_zero(), f32x16_zero(), f32x16_zero(), f32x16_zero()
    for b in range(pa.shape[0] // size):
        o = b * size
        _prefetch_block(pa, pb, o, size)
        for s in range(8):
            la, ha, ca = scales(qtype, pa, o, s)
            lb, hb, cb = scales(qtype, pb, o, s)
            wa = runs(qtype, pa, o, s)
            wb = runs(qtype, pb, o, s)
            xb = b * 256 + 32 * s
            g = xb >> 5
            x0 = t0 * cols + xb
            fa0 = _sub32(wa, xq, x0, lo_off, two, ca, xsum16, la, ha, dx[t0, g], halves, fa0)
            fb0 = _sub32(wb, xq, x0, lo_off, two, cb, xsum16, lb, hb, dx[t0, g], halves, fb0)
            if nt > 1:
                x1 = t1 * cols + xb
                fa1 = _sub32(wa, xq, x1, lo_off, two, ca, xsum16, la, ha, dx[t1, g], halves, fa1)
                fb1 = _sub32(wb, xq, x1, lo_off, two, cb, xsum16, lb, hb, dx[t1, g], halves, fb1)
                if nt > 2:
                    x2 = t2 * cols + xb
                    fa2 = _sub32(wa, xq, x2, lo_off, two, ca, xsum16, la, ha, dx[t2, g], halves,
                                 fa2)
                    fb2 = _sub32(wb, xq, x2, lo_off, two, cb, xsum16, lb, hb, dx[t2, g], halves,
                                 fb2)
                    if nt > 3:
                        x3 = t3 * cols + xb
                        fa3 = _sub32(wa, xq, x3, lo_off, two, ca, xsum16, la, ha, dx[t3, g],
                                     halves, fa3)
                        fb3 = _sub32(wb, xq, x3, lo_off, two, cb, xsum16, lb, hb, dx[t3, g],
                                     halves, fb3)
    store_pair_sums(res, 0, fa0, fb0)
    if nt > 1:
        store_pair_sums(res, 16, fa1, fb1)
    if nt > 2:
        store_pair_sums(res, 32, fa2, fb2)
    if nt > 3:
        store_pair_sums(res, 48, fa3, fb3)
