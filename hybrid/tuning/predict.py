"""Decode time from where the experts live: a fixed part (attention, dense layers, the head,
the step's overheads) plus the routed experts' bytes the CPU reads per step over its read
rate. Both constants are fitted to two measured decodes (no experts on the GPU, and the most
the budget holds), so every other placement's time is a prediction to check (`hybrid tune
--measure`). The GPU-held experts' own time is left in the fixed part: they are read at the
GPU's bandwidth, an order of magnitude faster than the CPU's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hybrid.errors import HybridError
from hybrid.tuning.planner import ExpertBytes, step_probability


def cpu_bytes_per_step(freq: np.ndarray, layers: tuple[int, ...], sizes: ExpertBytes,
                       on_gpu: dict[int, list[int]], batch: int = 1) -> float:
    """Expected bytes of routed experts the CPU reads in one decode step of `batch` tokens."""
    p = step_probability(freq, batch)
    total = 0.0
    for i, layer in enumerate(layers):
        if layer not in sizes.cpu_layers:
            continue
        mask = np.ones(freq.shape[1], bool)
        mask[on_gpu.get(layer, [])] = False
        total += float(p[i, mask].sum()) * sizes.per_layer[layer]
    return total


@dataclass(frozen=True)
class DecodeModel:
    fixed_ms: float
    ms_per_gb: float  # CPU expert time per GB read

    @classmethod
    def fit(cls, a: tuple[float, float], b: tuple[float, float]) -> DecodeModel:
        """From two (CPU bytes per step, measured ms per step) points."""
        (x0, y0), (x1, y1) = a, b
        if abs(x1 - x0) < 1:
            raise HybridError("the two calibration decodes read the same CPU bytes: give the "
                              "GPU a budget that holds some experts")
        slope = (y1 - y0) / (x1 - x0) * 1e9
        return cls(y0 - slope * x0 / 1e9, slope)

    def ms(self, cpu_bytes: float) -> float:
        return self.fixed_ms + self.ms_per_gb * cpu_bytes / 1e9

    def tokens_per_s(self, cpu_bytes: float, batch: int = 1) -> float:
        return 1000.0 * batch / self.ms(cpu_bytes)
