"""One quantized GGUF row times a tile of up to 4 activation rows, dispatched on the ggml type id.

The kernels on GGUF blocks as stored: `exact` mode (float32 row dots), and `fast` mode for types
without a packed layout (scalar int8 dots of kquant_dots/legacy_dots with one activation plane,
the exact float32 dots with two: xs then holds the float sums of x). Packable types run `fast`
on packed weights instead (packed_moe). The i-quants come decoded (`decoded`: the caller ran
iquant_decode.decode_row into w64/sc16 once for all its tiles). The result is 4 floats, of
which the first `nt` count.

row: [row_bytes] uint8  x: [n, C] f32  xs: [n, C/32] f32 (exact sums)
xq: [n, C] int8 (lo_off != 0: two planes, unused here)  dx, xqsum: [n, C/32] f32 (fast mode)
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels.exact.iquant_decode import dot_decoded, dot_decoded_q8
from cpu_kernels.exact.rowdot import row_dot_exact, row_dot_fast

f32 = np.float32
TILE = 4


@njit(inline="always", cache=True)
def _one(fast: bool, qtype: int, row: np.ndarray, x: np.ndarray, xs: np.ndarray,
         xq: np.ndarray, lo_off: int, dx: np.ndarray, xqsum: np.ndarray, t: int,
         decoded: bool, w64: np.ndarray, sc16: np.ndarray) -> float:
    if decoded:
        if fast and lo_off == 0:
            return f32(dot_decoded_q8(w64, sc16, xq[t], dx[t], x.shape[1]))
        return f32(dot_decoded(w64, sc16, x[t], x.shape[1]))
    if fast and lo_off == 0:
        # xqsum as the "exact sums": offsets then apply to the quantized x
        return f32(row_dot_fast(qtype, row, x[t], xq[t], dx[t], xqsum[t]))
    return f32(row_dot_exact(qtype, row, x[t], xs[t]))


@njit(cache=True)
def tile_dot(fast: bool, qtype: int, row: np.ndarray, x: np.ndarray, xs: np.ndarray,
             xq: np.ndarray, lo_off: int, dx: np.ndarray, xqsum: np.ndarray,
             t0: int, t1: int, t2: int, t3: int, nt: int, decoded: bool, w64: np.ndarray,
             sc16: np.ndarray) -> tuple[float, float, float, float]:
    """dot(row, activation row t_i) for i < nt."""
    r0 = _one(fast, qtype, row, x, xs, xq, lo_off, dx, xqsum, t0, decoded, w64, sc16)
    r1 = f32(0.0)
    r2 = f32(0.0)
    r3 = f32(0.0)
    if nt > 1:
        r1 = _one(fast, qtype, row, x, xs, xq, lo_off, dx, xqsum, t1, decoded, w64, sc16)
    if nt > 2:
        r2 = _one(fast, qtype, row, x, xs, xq, lo_off, dx, xqsum, t2, decoded, w64, sc16)
    if nt > 3:
        r3 = _one(fast, qtype, row, x, xs, xq, lo_off, dx, xqsum, t3, decoded, w64, sc16)
    return r0, r1, r2, r3
