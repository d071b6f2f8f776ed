"""One quantized row times a tile of up to 4 activation rows, dispatched on the ggml type id.

`fast` mode uses the vpdpbusd tiles of simd_dots where the type has one (Q4_K, Q6_K, Q8_0,
Q5_0) and the scalar int8 dots of kquant_dots/legacy_dots otherwise; `exact` mode runs the
float32 row dots once per activation row. Either way the result is 4 floats, of which the first
`nt` are meaningful. Types without a SIMD tile use the scalar int8 dots with one activation
plane and the exact float32 dots with two (xs then holds the float sums of x).

row: [row_bytes] uint8  x: [n, C] f32  xs: [n, C/32] f32 (exact sums; exact mode only)
xq: [P * n, C] int8 (lo_off: flat offset of the lo plane, 0 for one)  dx, xqsum: [n, C/32] f32  xsum4: [n, C/4] int32 (fast mode only)
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels import qtypes as qt
from cpu_kernels.rowdot import row_dot_exact, row_dot_fast
from cpu_kernels.simd_dots import Q4_K_TILES, Q5_0_TILES, Q6_K_TILES, Q8_0_TILES

f32 = np.float32
Q4_K, Q6_K, Q8_0, Q5_0, Q4_0 = qt.Q4_K, qt.Q6_K, qt.Q8_0, qt.Q5_0, qt.Q4_0
SIMD_TYPES = (Q4_K, Q6_K, Q8_0, Q5_0)
# numba calls module globals: one name per specialization (see simd_dots.specialize)
Q4_K_TILES_0, Q4_K_TILES_1, Q4_K_TILES_2, Q4_K_TILES_3 = Q4_K_TILES
Q6_K_TILES_0, Q6_K_TILES_1, Q6_K_TILES_2, Q6_K_TILES_3 = Q6_K_TILES
Q8_0_TILES_0, Q8_0_TILES_1, Q8_0_TILES_2, Q8_0_TILES_3 = Q8_0_TILES
Q5_0_TILES_0, Q5_0_TILES_1, Q5_0_TILES_2, Q5_0_TILES_3 = Q5_0_TILES


@njit(inline="always", cache=True)
def _simd(qtype: int, row: np.ndarray, xq: np.ndarray, lo_off: int, dx: np.ndarray,
          xqsum: np.ndarray, xsum4: np.ndarray, t0: int, t1: int, t2: int, t3: int,
          nt: int) -> tuple[float, float, float, float]:
    v = (0 if nt == 1 else 1) + (2 if lo_off != 0 else 0)
    if qtype == Q4_K:
        if v == 0:
            return Q4_K_TILES_0(row, xq, lo_off, dx, xqsum, t0, t1, t2, t3)
        elif v == 1:
            return Q4_K_TILES_1(row, xq, lo_off, dx, xqsum, t0, t1, t2, t3)
        elif v == 2:
            return Q4_K_TILES_2(row, xq, lo_off, dx, xqsum, t0, t1, t2, t3)
        else:
            return Q4_K_TILES_3(row, xq, lo_off, dx, xqsum, t0, t1, t2, t3)
    if qtype == Q6_K:
        if v == 0:
            return Q6_K_TILES_0(row, xq, lo_off, dx, xsum4, t0, t1, t2, t3)
        elif v == 1:
            return Q6_K_TILES_1(row, xq, lo_off, dx, xsum4, t0, t1, t2, t3)
        elif v == 2:
            return Q6_K_TILES_2(row, xq, lo_off, dx, xsum4, t0, t1, t2, t3)
        else:
            return Q6_K_TILES_3(row, xq, lo_off, dx, xsum4, t0, t1, t2, t3)
    if qtype == Q8_0:
        if v == 0:
            return Q8_0_TILES_0(row, xq, lo_off, dx, xsum4, t0, t1, t2, t3)
        elif v == 1:
            return Q8_0_TILES_1(row, xq, lo_off, dx, xsum4, t0, t1, t2, t3)
        elif v == 2:
            return Q8_0_TILES_2(row, xq, lo_off, dx, xsum4, t0, t1, t2, t3)
        else:
            return Q8_0_TILES_3(row, xq, lo_off, dx, xsum4, t0, t1, t2, t3)
    if qtype == Q5_0:
        if v == 0:
            return Q5_0_TILES_0(row, xq, lo_off, dx, xsum4, t0, t1, t2, t3)
        elif v == 1:
            return Q5_0_TILES_1(row, xq, lo_off, dx, xsum4, t0, t1, t2, t3)
        elif v == 2:
            return Q5_0_TILES_2(row, xq, lo_off, dx, xsum4, t0, t1, t2, t3)
        else:
            return Q5_0_TILES_3(row, xq, lo_off, dx, xsum4, t0, t1, t2, t3)
    return f32(np.nan), f32(np.nan), f32(np.nan), f32(np.nan)


@njit(inline="always", cache=True)
def _one(fast: bool, qtype: int, row: np.ndarray, x: np.ndarray, xs: np.ndarray,
         xq: np.ndarray, lo_off: int, dx: np.ndarray, xqsum: np.ndarray, t: int) -> float:
    if fast and lo_off == 0:
        # xqsum as the "exact sums": offsets then apply to the quantized x, like the SIMD tiles
        return f32(row_dot_fast(qtype, row, x[t], xq[t], dx[t], xqsum[t]))
    return f32(row_dot_exact(qtype, row, x[t], xs[t]))


@njit(cache=True)
def tile_dot(fast: bool, qtype: int, row: np.ndarray, x: np.ndarray, xs: np.ndarray,
             xq: np.ndarray, lo_off: int, dx: np.ndarray, xqsum: np.ndarray,
             xsum4: np.ndarray, t0: int, t1: int, t2: int, t3: int, nt: int) -> tuple[float, float, float, float]:
    """dot(row, activation row t_i) for i < nt."""
    if fast and (qtype == Q4_K or qtype == Q6_K or qtype == Q8_0 or qtype == Q5_0):
        return _simd(qtype, row, xq, lo_off, dx, xqsum, xsum4, t0, t1, t2, t3, nt)
    r0 = _one(fast, qtype, row, x, xs, xq, lo_off, dx, xqsum, t0)
    r1 = _one(fast, qtype, row, x, xs, xq, lo_off, dx, xqsum, t1) if nt > 1 else f32(0.0)
    r2 = _one(fast, qtype, row, x, xs, xq, lo_off, dx, xqsum, t2) if nt > 2 else f32(0.0)
    r3 = _one(fast, qtype, row, x, xs, xq, lo_off, dx, xqsum, t3) if nt > 3 else f32(0.0)
    return r0, r1, r2, r3
