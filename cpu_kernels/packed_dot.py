"""Dispatch of the packed tiles on the ggml type id, one compiled specialization per shape.

packed_tile(qtype, pa, pb, xq, lo_off, dx, xqsum, xsum16, t0..t3, nt, res): 16 rows (row groups pa
and pb) x nt activation rows, see packed_tiles for the arguments; `xsum16` is flat ([n * C/16])
and `lo_off` != 0 selects the two-plane tiles.
"""

from __future__ import annotations

from numba import njit

from cpu_kernels import qtypes as qt
from cpu_kernels.packed_tiles import g32_tile, q4_k_tile, q6_k_tile
from cpu_kernels.packed_tiles_grid import grid_tile
from cpu_kernels.packed_tiles_iq4 import IQ4_NL_BYTES, IQ4_XS_BYTES, iq4_tile
from cpu_kernels.packed_tiles_low import q2_k_tile, q3_k_tile

Q4_K, Q6_K, Q8_0, Q5_0, Q2_K, Q3_K = qt.Q4_K, qt.Q6_K, qt.Q8_0, qt.Q5_0, qt.Q2_K, qt.Q3_K


def _specialize(body, nt: int, two: bool, block_bytes: int = 0, qtype: int = 0):
    if qtype:
        @njit(cache=True)
        def tile_grid(pa, pb, xq, lo_off, dx, sums, t0, t1, t2, t3, res):
            grid_tile(qtype, pa, pb, xq, lo_off, dx, sums, t0, t1, t2, t3, res, nt, two)
        return tile_grid
    if block_bytes in (IQ4_XS_BYTES, IQ4_NL_BYTES):
        @njit(cache=True)
        def tile_iq4(pa, pb, xq, lo_off, dx, sums, t0, t1, t2, t3, res):
            iq4_tile(block_bytes, pa, pb, xq, lo_off, dx, sums, t0, t1, t2, t3, res, nt, two)
        return tile_iq4
    if block_bytes:
        @njit(cache=True)
        def tile_g32(pa, pb, xq, lo_off, dx, sums, t0, t1, t2, t3, res):
            g32_tile(block_bytes, pa, pb, xq, lo_off, dx, sums, t0, t1, t2, t3, res, nt, two)
        return tile_g32

    @njit(cache=True)
    def tile(pa, pb, xq, lo_off, dx, sums, t0, t1, t2, t3, res):
        body(pa, pb, xq, lo_off, dx, sums, t0, t1, t2, t3, res, nt, two)
    return tile


# variant v: v % 4 + 1 activation rows, two planes when v >= 4; numba calls module globals
Q4_K_V = tuple(_specialize(q4_k_tile, n, p) for p in (False, True) for n in (1, 2, 3, 4))
Q6_K_V = tuple(_specialize(q6_k_tile, n, p) for p in (False, True) for n in (1, 2, 3, 4))
Q8_0_V = tuple(_specialize(g32_tile, n, p, 288) for p in (False, True) for n in (1, 2, 3, 4))
Q5_0_V = tuple(_specialize(g32_tile, n, p, 192) for p in (False, True) for n in (1, 2, 3, 4))
Q2_K_V = tuple(_specialize(q2_k_tile, n, p) for p in (False, True) for n in (1, 2, 3, 4))
Q3_K_V = tuple(_specialize(q3_k_tile, n, p) for p in (False, True) for n in (1, 2, 3, 4))
Q4_K_0, Q4_K_1, Q4_K_2, Q4_K_3, Q4_K_4, Q4_K_5, Q4_K_6, Q4_K_7 = Q4_K_V
Q6_K_0, Q6_K_1, Q6_K_2, Q6_K_3, Q6_K_4, Q6_K_5, Q6_K_6, Q6_K_7 = Q6_K_V
Q8_0_0, Q8_0_1, Q8_0_2, Q8_0_3, Q8_0_4, Q8_0_5, Q8_0_6, Q8_0_7 = Q8_0_V
Q5_0_0, Q5_0_1, Q5_0_2, Q5_0_3, Q5_0_4, Q5_0_5, Q5_0_6, Q5_0_7 = Q5_0_V
Q2_K_0, Q2_K_1, Q2_K_2, Q2_K_3, Q2_K_4, Q2_K_5, Q2_K_6, Q2_K_7 = Q2_K_V
Q3_K_0, Q3_K_1, Q3_K_2, Q3_K_3, Q3_K_4, Q3_K_5, Q3_K_6, Q3_K_7 = Q3_K_V


def _grid(qtype: int) -> tuple:
    return tuple(_specialize(grid_tile, n, p, qtype=qtype) for p in (False, True)
                 for n in (1, 2, 3, 4))


