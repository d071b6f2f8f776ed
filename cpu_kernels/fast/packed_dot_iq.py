"""The table-coded types' packed tile variants (the i-quants' packed_tiles_grid and
packed_tiles_iq4, MXFP4's in packed_tiles_iq4 too), as packed_dot's for the K-quants; tile_set.tile_of dispatches over them.
"""

from __future__ import annotations

from cpu_kernels.fast.packed_dot import variants
from cpu_kernels.fast.packed_tiles_grid import grid_tile
from cpu_kernels.fast.packed_tiles_iq4 import IQ4_NL_BYTES, IQ4_XS_BYTES, MXFP4_BYTES, iq4_tile
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
MXFP4_0, MXFP4_1, MXFP4_2, MXFP4_3, MXFP4_4, MXFP4_5, MXFP4_6, MXFP4_7 = variants(
    iq4_tile, MXFP4_BYTES)
