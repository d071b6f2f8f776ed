"""Row dot products on the low-bit K-quants (Q2_K, Q3_K): 256 elements, 16 sub-blocks of 16.

Same contract as kquant_dots: `exact` dots take (row, x, xs), `fast` (`*_q8`) dots take
(row, xq, dx, xs). Sub-blocks are 16 elements, finer than the 32-groups of `xs`, so Q2_K's
offsets use sums of x per sub-block taken in the same loop (`xs` is unused here).
Element e = 128 n + 32 j + l (half n, shift j, l < 32) has its 2 low bits at bit 2j of
qs[32 n + l] and sub-block e // 16 = 8 n + 2 j + l // 16.

    Q2_K (84 B): scales[16] @0 (low nibble scale, high nibble min), qs[64] @16, f16 d @80,
        f16 dmin @82; w = d * sc * q - dmin * m, q in 0..3
    Q3_K (110 B): hmask[32] @0 (bit 4 n + j of byte l), qs[64] @32, 6-bit scales packed in 12 B
        @96, f16 d @108; w = d * (sc - 32) * (q - 4 * (1 - hbit)), q - 4 (1 - hbit) in -4..3

row: [row_bytes] uint8  x: [C] f32  xq: [C] int8  dx, xs: [C/32] f32
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels.formats.scalars import f16_at, k3_scale

f32 = np.float32
i32 = np.int32
u8 = np.uint8


@njit(fastmath=True, cache=True)
def dot_q2_k(row: np.ndarray, x: np.ndarray, xs: np.ndarray) -> float:
    acc = f32(0.0)
    for b in range(row.shape[0] // 84):
        o = b * 84
        d = f16_at(row, o + 80)
        dmin = f16_at(row, o + 82)
        for n in range(2):
            for j in range(4):
                for half in range(2):
                    sc = row[o + 8 * n + 2 * j + half]
                    qo = o + 16 + 32 * n + 16 * half
                    xb = b * 256 + 128 * n + 32 * j + 16 * half
                    sq = f32(0.0)
                    sx = f32(0.0)
                    for l in range(16):
                        v = x[xb + l]
                        sq += f32(u8((row[qo + l] >> (2 * j)) & 3)) * v
                        sx += v
                    acc += d * f32(sc & 15) * sq - dmin * f32(sc >> 4) * sx
    return acc


@njit(fastmath=True, cache=True)
def dot_q2_k_q8(row: np.ndarray, xq: np.ndarray, dx: np.ndarray, xs: np.ndarray) -> float:
    acc = f32(0.0)
    for b in range(row.shape[0] // 84):
        o = b * 84
        d = f16_at(row, o + 80)
        dmin = f16_at(row, o + 82)
        for n in range(2):
            for j in range(4):
                for half in range(2):
                    sc = row[o + 8 * n + 2 * j + half]
                    qo = o + 16 + 32 * n + 16 * half
                    xb = b * 256 + 128 * n + 32 * j + 16 * half
                    sq = i32(0)
                    sx = i32(0)
                    for l in range(16):
                        v = i32(xq[xb + l])
                        sq = i32(sq + i32(u8((row[qo + l] >> (2 * j)) & 3)) * v)
                        sx = i32(sx + v)
                    m = dmin * f32(sc >> 4)
                    acc += dx[xb >> 5] * (d * f32(sc & 15) * f32(sq) - m * f32(sx))
    return acc


@njit(fastmath=True, cache=True)
def dot_q3_k(row: np.ndarray, x: np.ndarray, xs: np.ndarray) -> float:
    acc = f32(0.0)
    for b in range(row.shape[0] // 110):
        o = b * 110
        d = f16_at(row, o + 108)
        for n in range(2):
            for j in range(4):
                bit = 4 * n + j
                for half in range(2):
                    sc = k3_scale(row, o + 96, 8 * n + 2 * j + half)
                    qo = o + 32 + 32 * n + 16 * half
                    xb = b * 256 + 128 * n + 32 * j + 16 * half
                    s = f32(0.0)
                    for l in range(16):
                        q = i32((row[qo + l] >> (2 * j)) & 3)
                        q -= 4 * (1 - i32((row[o + 16 * half + l] >> bit) & 1))
                        s += f32(q) * x[xb + l]
                    acc += d * f32(sc) * s
    return acc


@njit(fastmath=True, cache=True)
def dot_q3_k_q8(row: np.ndarray, xq: np.ndarray, dx: np.ndarray, xs: np.ndarray) -> float:
    acc = f32(0.0)
    for b in range(row.shape[0] // 110):
        o = b * 110
        d = f16_at(row, o + 108)
        for n in range(2):
            for j in range(4):
                bit = 4 * n + j
                for half in range(2):
                    sc = k3_scale(row, o + 96, 8 * n + 2 * j + half)
                    qo = o + 32 + 32 * n + 16 * half
                    xb = b * 256 + 128 * n + 32 * j + 16 * half
                    s = i32(0)
                    for l in range(16):
                        q = i32((row[qo + l] >> (2 * j)) & 3)
                        q -= 4 * (1 - i32((row[o + 16 * half + l] >> bit) & 1))
                        s = i32(s + q * i32(xq[xb + l]))
                    acc += d * f32(sc) * dx[xb >> 5] * f32(s)
    return acc
