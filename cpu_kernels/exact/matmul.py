"""Quantized matrix products out = x @ W.T on one matrix of a QuantMatrix stack."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from cpu_kernels.exact.rowdot import prepare_activations, row_dot_exact, row_dot_fast
from cpu_kernels.formats.weights import QuantMatrix

MODES = ("exact", "fast")


@njit(parallel=True, cache=True)
def _matmul(qtype: int, w: np.ndarray, x: np.ndarray, xs: np.ndarray, xq: np.ndarray,
            dx: np.ndarray, fast: bool, out: np.ndarray) -> None:
    # w: [R, row_bytes]  x, xq: [n, C]  xs, dx: [n, C/32]  out: [n, R]
    for r in prange(w.shape[0]):
        row = w[r]
        for t in range(x.shape[0]):
            if fast:
                out[t, r] = row_dot_fast(qtype, row, x[t], xq[t], dx[t], xs[t])
            else:
                out[t, r] = row_dot_exact(qtype, row, x[t], xs[t])


def check_mode(mode: str) -> bool:
    """True for `fast`; raises on an unknown mode name."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}, expected one of {MODES}")
    return mode == "fast"


def quant_matmul(x: np.ndarray, w: QuantMatrix, out: np.ndarray, expert: int = 0,
                 mode: str = "exact") -> None:
    """out[n, R] = x[n, C] @ W[expert].T, W given as GGUF blocks; writes into `out`."""
    fast = check_mode(mode)
    n, cols = x.shape
    if cols != w.cols or out.shape != (n, w.rows):
        raise ValueError(f"x {x.shape} @ W {w.shape[1:]}.T does not fit out {out.shape}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    xs = np.empty((n, cols // 32), np.float32)
    # exact mode passes empty xq/dx: the kernel never reads them
    xq = np.empty((n, cols) if fast else (n, 0), np.int8)
    dx = np.empty((n, cols // 32) if fast else (n, 0), np.float32)
    prepare_activations(x, xs, xq, dx, fast)
    _matmul(w.qtype, w.blocks[expert], x, xs, xq, dx, fast, out)
