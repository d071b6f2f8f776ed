"""A second thread in the GPU's place for the CPU experts' drivers: per layer it writes the
layer's rows into the shared buffers, raises the ready flag, waits for the done flag and
keeps the output, as a decode step's CUDA graph does through mapped pinned memory."""

from __future__ import annotations

import threading

import numpy as np

from cpu_kernels.runtime.handshake import set_flag, wait_equal

SECOND = 3_000_000_000  # TSC cycles: ample on any machine


class FakeGpu:
    """buffers: (x [T, H], ids [T, K], w [T, K], out [T, H]); ready/done: [L] int64 flags.
    `poison`: overwrite x and w with NaN as soon as a layer's output is taken (the next
    layer's rows arrive at once), for drivers that must have kept what they still need."""

    def __init__(self, buffers: tuple, ready: np.ndarray, done: np.ndarray,
                 poison: bool = False) -> None:
        self.x, self.ids, self.w, self.out = buffers
        self.ready, self.done, self.poison = ready, done, poison
        # both flag functions compiled (or read from numba's cache) here, before any thread
        # runs: no compile may run inside one side while the other side's timed wait runs
        scratch = np.zeros(1, np.int64)
        set_flag(scratch, 0, 1)
        assert wait_equal(scratch, 0, 1, SECOND)

    def start(self, seq: int, inputs: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        """Run step `seq` over `inputs` (x, ids, w of each layer's n rows) in a thread."""
        self.got: list[np.ndarray] = []
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(seq, inputs))
        self.thread.start()

    def join(self) -> list[np.ndarray]:
        """-> each layer's output rows; raises what the thread raised."""
        self.thread.join()
        if self.errors:
            raise self.errors[0]
        return self.got

    def _run(self, seq: int, inputs: list) -> None:
        try:
            for layer, (xi, ii, wi) in enumerate(inputs):
                n = len(xi)
                self.x[:n], self.ids[:n], self.w[:n] = xi, ii, wi
                set_flag(self.ready, layer, seq)
                assert wait_equal(self.done, layer, seq, 10 * SECOND)
                self.got.append(self.out[:n].copy())
                if self.poison:
                    self.x[:n], self.w[:n] = np.nan, np.nan
        except BaseException as err:  # noqa: BLE001 - raised by join
            self.errors.append(err)
