"""Dispatch of the packed tiles for layers with i-quants: their tiles (packed_tiles_grid,
packed_tiles_iq4), and packed_dot's for the other types of a mixed layer.

packed_tile_iq has packed_tile's arguments. It is a separate function because a numba kernel
compiles every tile variant its dispatch names: ~80 s for the K-quants' 48 on a 2-core box,
~220 s with the i-quants' 72 more. The kernels call `tile_of(family, ...)`, family
packed_moe.KQUANT_TILES or IQUANT_TILES, told apart by its numba *type*: KQUANT_TILES types
packed_tile alone, so a model without i-quants never compiles theirs.
"""

from __future__ import annotations

from numba import njit, types
from numba.core.errors import TypingError
from numba.extending import overload

from cpu_kernels.fast.packed_dot import _call, packed_tile, variants
from cpu_kernels.fast.packed_tiles_grid import grid_tile
from cpu_kernels.fast.packed_tiles_iq4 import IQ4_NL_BYTES, IQ4_XS_BYTES, iq4_tile
from cpu_kernels.formats import qtypes as qt

IQ1_S_0, IQ1_S_1, IQ1_S_2, IQ1_S_3, IQ1_S_4, IQ1_S_5, IQ1_S_6, IQ1_S_7 = variants(grid_tile,
                                                                                 qt.IQ1_S)
IQ1_M_0, IQ1_M_1, IQ1_M_2, IQ1_M_3, IQ1_M_4, IQ1_M_5, IQ1_M_6, IQ1_M_7 = variants(grid_tile,
                                                                                 qt.IQ1_M)
IQ2_XXS_0, IQ2_XXS_1, IQ2_XXS_2, IQ2_XXS_3, IQ2_XXS_4, IQ2_XXS_5, IQ2_XXS_6, IQ2_XXS_7 = variants(
    grid_tile, qt.IQ2_XXS)
IQ2_XS_0, IQ2_XS_1, IQ2_XS_2, IQ2_XS_3, IQ2_XS_4, IQ2_XS_5, IQ2_XS_6, IQ2_XS_7 = variants(
    grid_tile, qt.IQ2_XS)
IQ2_S_0, IQ2_S_1, IQ2_S_2, IQ2_S_3, IQ2_S_4, IQ2_S_5, IQ2_S_6, IQ2_S_7 = variants(grid_tile,
                                                                                 qt.IQ2_S)
IQ3_XXS_0, IQ3_XXS_1, IQ3_XXS_2, IQ3_XXS_3, IQ3_XXS_4, IQ3_XXS_5, IQ3_XXS_6, IQ3_XXS_7 = variants(
    grid_tile, qt.IQ3_XXS)
IQ3_S_0, IQ3_S_1, IQ3_S_2, IQ3_S_3, IQ3_S_4, IQ3_S_5, IQ3_S_6, IQ3_S_7 = variants(grid_tile,
                                                                                 qt.IQ3_S)
IQ4_XS_0, IQ4_XS_1, IQ4_XS_2, IQ4_XS_3, IQ4_XS_4, IQ4_XS_5, IQ4_XS_6, IQ4_XS_7 = variants(
    iq4_tile, IQ4_XS_BYTES)
IQ4_NL_0, IQ4_NL_1, IQ4_NL_2, IQ4_NL_3, IQ4_NL_4, IQ4_NL_5, IQ4_NL_6, IQ4_NL_7 = variants(
    iq4_tile, IQ4_NL_BYTES)
IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S = (qt.IQ1_S, qt.IQ1_M, qt.IQ2_XXS, qt.IQ2_XS,
                                                        qt.IQ2_S, qt.IQ3_XXS, qt.IQ3_S)
IQ4_XS, IQ4_NL = qt.IQ4_XS, qt.IQ4_NL


@njit(cache=True)
def packed_tile_iq(qtype, pa, pb, xq, lo_off, dx, xqsum, xsum16, t0, t1, t2, t3, nt, res) -> None:
    """packed_tile for every packed type, the i-quants included."""
    v = min(nt, 4) - 1 + (4 if lo_off != 0 else 0)
    if qtype == IQ2_XXS:
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
    else:
        packed_tile(qtype, pa, pb, xq, lo_off, dx, xqsum, xsum16, t0, t1, t2, t3, nt, res)


def tile_of(family, qtype, pa, pb, xq, lo_off, dx, xqsum, xsum16, t0, t1, t2, t3, nt, res):
    """packed_tile (family KQUANT_TILES, an int8) or packed_tile_iq (IQUANT_TILES, an int16)."""


@overload(tile_of)
def _tile_of(family, qtype, pa, pb, xq, lo_off, dx, xqsum, xsum16, t0, t1, t2, t3, nt, res):
    if not isinstance(family, types.Integer) or family.bitwidth not in (8, 16):
        raise TypingError(
            f"tile_of's family is packed_moe.KQUANT_TILES or IQUANT_TILES, not {family}")
    fn = packed_tile_iq if family.bitwidth == 16 else packed_tile

    def impl(family, qtype, pa, pb, xq, lo_off, dx, xqsum, xsum16, t0, t1, t2, t3, nt, res):
        fn(qtype, pa, pb, xq, lo_off, dx, xqsum, xsum16, t0, t1, t2, t3, nt, res)
    return impl