IQ1_S_0, IQ1_S_1, IQ1_S_2, IQ1_S_3, IQ1_S_4, IQ1_S_5, IQ1_S_6, IQ1_S_7 = _grid(qt.IQ1_S)
IQ1_M_0, IQ1_M_1, IQ1_M_2, IQ1_M_3, IQ1_M_4, IQ1_M_5, IQ1_M_6, IQ1_M_7 = _grid(qt.IQ1_M)
IQ2_XXS_0, IQ2_XXS_1, IQ2_XXS_2, IQ2_XXS_3, IQ2_XXS_4, IQ2_XXS_5, IQ2_XXS_6, IQ2_XXS_7 = _grid(
    qt.IQ2_XXS)
IQ2_XS_0, IQ2_XS_1, IQ2_XS_2, IQ2_XS_3, IQ2_XS_4, IQ2_XS_5, IQ2_XS_6, IQ2_XS_7 = _grid(qt.IQ2_XS)
IQ2_S_0, IQ2_S_1, IQ2_S_2, IQ2_S_3, IQ2_S_4, IQ2_S_5, IQ2_S_6, IQ2_S_7 = _grid(qt.IQ2_S)
IQ3_XXS_0, IQ3_XXS_1, IQ3_XXS_2, IQ3_XXS_3, IQ3_XXS_4, IQ3_XXS_5, IQ3_XXS_6, IQ3_XXS_7 = _grid(
    qt.IQ3_XXS)
IQ3_S_0, IQ3_S_1, IQ3_S_2, IQ3_S_3, IQ3_S_4, IQ3_S_5, IQ3_S_6, IQ3_S_7 = _grid(qt.IQ3_S)
IQ4_XS_V = tuple(_specialize(iq4_tile, n, p, IQ4_XS_BYTES) for p in (False, True)
                 for n in (1, 2, 3, 4))
IQ4_NL_V = tuple(_specialize(iq4_tile, n, p, IQ4_NL_BYTES) for p in (False, True)
                 for n in (1, 2, 3, 4))
IQ4_XS_0, IQ4_XS_1, IQ4_XS_2, IQ4_XS_3, IQ4_XS_4, IQ4_XS_5, IQ4_XS_6, IQ4_XS_7 = IQ4_XS_V
IQ4_NL_0, IQ4_NL_1, IQ4_NL_2, IQ4_NL_3, IQ4_NL_4, IQ4_NL_5, IQ4_NL_6, IQ4_NL_7 = IQ4_NL_V
IQ4_XS, IQ4_NL = qt.IQ4_XS, qt.IQ4_NL
IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S = (qt.IQ1_S, qt.IQ1_M, qt.IQ2_XXS, qt.IQ2_XS,
                                                        qt.IQ2_S, qt.IQ3_XXS, qt.IQ3_S)


@njit(inline="always", cache=True)
def _call(f0, f1, f2, f3, f4, f5, f6, f7, v, pa, pb, xq, lo_off, dx, sums, t0, t1, t2, t3, res):
    if v == 0:
        f0(pa, pb, xq, lo_off, dx, sums, t0, t1, t2, t3, res)
    elif v == 1:
        f1(pa, pb, xq, lo_off, dx, sums, t0, t1, t2, t3, res)
    elif v == 2:
        f2(pa, pb, xq, lo_off, dx, sums, t0, t1, t2, t3, res)
    elif v == 3:
        f3(pa, pb, xq, lo_off, dx, sums, t0, t1, t2, t3, res)
    elif v == 4:
        f4(pa, pb, xq, lo_off, dx, sums, t0, t1, t2, t3, res)
    elif v == 5:
        f5(pa, pb, xq, lo_off, dx, sums, t0, t1, t2, t3, res)
    elif v == 6:
        f6(pa, pb, xq, lo_off, dx, sums, t0, t1, t2, t3, res)
    else:
        f7(pa, pb, xq, lo_off, dx, sums, t0, t1, t2, t3, res)


