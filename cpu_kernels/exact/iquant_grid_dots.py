"""Row dot products on the lattice i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S): 256
elements per block, 8 sub-blocks of 32, each a run of grid codes (8 or 4 values) with signs.

Every function is dot(row, x) in both modes, `(row, x, dx, xs, quantized)`: exact mode passes
x float32 (`quantized` False: float32 math on the exact weights, equal to gguf-py's
dequantization); fast mode passes x as int8 per 32-group with scales dx. A group's sum of
grid * sign * x is exact in float32 for int8 x (|sum| < 2^24), then scaled once per group.
`xs` (the 32-group sums of x) is for types with offsets (iquant1_dots).
Grids are ggml's (cpu_kernels/formats/iquant_tables.py); SIGNS[i] is ksigns_iq2xs[i] as +-1.

    IQ2_XXS (66 B): f16 d @0; per sub-block s, 8 B @2+8s: 4 grid codes (bytes), then a u32
        holding 4 7-bit sign indices (bits 7k) and a 4-bit scale (bits 28..31);
        w = d * (0.5 + scale) / 4 * grid * sign
    IQ2_XS (74 B): f16 d @0; u16 @2+2k (k = 4s + l): 9-bit code | 7-bit sign index << 9;
        scales @66+s, a nibble per 16 elements; w = d * (0.5 + nibble) / 4 * grid * sign
    IQ2_S (82 B): f16 d @0; code low bytes @2+k, sign bytes (bit j = element j) @34+k, high
        code bits @66+s (2 per group), scales @74+s (nibble per 16); 1024-code grid
    IQ3_XXS (98 B): f16 d @0; 64 4-value codes @2 (8 per sub-block); u32 @66+4s: 4 sign
        indices for its 4 runs of 8 and a 4-bit scale; w = d * (0.5 + scale) / 2 * grid * sign
    IQ3_S (110 B): f16 d @0; code low bytes @2, high bits @66+s (bit l of code 8s + l), sign
        bits @74 (one per element), scales @106 (nibble per sub-block); w = d * (1 + 2 sc) ...

row: [row_bytes] uint8  x: [C] f32  xq: [C] int8  dx, xs: [C/32] f32
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels.formats.iquant_tables import (
    GRID_IQ2_S,
    GRID_IQ2_XS,
    GRID_IQ2_XXS,
    GRID_IQ3_S,
    GRID_IQ3_XXS,
    SIGNS,
)
from cpu_kernels.formats.scalars import f16_at, u32_at

f32 = np.float32
i64 = np.int64


@njit(inline="always", cache=True)
def _signed_run(grid: np.ndarray, code: int, sign: int, x: np.ndarray, xb: int) -> float:
    """sum_j grid[code, j] * SIGNS[sign, j] * x[xb + j] over the run of 8."""
    s = f32(0.0)
    for j in range(8):
        s += f32(grid[code, j] * SIGNS[sign, j]) * f32(x[xb + j])
    return s


@njit(inline="always", cache=True)
def _bit_signed(grid: np.ndarray, code: int, bits: int, x: np.ndarray, xb: int, n: int,
                first: int) -> float:
    """sum_j grid[code, j] * (-1 if bit first + j of `bits` else 1) * x[xb + j], j < n."""
    s = f32(0.0)
    for j in range(n):
        v = f32(grid[code, j]) * f32(x[xb + j])
        s += -v if (bits >> (first + j)) & 1 else v
    return s


@njit(fastmath=True, cache=True)
def iq2_xxs(row: np.ndarray, x: np.ndarray, dx: np.ndarray, xs: np.ndarray,
            quantized: bool) -> float:
    acc = f32(0.0)
    for b in range(row.shape[0] // 66):
        o = b * 66
        d = f16_at(row, o)
        for s in range(8):
            w = u32_at(row, o + 6 + 8 * s)
            xb = b * 256 + 32 * s
            t = f32(0.0)
            for k in range(4):
                t += _signed_run(GRID_IQ2_XXS, i64(row[o + 2 + 8 * s + k]), (w >> (7 * k)) & 127,
                                 x, xb + 8 * k)
            db = d * (f32(0.5) + f32(w >> 28)) * f32(0.25)
            acc += db * t * (dx[(xb >> 5)] if quantized else f32(1.0))
    return acc


@njit(fastmath=True, cache=True)
def iq2_xs(row: np.ndarray, x: np.ndarray, dx: np.ndarray, xs: np.ndarray,
           quantized: bool) -> float:
    acc = f32(0.0)
    for b in range(row.shape[0] // 74):
        o = b * 74
        d = f16_at(row, o)
        for s in range(8):
            sc = row[o + 66 + s]
            xb = b * 256 + 32 * s
            for h in range(2):
                t = f32(0.0)
                for k in range(2 * h, 2 * h + 2):
                    q = i64(row[o + 2 + 8 * s + 2 * k]) | (i64(row[o + 3 + 8 * s + 2 * k]) << 8)
                    t += _signed_run(GRID_IQ2_XS, q & 511, q >> 9, x, xb + 8 * k)
                db = d * (f32(0.5) + f32((sc >> (4 * h)) & 15)) * f32(0.25)
                acc += db * t * (dx[(xb >> 5)] if quantized else f32(1.0))
    return acc


@njit(fastmath=True, cache=True)
def iq2_s(row: np.ndarray, x: np.ndarray, dx: np.ndarray, xs: np.ndarray,
          quantized: bool) -> float:
    acc = f32(0.0)
    for b in range(row.shape[0] // 82):
        o = b * 82
        d = f16_at(row, o)
        for s in range(8):
            sc = row[o + 74 + s]
            qh = i64(row[o + 66 + s])
            xb = b * 256 + 32 * s
            for h in range(2):
                t = f32(0.0)
                for k in range(2 * h, 2 * h + 2):
                    code = i64(row[o + 2 + 4 * s + k]) | (((qh >> (2 * k)) & 3) << 8)
                    t += _bit_signed(GRID_IQ2_S, code, i64(row[o + 34 + 4 * s + k]), x,
                                     xb + 8 * k, 8, 0)
                db = d * (f32(0.5) + f32((sc >> (4 * h)) & 15)) * f32(0.25)
                acc += db * t * (dx[(xb >> 5)] if quantized else f32(1.0))
    return acc


@njit(fastmath=True, cache=True)
def iq3_xxs(row: np.ndarray, x: np.ndarray, dx: np.ndarray, xs: np.ndarray,
            quantized: bool) -> float:
    acc = f32(0.0)
    for b in range(row.shape[0] // 98):
        o = b * 98
        d = f16_at(row, o)
        for s in range(8):
            w = u32_at(row, o + 66 + 4 * s)
            xb = b * 256 + 32 * s
            t = f32(0.0)
            for k in range(4):
                sign = (w >> (7 * k)) & 127
                for half in range(2):
                    code = i64(row[o + 2 + 8 * s + 2 * k + half])
                    for j in range(4):
                        t += f32(GRID_IQ3_XXS[code, j] * SIGNS[sign, 4 * half + j]) * f32(
                            x[xb + 8 * k + 4 * half + j])
            db = d * (f32(0.5) + f32(w >> 28)) * f32(0.5)
            acc += db * t * (dx[(xb >> 5)] if quantized else f32(1.0))
    return acc


@njit(fastmath=True, cache=True)
def iq3_s(row: np.ndarray, x: np.ndarray, dx: np.ndarray, xs: np.ndarray,
          quantized: bool) -> float:
    acc = f32(0.0)
    for b in range(row.shape[0] // 110):
        o = b * 110
        d = f16_at(row, o)
        for s in range(8):
            qh = i64(row[o + 66 + s])
            xb = b * 256 + 32 * s
            t = f32(0.0)
            for k in range(4):
                signs = i64(row[o + 74 + 4 * s + k])
                for half in range(2):
                    m = 2 * k + half
                    code = i64(row[o + 2 + 8 * s + m]) | (((qh >> m) & 1) << 8)
                    t += _bit_signed(GRID_IQ3_S, code, signs, x, xb + 4 * m, 4, 4 * half)
            sc = (row[o + 106 + (s >> 1)] >> (4 * (s & 1))) & 15
            acc += d * f32(1 + 2 * i64(sc)) * t * (dx[(xb >> 5)] if quantized else f32(1.0))
    return acc

