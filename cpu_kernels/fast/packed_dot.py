"""The packed tiles' compiled variants, one specialization per shape: the K-quants and
Q8_0/Q5_0 here, the i-quants in packed_dot_iq; tile_set.tile_of dispatches over them.
"""

from __future__ import annotations

from numba import njit

from cpu_kernels.fast.packed_tiles import g32_tile, q4_k_tile, q6_k_tile
from cpu_kernels.fast.packed_tiles_low import q2_k_tile, q3_k_tile


def _specialize(body, nt: int, two: bool, first: int = 0):
    if first:  # a constant first argument: block bytes (g32_tile, iq4_tile) or a type id
        def tile(pa, pb, xq, lo_off, dx, sums, t0, t1, t2, t3, res):
            body(first, pa, pb, xq, lo_off, dx, sums, t0, t1, t2, t3, res, nt, two)
    else:
        def tile(pa, pb, xq, lo_off, dx, sums, t0, t1, t2, t3, res):
            body(pa, pb, xq, lo_off, dx, sums, t0, t1, t2, t3, res, nt, two)
    # A name of its own: numba names compiled code by qualified name, argument types and a
    # per-process counter, and the variants share the last two. Compiled in different
    # processes (the on-disk cache, a first start's background compile) two variants could get
    # one symbol, and a caller linking both would run the other's tiles.
    tile.__qualname__ = f"{body.__name__}_{first}_{nt}_{int(two)}"
    return njit(cache=True)(tile)


def variants(body, first: int = 0) -> tuple:
    """The 8 specializations of a tile body: variant v has v % 4 + 1 activation rows and two
    planes when v >= 4."""
    return tuple(_specialize(body, n, p, first) for p in (False, True) for n in (1, 2, 3, 4))


# numba calls module globals: each variant gets a name
Q4_K_V, Q6_K_V = variants(q4_k_tile), variants(q6_k_tile)
Q8_0_V, Q5_0_V = variants(g32_tile, 288), variants(g32_tile, 192)
Q2_K_V, Q3_K_V = variants(q2_k_tile), variants(q3_k_tile)
Q4_K_0, Q4_K_1, Q4_K_2, Q4_K_3, Q4_K_4, Q4_K_5, Q4_K_6, Q4_K_7 = Q4_K_V
Q6_K_0, Q6_K_1, Q6_K_2, Q6_K_3, Q6_K_4, Q6_K_5, Q6_K_6, Q6_K_7 = Q6_K_V
Q8_0_0, Q8_0_1, Q8_0_2, Q8_0_3, Q8_0_4, Q8_0_5, Q8_0_6, Q8_0_7 = Q8_0_V
Q5_0_0, Q5_0_1, Q5_0_2, Q5_0_3, Q5_0_4, Q5_0_5, Q5_0_6, Q5_0_7 = Q5_0_V
Q2_K_0, Q2_K_1, Q2_K_2, Q2_K_3, Q2_K_4, Q2_K_5, Q2_K_6, Q2_K_7 = Q2_K_V
Q3_K_0, Q3_K_1, Q3_K_2, Q3_K_3, Q3_K_4, Q3_K_5, Q3_K_6, Q3_K_7 = Q3_K_V


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
