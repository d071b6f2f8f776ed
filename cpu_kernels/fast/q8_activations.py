"""Activations quantized per group of 32 for the `fast` kernels: int8, or int16 as two int8 planes.

`fast` mode computes dot(exact weights, xq * dx): x rounded to integers per 32-group, the weights
untouched. Every group-offset term (Q4_K mins, Q6_K's -32, Q8_0's signed codes) is applied to
sums of the quantized x, so the result is exactly that dot up to float32 rounding.

With 2 planes the integer is v = 256 * hi + lo, |v| <= 127 * 256, hi and lo both int8
(lo in [-128, 127]): a kernel computes dpbusd(dpbusd(0, q, hi) << 8, q, lo). The error of one
int8 plane (~0.5% per product) is the bulk of `fast` mode's error; two planes make it ~1e-4.

x: [n, C] f32 -> xq: [P * n, C] int8 (plane p of row t at row p * n + t)  dx: [n, C/32] f32
xqsum: [n, C/32] f32 (dx * sum v)  xsum16: [n, C/16] int32 (sums of 16 consecutive v: the
offset terms of the 16-column sub-blocks of Q6_K, Q3_K and Q2_K, two per 32-group)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, prange

f32 = np.float32
i32 = np.int32


@dataclass(frozen=True)
class Q8Activations:
    """Integer activations per 32-group (1 or 2 int8 planes) and the sums the kernels need."""

    xq: np.ndarray  # [P * n, C] int8
    dx: np.ndarray  # [n, C/32] f32
    xqsum: np.ndarray  # [n, C/32] f32
    xsum16: np.ndarray  # [n, C/16] int32

    @classmethod
    def empty(cls, n: int, cols: int, planes: int = 1) -> Q8Activations:
        return cls(np.empty((planes * n, cols), np.int8), np.empty((n, cols // 32), np.float32),
                   np.empty((n, cols // 32), np.float32), np.empty((n, cols // 16), np.int32))

    @classmethod
    def of(cls, x: np.ndarray, planes: int = 1) -> Q8Activations:
        """Quantize x [n, C] float32 (C a multiple of 32)."""
        act = cls.empty(*x.shape, planes=planes)
        quantize_rows(x, act.xq, act.dx, act.xqsum, act.xsum16)
        return act

    @property
    def planes(self) -> int:
        return self.xq.shape[0] // max(self.dx.shape[0], 1)

    @property
    def lo_offset(self) -> int:
        """Flat element offset from a row's hi plane to its lo plane; 0 for one plane."""
        return self.dx.shape[0] * self.xq.shape[1] if self.planes == 2 else 0


@njit(inline="always", cache=True)
def quantize_row(x: np.ndarray, xq: np.ndarray, xlo: np.ndarray, dx: np.ndarray,
                 xqsum: np.ndarray, xsum16: np.ndarray) -> None:
    """One row: x [C] f32 -> xq [C] (hi plane), xlo [C] (lo plane, or [0] for one plane),
    dx [C/32], xqsum [C/32], xsum16 [C/16]."""
    two = xlo.shape[0] > 0
    top = f32(127.0 * 256.0) if two else f32(127.0)
    for g in range(dx.shape[0]):
        amax = f32(0.0)
        for j in range(32):
            amax = max(amax, abs(x[32 * g + j]))
        d = amax / top
        inv = f32(1.0) / d if d > 0 else f32(0.0)
        total = i32(0)
        for half in range(2):
            s16 = i32(0)
            for j in range(32 * g + 16 * half, 32 * g + 16 * half + 16):
                v = i32(np.rint(x[j] * inv))
                if two:
                    hi = i32((v + 128) >> 8)
                    xq[j] = np.int8(hi)
                    xlo[j] = np.int8(v - 256 * hi)
                else:
                    xq[j] = np.int8(v)
                s16 = i32(s16 + v)
            xsum16[2 * g + half] = s16
            total = i32(total + s16)
        dx[g] = d
        xqsum[g] = d * f32(total)


@njit(parallel=True, cache=True)
def quantize_rows(x: np.ndarray, xq: np.ndarray, dx: np.ndarray, xqsum: np.ndarray,
                  xsum16: np.ndarray) -> None:
    """quantize_row for every row of x [n, C]; xq [P * n, C] sets the number of planes P."""
    n = x.shape[0]
    for t in prange(n):
        lo = xq[n + t] if xq.shape[0] > n else xq[t, :0]
        quantize_row(x[t], xq[t], lo, dx[t], xqsum[t], xsum16[t])


def dequantize_ref(act: Q8Activations) -> np.ndarray:
    """The float64 x that `fast` kernels multiply by: v * dx. [n, C]"""
    n, cols = act.dx.shape[0], act.xq.shape[1]
    v = act.xq[:n].astype(np.float64)
    if act.planes == 2:
        v = 256 * v + act.xq[n:]
    return (v.reshape(n, -1, 32) * act.dx[:, :, None]).reshape(n, cols)
