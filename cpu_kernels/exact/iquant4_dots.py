"""Row dot products on the 4-bit level-table types (IQ4_NL, IQ4_XS, MXFP4): each nibble selects
one of 16 int8 levels (IQ4_LEVELS, ggml's kvalues_iq4nl; MXFP4_LEVELS, its kvalues_mxfp4),
scaled per 32 elements.

Contract as in iquant_grid_dots, (row, x, dx, xs, quantized); level * x is an integer for int8
x, so one body serves both modes.

    IQ4_NL (18 B / 32): f16 d @0; nibbles @2: byte j holds element j (low), 16 + j (high)
    IQ4_XS (136 B / 256): f16 d @0; u16 scales_h @2 (2 bits per sub-block s at 2s); scales_l @4
        (nibble per sub-block); nibbles @8+16s as IQ4_NL's; w = d * (scale - 32) * level
    MXFP4 (17 B / 32): u8 E8M0 e @0; nibbles @1 as IQ4_NL's; w = 2^(e - 128) * level

row: [row_bytes] uint8  x: [C] f32  xq: [C] int8  dx, xs: [C/32] f32
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels.formats.iquant_tables import IQ4_LEVELS, MXFP4_LEVELS
from cpu_kernels.formats.scalars import e8m0_at, f16_at

f32 = np.float32
i64 = np.int64


@njit(inline="always", cache=True)
def _nibble_run(row: np.ndarray, qo: int, x: np.ndarray, xb: int, levels: np.ndarray) -> float:
    """sum over the 32 elements whose nibbles are the 16 bytes at qo."""
    s = f32(0.0)
    for j in range(16):
        q = row[qo + j]
        s += f32(levels[q & 15]) * f32(x[xb + j]) + f32(levels[q >> 4]) * f32(x[xb + 16 + j])
    return s


@njit(inline="always", cache=True)
def _scaled_blocks(row: np.ndarray, x: np.ndarray, dx: np.ndarray, quantized: bool,
                   mx: bool) -> float:
    """Blocks of one scale and 16 nibble bytes: IQ4_NL's (f16 d, 18 B) or MXFP4's (E8M0, 17 B)."""
    size = 17 if mx else 18
    acc = f32(0.0)
    for g in range(row.shape[0] // size):
        if mx:
            t = _nibble_run(row, size * g + 1, x, 32 * g, MXFP4_LEVELS) * e8m0_at(row, size * g)
        else:
            t = _nibble_run(row, size * g + 2, x, 32 * g, IQ4_LEVELS) * f16_at(row, size * g)
        acc += t * (dx[g] if quantized else f32(1.0))
    return acc


@njit(fastmath=True, cache=True)
def iq4_nl(row: np.ndarray, x: np.ndarray, dx: np.ndarray, xs: np.ndarray,
           quantized: bool) -> float:
    return _scaled_blocks(row, x, dx, quantized, False)


@njit(fastmath=True, cache=True)
def iq4_xs(row: np.ndarray, x: np.ndarray, dx: np.ndarray, xs: np.ndarray,
           quantized: bool) -> float:
    acc = f32(0.0)
    for b in range(row.shape[0] // 136):
        o = b * 136
        d = f16_at(row, o)
        high = i64(row[o + 2]) | (i64(row[o + 3]) << 8)
        for s in range(8):
            low = (i64(row[o + 4 + (s >> 1)]) >> (4 * (s & 1))) & 15
            scale = (low | (((high >> (2 * s)) & 3) << 4)) - 32
            g = b * 8 + s
            t = _nibble_run(row, o + 8 + 16 * s, x, 32 * g, IQ4_LEVELS)
            acc += d * f32(scale) * t * (dx[g] if quantized else f32(1.0))
    return acc


@njit(fastmath=True, cache=True)
def mxfp4(row: np.ndarray, x: np.ndarray, dx: np.ndarray, xs: np.ndarray,
          quantized: bool) -> float:
    return _scaled_blocks(row, x, dx, quantized, True)
