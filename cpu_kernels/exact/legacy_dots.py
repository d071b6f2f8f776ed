"""Row dot products on 32-element blocks (Q8_0, Q4_0, Q5_0) and on F16/BF16 rows.

Same contract as kquant_dots: `exact` dots take (row, x, xs), `fast` (`*_q8`) dots take
(row, xq, dx, xs). F16 and BF16 have no `fast` variant: their weights are used as stored.
row: [row_bytes] uint8  x: [C] f32  xq: [C] int8  dx, xs: [C/32] f32
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels.formats.scalars import f16_at, f16_bits_to_f32, u32_at

f32 = np.float32
i32 = np.int32
u8 = np.uint8


@njit(fastmath=True, cache=True)
def dot_q8_0(row: np.ndarray, x: np.ndarray, xs: np.ndarray) -> float:
    acc = f32(0.0)
    for g in range(row.shape[0] // 34):
        o = g * 34
        s = f32(0.0)
        for j in range(32):
            s += f32(np.int8(row[o + 2 + j])) * x[32 * g + j]
        acc += f16_at(row, o) * s
    return acc


@njit(fastmath=True, cache=True)
def dot_q8_0_q8(row: np.ndarray, xq: np.ndarray, dx: np.ndarray, xs: np.ndarray) -> float:
    acc = f32(0.0)
    for g in range(row.shape[0] // 34):
        o = g * 34
        s = i32(0)
        for j in range(32):
            s = i32(s + i32(i32(np.int8(row[o + 2 + j])) * i32(xq[32 * g + j])))
        acc += f16_at(row, o) * dx[g] * f32(s)
    return acc


@njit(fastmath=True, cache=True)
def dot_q4_0(row: np.ndarray, x: np.ndarray, xs: np.ndarray) -> float:
    # value (q - 8) * d: d * (sum q x - 8 sum x)
    acc = f32(0.0)
    for g in range(row.shape[0] // 18):
        o = g * 18
        s = f32(0.0)
        for j in range(16):
            q = row[o + 2 + j]
            s += f32(u8(q & 15)) * x[32 * g + j] + f32(u8(q >> 4)) * x[32 * g + 16 + j]
        acc += f16_at(row, o) * (s - f32(8.0) * xs[g])
    return acc


@njit(fastmath=True, cache=True)
def dot_q4_0_q8(row: np.ndarray, xq: np.ndarray, dx: np.ndarray, xs: np.ndarray) -> float:
    acc = f32(0.0)
    for g in range(row.shape[0] // 18):
        o = g * 18
        s = i32(0)
        for j in range(16):
            q = row[o + 2 + j]
            s = i32(s + i32((i32(u8(q & 15)) - 8) * i32(xq[32 * g + j])))
            s = i32(s + i32((i32(u8(q >> 4)) - 8) * i32(xq[32 * g + 16 + j])))
        acc += f16_at(row, o) * dx[g] * f32(s)
    return acc


@njit(fastmath=True, cache=True)
def dot_q5_0(row: np.ndarray, x: np.ndarray, xs: np.ndarray) -> float:
    # 5th bit of element j is bit j of the u32 qh; value (q - 16) * d
    acc = f32(0.0)
    for g in range(row.shape[0] // 22):
        o = g * 22
        qh = u32_at(row, o + 2)
        s = f32(0.0)
        for j in range(16):
            q = row[o + 6 + j]
            lo = u8((q & 15) | (((qh >> j) & 1) << 4))
            hi = u8((q >> 4) | (((qh >> (j + 16)) & 1) << 4))
            s += f32(lo) * x[32 * g + j] + f32(hi) * x[32 * g + 16 + j]
        acc += f16_at(row, o) * (s - f32(16.0) * xs[g])
    return acc


@njit(fastmath=True, cache=True)
def dot_q5_0_q8(row: np.ndarray, xq: np.ndarray, dx: np.ndarray, xs: np.ndarray) -> float:
    acc = f32(0.0)
    for g in range(row.shape[0] // 22):
        o = g * 22
        qh = u32_at(row, o + 2)
        s = i32(0)
        for j in range(16):
            q = row[o + 6 + j]
            lo = i32(u8((q & 15) | (((qh >> j) & 1) << 4))) - 16
            hi = i32(u8((q >> 4) | (((qh >> (j + 16)) & 1) << 4))) - 16
            s = i32(s + i32(lo * i32(xq[32 * g + j])))
            s = i32(s + i32(hi * i32(xq[32 * g + 16 + j])))
        acc += f16_at(row, o) * dx[g] * f32(s)
    return acc


@njit(fastmath=True, cache=True)
def dot_bf16(row: np.ndarray, x: np.ndarray, xs: np.ndarray) -> float:
    # bf16 -> f32 is the bits shifted up 16: widen 32 at a time into a u32 scratch viewed as f32
    bits = np.empty(32, np.uint32)
    vals = bits.view(np.float32)
    acc = f32(0.0)
    for g in range(row.shape[0] // 64):
        o = g * 64
        for j in range(32):
            bits[j] = (np.uint32(row[o + 2 * j]) << 16) | (np.uint32(row[o + 2 * j + 1]) << 24)
        s = f32(0.0)
        for j in range(32):
            s += vals[j] * x[32 * g + j]
        acc += s
    return acc


@njit(fastmath=True, cache=True)
def dot_f16(row: np.ndarray, x: np.ndarray, xs: np.ndarray) -> float:
    # NOTE: scalar conversion per element; F16 experts are rare, this path is for correctness.
    acc = f32(0.0)
    for j in range(row.shape[0] // 2):
        h = np.int64(row[2 * j]) | (np.int64(row[2 * j + 1]) << 8)
        acc += f16_bits_to_f32(h) * x[j]
    return acc
