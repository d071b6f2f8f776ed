"""Row dot products on K-quant blocks (Q4_K, Q5_K, Q6_K): 256 elements per block.

Each function computes dot(row, x) for one quantized row and one activation row, reading the GGUF
bytes directly. `exact`: float32 math on the exact dequantized weights (the per-sub-block offset
is applied through `xs`, the float32 sums of x per 32-group, which is the same sum regrouped).
`fast` (`*_q8`): x quantized to int8 per 32-group (`xq`, scale `dx`), integer dot products per
sub-block, float scales per sub-block; offsets still use the exact sums `xs`.
row: [row_bytes] uint8  x: [C] f32  xq: [C] int8  dx, xs: [C/32] f32
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels.formats.scalars import f16_at, k4_scale_min

f32 = np.float32
i32 = np.int32
u8 = np.uint8


@njit(fastmath=True, cache=True)
def dot_q4_k(row: np.ndarray, x: np.ndarray, xs: np.ndarray) -> float:
    acc = f32(0.0)
    for b in range(row.shape[0] // 144):
        o = b * 144
        d = f16_at(row, o)
        dmin = f16_at(row, o + 2)
        for c in range(4):
            sc0, m0 = k4_scale_min(row, o + 4, 2 * c)
            sc1, m1 = k4_scale_min(row, o + 4, 2 * c + 1)
            qo = o + 16 + 32 * c
            xb = b * 256 + 64 * c
            s0 = f32(0.0)
            s1 = f32(0.0)
            for j in range(32):
                q = row[qo + j]
                s0 += f32(u8(q & 15)) * x[xb + j]
                s1 += f32(u8(q >> 4)) * x[xb + 32 + j]
            g = xb >> 5
            acc += d * (f32(sc0) * s0 + f32(sc1) * s1)
            acc -= dmin * (f32(m0) * xs[g] + f32(m1) * xs[g + 1])
    return acc


@njit(fastmath=True, cache=True)
def dot_q4_k_q8(row: np.ndarray, xq: np.ndarray, dx: np.ndarray, xs: np.ndarray) -> float:
    acc = f32(0.0)
    for b in range(row.shape[0] // 144):
        o = b * 144
        d = f16_at(row, o)
        dmin = f16_at(row, o + 2)
        for c in range(4):
            sc0, m0 = k4_scale_min(row, o + 4, 2 * c)
            sc1, m1 = k4_scale_min(row, o + 4, 2 * c + 1)
            qo = o + 16 + 32 * c
            xb = b * 256 + 64 * c
            s0 = i32(0)
            s1 = i32(0)
            for j in range(32):
                q = row[qo + j]
                s0 = i32(s0 + i32((i32(u8(q & 15)) - 8) * i32(xq[xb + j])))
                s1 = i32(s1 + i32((i32(u8(q >> 4)) - 8) * i32(xq[xb + 32 + j])))
            g = xb >> 5
            acc += d * (f32(sc0) * dx[g] * f32(s0) + f32(sc1) * dx[g + 1] * f32(s1))
            # centred q (q - 8 above): the offset d sc 8 - dmin m is applied to the exact sums
            acc += (f32(8.0) * d * f32(sc0) - dmin * f32(m0)) * xs[g]
            acc += (f32(8.0) * d * f32(sc1) - dmin * f32(m1)) * xs[g + 1]
    return acc


@njit(fastmath=True, cache=True)
def dot_q5_k(row: np.ndarray, x: np.ndarray, xs: np.ndarray) -> float:
    acc = f32(0.0)
    for b in range(row.shape[0] // 176):
        o = b * 176
        d = f16_at(row, o)
        dmin = f16_at(row, o + 2)
        for c in range(4):
            sc0, m0 = k4_scale_min(row, o + 4, 2 * c)
            sc1, m1 = k4_scale_min(row, o + 4, 2 * c + 1)
            qo = o + 48 + 32 * c
            xb = b * 256 + 64 * c
            s0 = f32(0.0)
            s1 = f32(0.0)
            for j in range(32):
                q = row[qo + j]
                h = row[o + 16 + j] >> (2 * c)
                s0 += f32(u8((q & 15) | ((h & 1) << 4))) * x[xb + j]
                s1 += f32(u8((q >> 4) | ((h & 2) << 3))) * x[xb + 32 + j]
            g = xb >> 5
            acc += d * (f32(sc0) * s0 + f32(sc1) * s1)
            acc -= dmin * (f32(m0) * xs[g] + f32(m1) * xs[g + 1])
    return acc


@njit(fastmath=True, cache=True)
def dot_q5_k_q8(row: np.ndarray, xq: np.ndarray, dx: np.ndarray, xs: np.ndarray) -> float:
    acc = f32(0.0)
    for b in range(row.shape[0] // 176):
        o = b * 176
        d = f16_at(row, o)
        dmin = f16_at(row, o + 2)
        for c in range(4):
            sc0, m0 = k4_scale_min(row, o + 4, 2 * c)
            sc1, m1 = k4_scale_min(row, o + 4, 2 * c + 1)
            qo = o + 48 + 32 * c
            xb = b * 256 + 64 * c
            s0 = i32(0)
            s1 = i32(0)
            for j in range(32):
                q = row[qo + j]
                h = row[o + 16 + j] >> (2 * c)
                q0 = i32(u8((q & 15) | ((h & 1) << 4))) - 16
                q1 = i32(u8((q >> 4) | ((h & 2) << 3))) - 16
                s0 = i32(s0 + i32(q0 * i32(xq[xb + j])))
                s1 = i32(s1 + i32(q1 * i32(xq[xb + 32 + j])))
            g = xb >> 5
            acc += d * (f32(sc0) * dx[g] * f32(s0) + f32(sc1) * dx[g + 1] * f32(s1))
            acc += (f32(16.0) * d * f32(sc0) - dmin * f32(m0)) * xs[g]
            acc += (f32(16.0) * d * f32(sc1) - dmin * f32(m1)) * xs[g + 1]
    return acc


# Q6_K block: ql[128] @0, qh[64] @128, int8 scales[16] @192, f16 d @208. Each half of 128 elements
# uses ql[64], qh[32], scales[8]; element l + 32k (k = 0..3) of a half has scale 2k + l // 16.
@njit(fastmath=True, cache=True)
def dot_q6_k(row: np.ndarray, x: np.ndarray, xs: np.ndarray) -> float:
    acc = f32(0.0)
    for b in range(row.shape[0] // 210):
        o = b * 210
        d = f16_at(row, o + 208)
        for n in range(2):
            ql = o + 64 * n
            qh = o + 128 + 32 * n
            sc = o + 192 + 8 * n
            xb = b * 256 + 128 * n
            for half in range(2):
                s1 = f32(0.0)
                s2 = f32(0.0)
                s3 = f32(0.0)
                s4 = f32(0.0)
                for l in range(16 * half, 16 * half + 16):
                    a = row[ql + l]
                    a2 = row[ql + l + 32]
                    h = row[qh + l]
                    s1 += f32(i32(u8((a & 15) | ((h & 3) << 4))) - 32) * x[xb + l]
                    s2 += f32(i32(u8((a2 & 15) | ((h & 12) << 2))) - 32) * x[xb + l + 32]
                    s3 += f32(i32(u8((a >> 4) | (h & 48))) - 32) * x[xb + l + 64]
                    s4 += f32(i32(u8((a2 >> 4) | ((h & 192) >> 2))) - 32) * x[xb + l + 96]
                s = sc + half
                acc += d * (f32(np.int8(row[s])) * s1 + f32(np.int8(row[s + 2])) * s2
                            + f32(np.int8(row[s + 4])) * s3 + f32(np.int8(row[s + 6])) * s4)
    return acc


@njit(fastmath=True, cache=True)
def dot_q6_k_q8(row: np.ndarray, xq: np.ndarray, dx: np.ndarray, xs: np.ndarray) -> float:
    acc = f32(0.0)
    for b in range(row.shape[0] // 210):
        o = b * 210
        d = f16_at(row, o + 208)
        for n in range(2):
            ql = o + 64 * n
            qh = o + 128 + 32 * n
            sc = o + 192 + 8 * n
            xb = b * 256 + 128 * n
            g = xb >> 5
            for half in range(2):
                s1 = i32(0)
                s2 = i32(0)
                s3 = i32(0)
                s4 = i32(0)
                for l in range(16 * half, 16 * half + 16):
                    a = row[ql + l]
                    a2 = row[ql + l + 32]
                    h = row[qh + l]
                    q1 = i32(u8((a & 15) | ((h & 3) << 4))) - 32
                    q2 = i32(u8((a2 & 15) | ((h & 12) << 2))) - 32
                    q3 = i32(u8((a >> 4) | (h & 48))) - 32
                    q4 = i32(u8((a2 >> 4) | ((h & 192) >> 2))) - 32
                    s1 = i32(s1 + i32(i32(q1) * i32(xq[xb + l])))
                    s2 = i32(s2 + i32(i32(q2) * i32(xq[xb + l + 32])))
                    s3 = i32(s3 + i32(i32(q3) * i32(xq[xb + l + 64])))
                    s4 = i32(s4 + i32(i32(q4) * i32(xq[xb + l + 96])))
                s = sc + half
                acc += d * (f32(np.int8(row[s])) * dx[g] * f32(s1)
                            + f32(np.int8(row[s + 2])) * dx[g + 1] * f32(s2)
                            + f32(np.int8(row[s + 4])) * dx[g + 2] * f32(s3)
                            + f32(np.int8(row[s + 6])) * dx[g + 3] * f32(s4))
    return acc
