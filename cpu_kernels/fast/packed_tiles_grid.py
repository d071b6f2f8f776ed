"""`fast` tiles on the packed lattice i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
IQ3_S): grid rows gathered per run of 8 columns.

Same contract as packed_tiles.py (16 rows of two row groups pa, pb x up to 4 activation rows,
result dot(exact weights, xq * dx) up to float32 rounding), but a vector holds a run of 8
columns of 8 rows (simd_grid.py): per run and group one gather of the 8 rows' grid rows, then
one vpdpbusd per activation row (and plane) against the run's 8 activations. Per 16 or 32
columns the two groups' lane pairs are summed into one vector of 16 rows (two vpermt2d and an
add), then the offset c * sum(x) comes off (integer), one convert and one multiply-add by (row
scales x activation scale): the epilogue and the scales serve 16 rows an instruction instead of
8. The blocks are read by grid_blocks.py; their layouts are packed_iquants.py's.
Why gathers: a lattice code names 8 weights, so decoding them a byte at a time (iquant_decode)
costs ~0.4 cycles a weight where the memory streams one in ~0.1 (one core, V3 gate rows:
IQ2_XXS decode + dot 0.42 cycles a weight).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels.fast.grid_blocks import block_bytes, per16, runs, scales
from cpu_kernels.fast.packed_tiles import _prefetch_block, plane_sum, store_tiles
from cpu_kernels.simd.simd_lane_pairs import bcast8x8, i32x16_sub_cs, pair_sums16
from cpu_kernels.simd.simd_pairs import (
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
def _dot2(w0, w1, xq, xo, lo_off, two):
    """One group's integer dot of 2 runs (16 columns) with the activations at xo, lane pairs."""
    z = i32x16_zero()
    h, lo = _dp8(z, z, w0, xq, xo, lo_off, two)
    h, lo = _dp8(h, lo, w1, xq, xo + 8, lo_off, two)
    return plane_sum(h, lo, two)


@njit(cache=True)
def _dot4(w, xq, xo, lo_off, two):
    """The same over a sub-block's 4 runs (32 columns)."""
    z = i32x16_zero()
    h, lo = _dp8(z, z, w[0], xq, xo, lo_off, two)
    h, lo = _dp8(h, lo, w[1], xq, xo + 8, lo_off, two)
    h, lo = _dp8(h, lo, w[2], xq, xo + 16, lo_off, two)
    h, lo = _dp8(h, lo, w[3], xq, xo + 24, lo_off, two)
    return plane_sum(h, lo, two)


@njit(cache=True)
def _sub32(wa, wb, xq, xo, lo_off, two, c, xsum16, s_lo, s_hi, dx, halves, acc):
    """acc + (dot of sub-block runs wa, wb - c * activation sum) * scale * dx for one token, 16
    rows a lane: one scale per 32 columns, or one per 16 (`halves`)."""
    if halves:
        v = pair_sums16(_dot2(wa[0], wa[1], xq, xo, lo_off, two),
                        _dot2(wb[0], wb[1], xq, xo, lo_off, two))
        acc = fma_i32x16(i32x16_sub_cs(v, c, xsum16[xo >> 4]), f32x16_mul(s_lo, dx), acc)
        v = pair_sums16(_dot2(wa[2], wa[3], xq, xo + 16, lo_off, two),
                        _dot2(wb[2], wb[3], xq, xo + 16, lo_off, two))
        return fma_i32x16(i32x16_sub_cs(v, c, xsum16[(xo >> 4) + 1]), f32x16_mul(s_hi, dx), acc)
    v = pair_sums16(_dot4(wa, xq, xo, lo_off, two), _dot4(wb, xq, xo, lo_off, two))
    xs = xsum16[xo >> 4] + xsum16[(xo >> 4) + 1]
    return fma_i32x16(i32x16_sub_cs(v, c, xs), f32x16_mul(s_lo, dx), acc)


@njit(inline="always", cache=True)
def grid_tile(qtype, pa, pb, xq, lo_off, dx, xsum16, t0, t1, t2, t3, res, nt, two):
    cols = xq.shape[1]
    size = block_bytes(qtype)
    halves = per16(qtype)
    f0, f1, f2, f3 = f32x16_zero(), f32x16_zero(), f32x16_zero(), f32x16_zero()
    for b in range(pa.shape[0] // size):
        o = b * size
        _prefetch_block(pa, pb, o, size)
        for s in range(8):
            lo, hi, c = scales(qtype, pa, pb, o, s)
            wa = runs(qtype, pa, o, s)
            wb = runs(qtype, pb, o, s)
            xb = b * 256 + 32 * s
            g = xb >> 5
            f0 = _sub32(wa, wb, xq, t0 * cols + xb, lo_off, two, c, xsum16, lo, hi, dx[t0, g],
                        halves, f0)
            if nt > 1:
                f1 = _sub32(wa, wb, xq, t1 * cols + xb, lo_off, two, c, xsum16, lo, hi,
                            dx[t1, g], halves, f1)
                if nt > 2:
                    f2 = _sub32(wa, wb, xq, t2 * cols + xb, lo_off, two, c, xsum16, lo, hi,
                                dx[t2, g], halves, f2)
                    if nt > 3:
                        f3 = _sub32(wa, wb, xq, t3 * cols + xb, lo_off, two, c, xsum16, lo, hi,
                                    dx[t3, g], halves, f3)
    store_tiles(res, f0, f1, f2, f3, nt)
