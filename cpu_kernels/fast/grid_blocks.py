"""Reading the packed lattice i-quant blocks (layouts in packed_iquants.py): per sub-block of
32 columns, its 4 runs of 8 weights of 8 rows (b64, simd_grid.py) and the rows' scales.

`runs` gives unsigned weights u with w = scale * (u - c): signed grids are stored as C + w
(C = 64), the 1-bit grids as 8 grid + 8 +- 1 shifted the same way. `scales` gives, per row in
lane (rows 0-7 from one group, 8-15 from the other), the scale of the first and of the second 16
columns (equal for the types with one scale per 32) and c (an i32x16: IQ1_S's offsets differ
per row; numba types every branch alike, and LLVM folds the constant splats).
qtype is a compile-time constant in every caller (packed_tiles_grid), so LLVM keeps one branch.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels.exact.iquant_decode import G_IQ2_S, G_IQ2_XS, G_IQ2_XXS
from cpu_kernels.formats import iquant_tables as tables
from cpu_kernels.formats import qtypes as qt
from cpu_kernels.simd.simd_grid import (
    grid_run,
    grid_run4,
    grid_run4_high,
    grid_run_high8,
    grid_run_high16,
    grid_run_u16,
    signed_run,
    signed_run7,
)
from cpu_kernels.simd.simd_lane_pairs import i32x16_fill, i32x16_to_f32, nibbles16, words16
from cpu_kernels.simd.simd_pairs import f32x16_mul, load_f32x16_at

f32 = np.float32
C = 64  # the stored offset of the signed grids: |w| <= 62 -> C + w in 2..126
IQ1_C = 9  # IQ1_M's: 8 grid + 9 +- 1 in 0..18


def _rows(values: np.ndarray, dtype) -> np.ndarray:
    """[N, n] small non-negative ints -> [N] of `dtype` (n bytes each), byte j = value j."""
    return np.ascontiguousarray(values.astype(np.uint8)).view(dtype).reshape(-1)


# The signed grids hold C + |w| per byte (every |w| < C: no carry between bytes), so a run needs
# only its negative weights flipped to C - |w| (simd_grid.signed_run). iquant_decode's IQ2 grids
# hold |w| as uint64 rows.
GRID2_XXS, GRID2_XS, GRID2_S = (g + np.uint64(C * 0x0101010101010101)
                                 for g in (G_IQ2_XXS, G_IQ2_XS, G_IQ2_S))
GRID3_XXS = _rows(tables.GRID_IQ3_XXS + C, np.uint32)
GRID3_S = _rows(tables.GRID_IQ3_S + C, np.uint32)
_G1 = 8 * tables.GRID_IQ1_S.astype(np.int16)
GRID1_S = _rows(_G1 + 8, np.uint64)  # IQ1_S: c = 7 (delta +) or 9 (delta -) per sub-block
GRID1_M = _rows(np.concatenate([_G1 + IQ1_C + 1, _G1 + IQ1_C - 1]), np.uint64)  # code | minus << 11

# packed bytes per 8 rows x 256 columns
BLOCK_BYTES = {qt.IQ2_XXS: 576, qt.IQ2_XS: 608, qt.IQ2_S: 672, qt.IQ3_XXS: 832, qt.IQ3_S: 896,
               qt.IQ1_S: 416, qt.IQ1_M: 480}
IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M = (qt.IQ2_XXS, qt.IQ2_XS, qt.IQ2_S,
                                                        qt.IQ3_XXS, qt.IQ3_S, qt.IQ1_S, qt.IQ1_M)


_SIZES = np.zeros(max(BLOCK_BYTES) + 1, np.int64)  # BLOCK_BYTES by type id, for the kernels
for _qtype, _size in BLOCK_BYTES.items():
    _SIZES[_qtype] = _size


@njit(cache=True)
def block_bytes(qtype):
    return _SIZES[qtype]


@njit(cache=True)
def per16(qtype):
    """Whether the type has a scale per 16 columns (else one per 32)."""
    return qtype == IQ2_XS or qtype == IQ2_S or qtype == IQ1_M


@njit(cache=True)
def _run(qtype, pk, o, s, j):
    k = 4 * s + j
    c2 = 2 * C
    if qtype == IQ2_XXS:
        return signed_run(grid_run(GRID2_XXS, pk, o + 8 * k), pk, o + 256 + 8 * k, c2)
    if qtype == IQ2_XS:
        return signed_run7(grid_run_u16(GRID2_XS, pk, o + 16 * k, 511), pk, o + 16 * k, c2)
    if qtype == IQ2_S:
        return signed_run(grid_run_high8(GRID2_S, pk, o + 8 * k, o + 512 + 8 * s, 2 * j, 3), pk,
                          o + 256 + 8 * k, c2)
    if qtype == IQ3_XXS:
        return signed_run(grid_run4(GRID3_XXS, pk, o + 16 * k), pk, o + 512 + 8 * k, c2)
    if qtype == IQ3_S:
        return signed_run(grid_run4_high(GRID3_S, pk, o + 16 * k, o + 512 + 8 * s, j), pk,
                          o + 576 + 8 * k, c2)
    if qtype == IQ1_S:
        return grid_run_high16(GRID1_S, pk, o + 8 * k, o + 256 + 16 * s, 3 * j, 7)
    return grid_run_high8(GRID1_M, pk, o + 8 * k, o + 256 + 8 * (k >> 1), 4 * (j & 1), 15)


@njit(cache=True)
def runs(qtype, pk, o, s):
    """The 4 runs of sub-block s of the block at byte o."""
    return _run(qtype, pk, o, s, 0), _run(qtype, pk, o, s, 1), _run(qtype, pk, o, s, 2), _run(
        qtype, pk, o, s, 3)


@njit(cache=True)
def _nibble_scale(pa, pb, so, sh, d, a, b):
    return f32x16_mul(nibbles16(pa, pb, so, sh, f32(a), f32(b)), d)


@njit(cache=True)
def scales(qtype, pa, pb, o, s):
    """(scale of columns 0-15, of 16-31, offsets c) of sub-block s, one row of the two groups
    per lane."""
    if qtype == IQ2_XXS or qtype == IQ3_XXS:
        d_at, sc_at = (544, 512) if qtype == IQ2_XXS else (800, 768)
        d = f32x16_mul(load_f32x16_at(pa, pb, o + d_at), f32(0.25 if qtype == IQ2_XXS else 0.5))
        lo = _nibble_scale(pa, pb, o + sc_at + 8 * (s >> 1), 4 * (s & 1), d, 1.0, 0.5)
        return lo, lo, i32x16_fill(C)
    if qtype == IQ2_XS or qtype == IQ2_S:
        d_at, sc_at = (576, 512) if qtype == IQ2_XS else (640, 576)
        d = f32x16_mul(load_f32x16_at(pa, pb, o + d_at), f32(0.25))
        return (_nibble_scale(pa, pb, o + sc_at + 8 * s, 0, d, 1.0, 0.5),
                _nibble_scale(pa, pb, o + sc_at + 8 * s, 4, d, 1.0, 0.5), i32x16_fill(C))
    if qtype == IQ3_S:
        lo = _nibble_scale(pa, pb, o + 832 + 8 * (s >> 1), 4 * (s & 1),
                           load_f32x16_at(pa, pb, o + 864), 2.0, 1.0)
        return lo, lo, i32x16_fill(C)
    if qtype == IQ1_S:
        oh = o + 256 + 16 * s
        d = f32x16_mul(load_f32x16_at(pa, pb, o + 384), f32(0.125))
        lo = f32x16_mul(i32x16_to_f32(words16(pa, pb, oh, 12, 7, 2, 1)), d)
        return lo, lo, words16(pa, pb, oh, 15, 1, 2, 7)
    d = f32x16_mul(load_f32x16_at(pa, pb, o + 448), f32(0.125))
    return (_nibble_scale(pa, pb, o + 384 + 8 * s, 0, d, 2.0, 1.0),
            _nibble_scale(pa, pb, o + 384 + 8 * s, 4, d, 2.0, 1.0), i32x16_fill(IQ1_C))
