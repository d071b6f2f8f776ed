"""The machine's read bandwidth: the bound the routed experts run against (a multithreaded
float32 sum over a buffer bigger than the caches, numba's threads)."""

from __future__ import annotations

import time

import numpy as np
from numba import njit, prange


@njit(parallel=True, fastmath=True, nogil=True, cache=True)
def sum_chunks(buf: np.ndarray, part: np.ndarray) -> None:
    """part[p] = sum of buf[p] (buf [P, L] float32, part [P]) on numba's threads, the GIL
    released (another thread may drive the GPU meanwhile: scripts/probe_dram_share.py)."""
    for p in prange(buf.shape[0]):
        s = np.float32(0.0)
        for j in range(buf.shape[1]):
            s += buf[p, j]
        part[p] = s


def read_bandwidth(nbytes: int, repeats: int = 3) -> float:
    """Best GB/s of `repeats` sums over an `nbytes` buffer (after one warm-up pass)."""
    buf = np.ones((64, nbytes // 256), np.float32)
    part = np.empty(64, np.float32)
    sum_chunks(buf, part)
    best = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        sum_chunks(buf, part)
        best = max(best, buf.nbytes / (time.perf_counter() - t) / 1e9)
    return best
