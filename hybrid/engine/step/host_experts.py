"""The host's half of a decode step captured whole: every MoE layer's routed experts, in layer
order, each started when the GPU raises the layer's ready flag and answered with its done flag
(experts_bridge.py has the buffers and flags, gpu_kernels/handshake.py the GPU's half).

When every layer's experts are packed (fast mode) in one slice of a pool the engine's thread may
drive (one unpinned worker group), all layers run from one numba call
(cpu_kernels/runtime/layer_driver.py): no Python between two layers' kernels. Otherwise a Python loop
does the same per layer through ExpertsOp.run_host (exact mode, or NUMA worker groups).

A step's decode rows may defer experts to the next layer (expert deferral, the experts'
`defer_experts`: cpu_kernels/runtime/deferral.py); every driver here follows that protocol.

A failure (an exception, or the GPU not raising a flag within the timeout) raises every
remaining done flag before it propagates, so the graph runs out instead of spinning.
"""

from __future__ import annotations

import logging
from functools import partial

import numba
import numpy as np

from cpu_kernels.runtime.deferral import deferred_ks
from cpu_kernels.runtime.handshake import set_flag, wait_at_least, wait_equal
from cpu_kernels.runtime.layer_driver import (
    bound_driver,
    is_packed,
    packed_layers,
    runs_one_region,
)
from cpu_kernels.runtime.region_driver import NOT_TOGETHER, drive_in_one_region
from cpu_kernels.simd.clock import cycles_per_us, now_cycles
from hybrid.engine.step.experts_bridge import ExpertsBridge
from hybrid.errors import DeviceLost
from hybrid.ops.experts import ExpertsOp

TIMEOUT_S = 60.0  # the GPU reaches the next layer's flag in microseconds; this is a lost GPU
REGION_START_S = 0.1  # wait_driving's limit (a driver that failed before its region)
log = logging.getLogger("hybrid.engine")


