"""Per-row dispatch on the ggml type id, and the activation preparation both modes share.

The type test happens once per row (not per element), so one compiled kernel serves every mix of
gate/up/down types.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from cpu_kernels.exact.iquant1_dots import iq1_m, iq1_s
from cpu_kernels.exact.iquant4_dots import iq4_nl, iq4_xs, mxfp4
from cpu_kernels.exact.iquant_grid_dots import iq2_s, iq2_xs, iq2_xxs, iq3_s, iq3_xxs
from cpu_kernels.exact.kquant_dots import (
    dot_q4_k,
    dot_q4_k_q8,
    dot_q5_k,
    dot_q5_k_q8,
    dot_q6_k,
    dot_q6_k_q8,
)
from cpu_kernels.exact.legacy_dots import (
    dot_bf16,
    dot_f16,
    dot_q4_0,
    dot_q4_0_q8,
    dot_q5_0,
    dot_q5_0_q8,
    dot_q8_0,
    dot_q8_0_q8,
)
from cpu_kernels.exact.low_kquant_dots import dot_q2_k, dot_q2_k_q8, dot_q3_k, dot_q3_k_q8
from cpu_kernels.formats import qtypes as qt

f32 = np.float32
Q4_K, Q5_K, Q6_K, Q8_0 = qt.Q4_K, qt.Q5_K, qt.Q6_K, qt.Q8_0
Q4_0, Q5_0, BF16, F16 = qt.Q4_0, qt.Q5_0, qt.BF16, qt.F16
Q2_K, Q3_K = qt.Q2_K, qt.Q3_K
IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S = qt.IQ1_S, qt.IQ1_M, qt.IQ2_XXS, qt.IQ2_XS, qt.IQ2_S
IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS = qt.IQ3_XXS, qt.IQ3_S, qt.IQ4_NL, qt.IQ4_XS
MXFP4 = qt.MXFP4


@njit(cache=True)
def row_dot_exact(qtype: int, row: np.ndarray, x: np.ndarray, xs: np.ndarray) -> float:
    """dot(row, x) in exact mode. row: [row_bytes] uint8  x: [C] f32  xs: [C/32] f32"""
    if qtype == Q4_K:
        return dot_q4_k(row, x, xs)
    if qtype == Q6_K:
        return dot_q6_k(row, x, xs)
    if qtype == Q8_0:
        return dot_q8_0(row, x, xs)
    if qtype == Q5_0:
        return dot_q5_0(row, x, xs)
    if qtype == Q5_K:
        return dot_q5_k(row, x, xs)
    if qtype == Q4_0:
        return dot_q4_0(row, x, xs)
    if qtype == Q2_K:
        return dot_q2_k(row, x, xs)
    if qtype == Q3_K:
        return dot_q3_k(row, x, xs)
    if qtype == BF16:
        return dot_bf16(row, x, xs)
    if qtype == F16:
        return dot_f16(row, x, xs)
    return _iquant(qtype, row, x, xs, xs, False)


@njit(cache=True)
def _iquant(qtype: int, row: np.ndarray, x: np.ndarray, dx: np.ndarray, xs: np.ndarray,
            quantized: bool) -> float:
    """A table-coded row's dot (an i-quant's, MXFP4's), both modes: x float32 (exact) or int8 with scales dx (fast)."""
    if qtype == IQ1_S:
        return iq1_s(row, x, dx, xs, quantized)
    if qtype == IQ2_XXS:
        return iq2_xxs(row, x, dx, xs, quantized)
    if qtype == IQ4_XS:
        return iq4_xs(row, x, dx, xs, quantized)
    if qtype == IQ1_M:
        return iq1_m(row, x, dx, xs, quantized)
    if qtype == IQ2_XS:
        return iq2_xs(row, x, dx, xs, quantized)
    if qtype == IQ2_S:
        return iq2_s(row, x, dx, xs, quantized)
    if qtype == IQ3_XXS:
        return iq3_xxs(row, x, dx, xs, quantized)
    if qtype == IQ3_S:
        return iq3_s(row, x, dx, xs, quantized)
    if qtype == IQ4_NL:
        return iq4_nl(row, x, dx, xs, quantized)
    if qtype == MXFP4:
        return mxfp4(row, x, dx, xs, quantized)
    return np.nan


@njit(cache=True)
def row_dot_fast(qtype: int, row: np.ndarray, x: np.ndarray, xq: np.ndarray, dx: np.ndarray,
                 xs: np.ndarray) -> float:
    """dot(row, x) in fast mode (int8 activations xq [C], scales dx [C/32])."""
    if qtype == Q4_K:
        return dot_q4_k_q8(row, xq, dx, xs)
    if qtype == Q6_K:
        return dot_q6_k_q8(row, xq, dx, xs)
    if qtype == Q8_0:
        return dot_q8_0_q8(row, xq, dx, xs)
    if qtype == Q5_0:
        return dot_q5_0_q8(row, xq, dx, xs)
    if qtype == Q5_K:
        return dot_q5_k_q8(row, xq, dx, xs)
    if qtype == Q4_0:
        return dot_q4_0_q8(row, xq, dx, xs)
    if qtype == Q2_K:
        return dot_q2_k_q8(row, xq, dx, xs)
    if qtype == Q3_K:
        return dot_q3_k_q8(row, xq, dx, xs)
    if qtype == BF16:
        return dot_bf16(row, x, xs)
    if qtype == F16:
        return dot_f16(row, x, xs)
    return _iquant(qtype, row, xq, dx, xs, True)


@njit(inline="always", cache=True)
def prepare_row(x: np.ndarray, xs: np.ndarray, xq: np.ndarray, dx: np.ndarray,
                quantize: bool) -> None:
    """Per-32 sums of x into xs; if `quantize`, x as int8 (round to nearest) per 32-group.

    x, xq: [C]  xs, dx: [C/32]
    """
    for g in range(xs.shape[0]):
        s = f32(0.0)
        amax = f32(0.0)
        for j in range(32):
            v = x[32 * g + j]
            s += v
            amax = max(amax, abs(v))
        xs[g] = s
        if quantize:
            d = amax / f32(127.0)
            dx[g] = d
            inv = f32(1.0) / d if d > 0 else f32(0.0)
            for j in range(32):
                xq[32 * g + j] = np.int8(np.rint(x[32 * g + j] * inv))


@njit(parallel=True, cache=True)
def prepare_activations(x: np.ndarray, xs: np.ndarray, xq: np.ndarray, dx: np.ndarray,
                        quantize: bool) -> None:
    """prepare_row for every row. x, xq: [n, C]  xs, dx: [n, C/32]"""
    for t in prange(x.shape[0]):
        prepare_row(x[t], xs[t], xq[t], dx[t], quantize)
