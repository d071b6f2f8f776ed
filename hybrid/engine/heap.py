"""Python's cyclic collector in a serving process: freeze what start-up left behind.

A full (generation-2) collection walks every object the collector tracks. After start-up that
is mostly library code (torch, transformers, numba, sympy: ~440K functions, tuples, dicts, cells
for the demo model), and one walk costs 0.4 s on a 2-core CI box. Python starts one whenever
enough new objects have survived, so a stream's next token could wait for it: a host stall in one
step, not tied to any step kind. `gc.freeze()` moves everything alive now into a permanent
generation that collections skip; later collections walk only what serving allocated.

Frozen objects are still freed by reference counting; only garbage cycles among them would stay.
So only a process that holds one engine for its life freezes (`hybrid serve`, `hybrid chat`, the
benchmarks), never library code that builds engines again and again (the tests).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass


def freeze_start_up_heap() -> int:
    """Collect once, then freeze every surviving object; returns how many were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@dataclass
class CollectorPauses:
    """Time the collector takes, taken out piecewise (a benchmark calls `take()` per step).

    Collections run on whatever Python thread allocates; this hears all of them (gc.callbacks)."""

    ms: float = 0.0
    generation: int = -1  # the oldest generation collected since the last take(); -1 none
    _start: float = 0.0

    def __enter__(self) -> None:  # `with pauses:` listens; take() reads
        gc.callbacks.append(self._hear)

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._hear)

    def _hear(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.ms += (time.perf_counter() - self._start) * 1e3
            self.generation = max(self.generation, info["generation"])

    def take(self) -> tuple[float, int]:
        """(ms collecting, oldest generation) since the last call."""
        out = (self.ms, self.generation)
        self.ms, self.generation = 0.0, -1
        return out