class HostExperts:
    def __init__(self, layers: list[ExpertsOp], bridge: ExpertsBridge) -> None:
        self.layers, self.bridge = layers, bridge
        self._ready, self._done = bridge.ready.numpy(), bridge.done.numpy()
        self._cycles_per_us = cycles_per_us()
        self._timeout = int(TIMEOUT_S * 1e6 * self._cycles_per_us)
        pools = {id(op.pool): op.pool for op in layers}
        self._pool = next(iter(pools.values())) if len(pools) == 1 else None
        self._packed = None
        if self._pool is not None and self._pool.can_run_inline and all(
                op.placed is not None and is_packed(op.placed) for op in layers):
            self._packed = packed_layers([op.placed for op in layers])
        # [L, 2] cycle stamps of each layer's kernel in the last step (one numba call only)
        self.stamps = np.zeros((len(layers), 2), np.int64)
        # the one region's start in the last step: its entry, then each worker's arrival
        self.starts = np.zeros(numba.config.NUMBA_NUM_THREADS + 1, np.int64)
        self._one_region: bool | None = None  # drive_layers' choice until it answers NOT_TOGETHER
        self._bound: tuple | None = None  # prepare's (seq, n, the driver's bound call)
        self._prepared_at: int | None = None  # prepare's cycle stamp, where one region runs
        # a region starts in microseconds: past this, wait_driving stops waiting for it
        self._start_timeout = int(REGION_START_S * 1e6 * self._cycles_per_us)

    def warm_up(self) -> None:
        """Compile the driver (numba; seconds for the one-call driver, which compiles the MoE
        kernel into itself) so no request pays for it: one pass over flags of its own, already
        raised, on one row of zeros."""
        ready, done = np.zeros(len(self.layers), np.int64), np.zeros(len(self.layers), np.int64)
        wait_equal(ready, 0, 0, self._timeout)
        set_flag(done, 0, 0)
        if self._packed is not None:
            self._pool.use_inline_threads()  # the thread count run() drives with
            arrays = tuple(np.zeros_like(a[:1]) for a in self.bridge.host_arrays)
            if self._bind(0, 1, ready, done, arrays)() == NOT_TOGETHER:
                self._without_one_region(0, 1, ready, done, arrays)

    def describe(self) -> str:
        """How a step's CPU experts run (after warm_up, which may have fallen back), for the
        start-up's progress line."""
        if self._packed is None:
            how = "a Python loop over the layers' experts (exact mode or NUMA worker groups)"
        elif self._one_region is False or not runs_one_region(self._packed):
            how = f"one numba call, a parallel kernel a layer, {numba.get_num_threads()} threads"
        else:
            how = f"one numba call in one parallel region, {numba.get_num_threads()} threads"
        deferring = [int(k) for k in self.deferred if k]
        if deferring:
            how += (f"; expert deferral on {len(deferring)} layers ({max(deferring)} of "
                    f"{self.layers[0].top_k} experts a decoding token at most: not exact)")
        return how

    @property
    def one_call(self) -> bool:
        """All layers run from one numba call (else a Python loop over ExpertsOp.run_host)."""
        return self._packed is not None

    @property
    def deferred(self) -> np.ndarray:
        """Per layer, the experts a decode row defers (the ops' `defer_experts`, the last 0:
        cpu_kernels/runtime/deferral.py); read every step."""
        return deferred_ks([op.defer_experts for op in self.layers])

    def prepare(self, seq: int, n: int) -> None:
        """Everything of run(seq, n) before its numba call (the thread count set, the deferral
        read, the arguments bound), so that run enters the driver at once. For a caller that
        starts another Python thread between the two (WholeStep's beside thread): numba's
        thread count calls are ctypes calls, which let go of the GIL, and that thread would
        take it and hold the driver back."""
        if self._packed is None:
            return
        self._pool.use_inline_threads()
        call = self._bind(seq, n, self._ready, self._done, self.bridge.host_arrays)
        self._bound = (seq, n, call)
        self._prepared_at = now_cycles() if call.func is drive_in_one_region else None

    def wait_driving(self) -> None:
        """Return once the prepared run's one parallel region has started (its first worker
        stamped `starts`), or at once where no single region runs it; without the GIL. For a
        thread beside run (WholeStep's): numba takes the GIL to start a parallel region (and
        to end it: the gufunc wrapper in numba/np/ufunc/parallel.py), so a thread running
        Python meanwhile holds the region back, up to sys.getswitchinterval() (5 ms)."""
        if self._prepared_at is not None:
            wait_at_least(self.starts, 1, self._prepared_at, self._start_timeout)

    def run(self, seq: int, n: int) -> None:
        """Answer step `seq`'s flags for its first n rows, every layer (prepared or not);
        raises DeviceLost."""
        try:
            if self._packed is not None:
                if self._bound is None or self._bound[:2] != (seq, n):
                    self.prepare(seq, n)
                call, self._bound = self._bound[2], None
                reached = call()
                if reached == NOT_TOGETHER:
                    reached = self._without_one_region(seq, n, self._ready, self._done,
                                                       self.bridge.host_arrays)
            else:
                reached = self._loop(seq, n)
        except BaseException:
            self._release(seq)
            raise
        if reached < len(self.layers):
            self._release(seq)
            raise DeviceLost(f"the GPU did not hand over MoE layer {reached}'s rows within "
                              f"{TIMEOUT_S:.0f} s; the CUDA device may have failed (see the "
                              f"log), restart the server")

    def timeline(self) -> list[tuple[float, float]]:
        """The last step's per-layer timeline (one-call driver only), microseconds:
        [(waited, busy)] a MoE layer, where `busy` runs from the layer's ready flag seen to its
        done flag raised (the CPU experts) and `waited` from the previous layer's done flag to
        this ready flag (the GPU's work between the two layers and both hand-overs; 0 for the
        first layer, whose wait includes the step's launch)."""
        s = self.stamps.astype(np.float64) / self._cycles_per_us  # [L, 2]
        waited = np.concatenate([[0.0], s[1:, 0] - s[:-1, 1]])
        return list(zip(waited.tolist(), (s[:, 1] - s[:, 0]).tolist(), strict=True))

    def _bind(self, seq: int, n: int, ready, done, arrays: tuple) -> partial:
        """layer_driver.bound_driver over the packed layers, on these flags and (x, ids,
        weights, out) arrays."""
        return bound_driver(ready, done, seq, n, *arrays, self._packed, self._timeout,
                            self.stamps, one_region=self._one_region, deferred=self.deferred,
                            rows=n, starts=self.starts)

    def _without_one_region(self, seq: int, n: int, ready, done, arrays: tuple) -> int:
        """Where the one region's workers did not all run at once (numba's layer gave fewer
        threads): the layer loop, now and from then on."""
        log.warning("the CPU experts' workers did not all start together (OMP_DYNAMIC or a "
                    "thread limit?): each MoE layer runs its own parallel kernel from now on")
        self._one_region = False
        return self._bind(seq, n, ready, done, arrays)()

    def _loop(self, seq: int, n: int) -> int:
        x, ids, w, out = self.bridge.host_arrays
        deferral, deferred = self.bridge.deferral, self.deferred
        deferral.begin_step()
        for layer, op in enumerate(self.layers):
            if not wait_equal(self._ready, layer, seq, self._timeout):
                return layer
            deferral.now(op.run_host, x[:n], ids[:n], w[:n], out[:n], int(deferred[layer]), n)
            set_flag(self._done, layer, seq)
            deferral.later(op.run_host)  # while the GPU runs the next layer
        return len(self.layers)

    def _release(self, seq: int) -> None:
        for layer in range(len(self.layers)):
            set_flag(self._done, layer, seq)
