"""Expert deferral (KTransformers, SOSP'25): a decode row's k lowest-weighted routed experts of
MoE layer l are computed after the layer's output went back, while the GPU runs layer l+1's
attention, and their weighted sum joins layer l+1's routed output.

For MoE layer l of a step, `carry` holding layer l-1's deferred sum (nothing at the first):
    now, later = split_deferred(ids, weights, k_l, rows)
    out   = MoE(x, now, weights) (+ carry, where one is held)    -> handed back (done flag)
    carry = MoE(x, later, weights)                                if k_l > 0
A step's last MoE layer defers nothing (no layer after it would add the sum), so every
deferred expert is counted exactly once, one layer late. Only rows [0, rows) are split (a
step's decode rows); the others keep all K slots now and have nothing deferred.

Slots whose experts are held elsewhere (a GPU's `gpu_experts`) come as negative ids, are
computed there in their own layer and never deferred: a row defers the k lowest-weighted of
its experts on the CPU, or all of them where it has fewer than k (none where it has none).

The split is a pure function of a row's ids and weights, so a row's result never depends on
the batch it runs in, and every driver (this module's Python `Deferral`, layer_driver's loop,
region_driver's one region) computes the same sums in the same order: out's elements are
first summed over the immediate experts (zero where none), then the carry is added.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

f32 = np.float32


@njit(nogil=True, cache=True)
def split_deferred(ids, weights, k, rows, now, later) -> None:
    """ids [N, K] int64, weights [N, K] f32 -> now, later [N, K] int64 (negative: no expert).
    Rows < rows: the k valid slots of smallest weight (a tie defers the later slot) move to
    `later`, the rest stay in `now`; other rows: all in `now`. Negative ids (slots served
    elsewhere) are never deferred."""
    n, top_k = ids.shape
    for r in range(n):
        for s in range(top_k):
            now[r, s] = ids[r, s]
            later[r, s] = -1
        if r >= rows:
            continue
        for _ in range(k):
            pick = -1
            for s in range(top_k):
                if now[r, s] >= 0 and (pick < 0 or weights[r, s] <= weights[r, pick]):
                    pick = s
            if pick < 0:
                break
            later[r, pick] = now[r, pick]
            now[r, pick] = -1


def split_deferred_reference(ids: np.ndarray, weights: np.ndarray, k: int, rows: int
                             ) -> tuple[np.ndarray, np.ndarray]:
    """split_deferred in plain numpy: the k smallest (weight, -slot) of each row < rows."""
    now, later = ids.copy(), np.full_like(ids, -1)
    for r in range(min(rows, ids.shape[0])):
        valid = [s for s in range(ids.shape[1]) if ids[r, s] >= 0]
        for s in sorted(valid, key=lambda s: (float(weights[r, s]), -s))[:k]:
            later[r, s], now[r, s] = ids[r, s], -1
    return now, later


MoERun = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]  # (x, ids, w, out)


class Deferral:
    """A step's deferred sum between MoE layers, for drivers that run a layer from Python
    (the eager bridge, HostExperts' layer loop). Only the deferring rows :rows are kept and
    run twice; the buffers grow to the most rows seen.

        begin_step()
        per layer: now(run, x, ids, w, out, k, rows)   -> out holds what goes back
                   later(run)                           after it went back
    """

    def __init__(self, hidden: int, top_k: int) -> None:
        self.hidden, self.top_k = hidden, top_k
        self.held = 0  # rows of carry holding a sum not yet added
        self._pending = 0  # rows of a deferred part still to run (later)
        self._grow(0)

    def _grow(self, rows: int) -> None:
        h, k = self.hidden, self.top_k
        self.carry = np.zeros((rows, h), f32)  # [R, H] the last layer's deferred sum
        self.x = np.zeros((rows, h), f32)  # [R, H] its inputs, kept: the GPU may write the
        self.w = np.zeros((rows, k), f32)  # [R, K] next layer's into x and w meanwhile
        self.now_ids = np.zeros((rows, k), np.int64)
        self.later_ids = np.zeros((rows, k), np.int64)

    def begin_step(self) -> None:
        self.held = self._pending = 0

    def now(self, run: MoERun, x: np.ndarray, ids: np.ndarray, w: np.ndarray, out: np.ndarray,
            k: int, rows: int) -> None:
        """The layer's immediate experts into out [n, H] (x [n, H], ids/w [n, K]), plus the
        previous layer's deferred sum; keeps what `later` needs when k > 0 and rows > 0."""
        rows = min(rows, x.shape[0]) if k > 0 else 0
        if rows > self.x.shape[0]:
            if self.held:
                raise RuntimeError("deferral rows grew within a step")
            self._grow(rows)
        if rows:
            head = ids[:rows]
            ids = ids.copy()
            split_deferred(head, w[:rows], k, rows, ids[:rows], self.later_ids[:rows])
            self.x[:rows], self.w[:rows] = x[:rows], w[:rows]
        self._pending = rows
        run(x, ids, w, out)
        if self.held:
            out[:self.held] += self.carry[:self.held]
        self.held = 0

    def later(self, run: MoERun) -> None:
        """The deferred experts of the layer `now` last ran into carry (no-op if none)."""
        n, self._pending = self._pending, 0
        if n:
            run(self.x[:n], self.later_ids[:n], self.w[:n], self.carry[:n])
            self.held = n


def deferred_ks(ks: list[int]) -> np.ndarray:
    """Per-layer deferral [L] int64 as a step runs it: the last layer's forced to 0."""
    out = np.array(ks, np.int64)
    if len(out):
        out[-1] = 0
    return out