@njit(cache=True)
def packed_tile(qtype, pa, pb, xq, lo_off, dx, xqsum, xsum16, t0, t1, t2, t3, nt, res) -> None:
    """res[16 i + l] = dot(row l of the pair, activation row t_i) for i < nt (see module doc)."""
    v = min(nt, 4) - 1 + (4 if lo_off != 0 else 0)
    if qtype == Q4_K:
        _call(Q4_K_0, Q4_K_1, Q4_K_2, Q4_K_3, Q4_K_4, Q4_K_5, Q4_K_6, Q4_K_7, v, pa, pb, xq, lo_off, dx,
              xqsum, t0, t1, t2, t3, res)
    elif qtype == Q6_K:
        _call(Q6_K_0, Q6_K_1, Q6_K_2, Q6_K_3, Q6_K_4, Q6_K_5, Q6_K_6, Q6_K_7, v, pa, pb, xq, lo_off, dx,
              xsum16, t0, t1, t2, t3, res)
    elif qtype == Q8_0:
        _call(Q8_0_0, Q8_0_1, Q8_0_2, Q8_0_3, Q8_0_4, Q8_0_5, Q8_0_6, Q8_0_7, v, pa, pb, xq, lo_off, dx,
              xsum16, t0, t1, t2, t3, res)
    elif qtype == Q5_0:
        _call(Q5_0_0, Q5_0_1, Q5_0_2, Q5_0_3, Q5_0_4, Q5_0_5, Q5_0_6, Q5_0_7, v, pa, pb, xq, lo_off, dx,
              xsum16, t0, t1, t2, t3, res)
    elif qtype == Q2_K:
        _call(Q2_K_0, Q2_K_1, Q2_K_2, Q2_K_3, Q2_K_4, Q2_K_5, Q2_K_6, Q2_K_7, v, pa, pb, xq, lo_off, dx,
              xsum16, t0, t1, t2, t3, res)
    elif qtype == Q3_K:
        _call(Q3_K_0, Q3_K_1, Q3_K_2, Q3_K_3, Q3_K_4, Q3_K_5, Q3_K_6, Q3_K_7, v, pa, pb, xq, lo_off, dx,
              xsum16, t0, t1, t2, t3, res)
    elif qtype == IQ2_XXS:
        _call(IQ2_XXS_0, IQ2_XXS_1, IQ2_XXS_2, IQ2_XXS_3, IQ2_XXS_4, IQ2_XXS_5, IQ2_XXS_6, IQ2_XXS_7,
              v, pa, pb, xq, lo_off, dx, xsum16, t0, t1, t2, t3, res)
    elif qtype == IQ1_S:
        _call(IQ1_S_0, IQ1_S_1, IQ1_S_2, IQ1_S_3, IQ1_S_4, IQ1_S_5, IQ1_S_6, IQ1_S_7, v, pa, pb, xq,
              lo_off, dx, xsum16, t0, t1, t2, t3, res)
    elif qtype == IQ1_M:
        _call(IQ1_M_0, IQ1_M_1, IQ1_M_2, IQ1_M_3, IQ1_M_4, IQ1_M_5, IQ1_M_6, IQ1_M_7, v, pa, pb, xq,
              lo_off, dx, xsum16, t0, t1, t2, t3, res)
    elif qtype == IQ2_XS:
        _call(IQ2_XS_0, IQ2_XS_1, IQ2_XS_2, IQ2_XS_3, IQ2_XS_4, IQ2_XS_5, IQ2_XS_6, IQ2_XS_7, v, pa,
              pb, xq, lo_off, dx, xsum16, t0, t1, t2, t3, res)
    elif qtype == IQ2_S:
        _call(IQ2_S_0, IQ2_S_1, IQ2_S_2, IQ2_S_3, IQ2_S_4, IQ2_S_5, IQ2_S_6, IQ2_S_7, v, pa, pb, xq,
              lo_off, dx, xsum16, t0, t1, t2, t3, res)
    elif qtype == IQ3_XXS:
        _call(IQ3_XXS_0, IQ3_XXS_1, IQ3_XXS_2, IQ3_XXS_3, IQ3_XXS_4, IQ3_XXS_5, IQ3_XXS_6, IQ3_XXS_7,
              v, pa, pb, xq, lo_off, dx, xsum16, t0, t1, t2, t3, res)
    elif qtype == IQ3_S:
        _call(IQ3_S_0, IQ3_S_1, IQ3_S_2, IQ3_S_3, IQ3_S_4, IQ3_S_5, IQ3_S_6, IQ3_S_7, v, pa, pb, xq,
              lo_off, dx, xsum16, t0, t1, t2, t3, res)
    elif qtype == IQ4_XS:
        _call(IQ4_XS_0, IQ4_XS_1, IQ4_XS_2, IQ4_XS_3, IQ4_XS_4, IQ4_XS_5, IQ4_XS_6, IQ4_XS_7, v, pa,
              pb, xq, lo_off, dx, xsum16, t0, t1, t2, t3, res)
    elif qtype == IQ4_NL:
        _call(IQ4_NL_0, IQ4_NL_1, IQ4_NL_2, IQ4_NL_3, IQ4_NL_4, IQ4_NL_5, IQ4_NL_6, IQ4_NL_7, v, pa,
              pb, xq, lo_off, dx, xsum16, t0, t1, t2, t3, res)
