"""Row dot products on the 1-bit-class i-quants (IQ1_S, IQ1_M): 256 elements per block, runs
of 8 from a 2048-code ternary grid (values -1, 0, 1) shifted by +-1/8.

Contract as in iquant_grid_dots: (row, x, dx, xs, quantized), exact (float32 x) or fast (int8
x per 32-group, scales dx). A run's weight is
dl * (grid + delta): the grid part is an integer dot, the delta part needs the run's sum of x
(IQ1_S shares one delta per 32 elements, so the 32-group sum `xs` serves; IQ1_M has one per run
of 8, summed in the same loop).

    IQ1_S (50 B): f16 d @0; code low bytes @2+k (k = 4s + l); u16 @34+2s: 3 high code bits per
        run (bits 3l), a 3-bit scale (bits 12..14), the delta's sign (bit 15);
        w = d * (2 scale + 1) * (grid + (-1/8 if bit 15 else 1/8))
    IQ1_M (56 B): code low bytes @0+k; nibbles @32 (run k: byte 32 + k/2, low nibble for even k):
        3 high code bits, delta sign in bit 3; 4 u16 @48: 3-bit scales (one per 16 elements,
        4 per u16 at bits 3m) and, in their top nibbles, the f16 d;
        w = d * (2 scale + 1) * (grid + delta)

row: [row_bytes] uint8  x: [C] f32  xq: [C] int8  dx, xs: [C/32] f32
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels.formats.iquant_tables import GRID_IQ1_S
from cpu_kernels.formats.scalars import F16_TABLE, f16_at

f32 = np.float32
i64 = np.int64
DELTA = f32(0.125)


@njit(fastmath=True, cache=True)
def iq1_s(row: np.ndarray, x: np.ndarray, dx: np.ndarray, xs: np.ndarray,
          quantized: bool) -> float:
    acc = f32(0.0)
    for b in range(row.shape[0] // 50):
        o = b * 50
        d = f16_at(row, o)
        for s in range(8):
            qh = i64(row[o + 34 + 2 * s]) | (i64(row[o + 35 + 2 * s]) << 8)
            xb = b * 256 + 32 * s
            t = f32(0.0)
            for k in range(4):
                code = i64(row[o + 2 + 4 * s + k]) | (((qh >> (3 * k)) & 7) << 8)
                for j in range(8):
                    t += f32(GRID_IQ1_S[code, j]) * f32(x[xb + 8 * k + j])
            dl = d * f32(2 * ((qh >> 12) & 7) + 1)
            delta = -DELTA if qh & 0x8000 else DELTA
            g = xb >> 5
            acc += dl * ((t * dx[g] if quantized else t) + delta * xs[g])
    return acc


@njit(inline="always", cache=True)
def iq1_m_d(row: np.ndarray, o: int) -> float:
    """IQ1_M's f16 d, spread over the top nibbles of its 4 scale words at o + 48."""
    bits = i64(0)
    for m in range(4):
        bits |= (i64(row[o + 49 + 2 * m]) >> 4) << (4 * m)
    return F16_TABLE[bits]


@njit(fastmath=True, cache=True)
def iq1_m(row: np.ndarray, x: np.ndarray, dx: np.ndarray, xs: np.ndarray,
          quantized: bool) -> float:
    acc = f32(0.0)
    for b in range(row.shape[0] // 56):
        o = b * 56
        d = iq1_m_d(row, o)
        for s in range(8):
            xb = b * 256 + 32 * s
            scale_f = f32(dx[xb >> 5]) if quantized else f32(1.0)
            for h in range(2):
                n = 2 * s + h  # scale index: 3 bits at 3 (n % 4) of u16 n / 4
                word = i64(row[o + 48 + 2 * (n >> 2)]) | (i64(row[o + 49 + 2 * (n >> 2)]) << 8)
                dl = d * f32(2 * ((word >> (3 * (n & 3))) & 7) + 1)
                t = f32(0.0)
                for k in range(2 * h, 2 * h + 2):
                    run = 4 * s + k
                    nib = (i64(row[o + 32 + (run >> 1)]) >> (4 * (run & 1))) & 15
                    code = i64(row[o + run]) | ((nib & 7) << 8)
                    q = f32(0.0)
                    sx = f32(0.0)
                    for j in range(8):
                        v = f32(x[xb + 8 * k + j])
                        q += f32(GRID_IQ1_S[code, j]) * v
                        sx += v
                    t += q + (-DELTA if nib & 8 else DELTA) * sx
                acc += dl * t * scale_f
    return acc

