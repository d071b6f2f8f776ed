"""Decode time from where the experts live: a fixed part (attention, dense layers, the head,
the step's overheads), the routed experts' bytes the CPU reads per step over its read rate, and
a cost per MoE layer that still hands rows to the CPU (the copies out and back, the pool's start
and barrier, the GPU waiting): a layer whose experts all moved to the GPU pays none of it.
The constants are fitted to measured decodes (no experts on the GPU, the most the budget holds,
and with `hybrid tune --measure` whole layers in half the budget: a layer count apart), so every
other placement's time is a prediction to check. Why the third point: fitted to the first two
alone, the per-layer cost hides in the per-GB one, and whole layers are predicted slower than
they run (docs/tuning.md). The GPU-held experts' own time is left in the fixed part: they are
read at the GPU's bandwidth, an order of magnitude faster than the CPU's.

`DecodeModel.fit(points, fixed_ms)`: with `fixed_ms` given (`hybrid tune --measure` passes the
tuned placement's step timed with its CPU experts answered at once, measure.fixed_step_ms), the
fixed part is that value, not an intercept extrapolated from the points, and only the per-GB
(and per-layer) costs are fitted, to the points' time above it. That step still makes its
layers' hand-overs, so the fixed part holds the tuned placement's per-layer hand-over cost and
the fitted per-layer cost only the rest.
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


def cpu_layers_per_step(layers: tuple[int, ...], sizes: ExpertBytes,
                        on_gpu: dict[int, list[int]], num_experts: int) -> int:
    """MoE layers that keep some routed experts on the CPU."""
    return sum(1 for layer in layers if layer in sizes.cpu_layers
               and len(set(on_gpu.get(layer, ()))) < num_experts)


@dataclass(frozen=True)
class DecodeModel:
    fixed_ms: float
    ms_per_gb: float  # CPU expert time per GB read
    ms_per_layer: float = 0.0  # per MoE layer with CPU experts left
    fixed_measured: bool = False  # fixed_ms was measured (fit's fixed_ms), not fitted

    @classmethod
    def fit(cls, points: list[tuple[float, int, float]],
            fixed_ms: float | None = None) -> DecodeModel:
        """From measured (CPU bytes per step, MoE layers with CPU work, ms per step) points:
        least squares, the per-layer cost only where there are 3 points or more and their layer
        counts differ. fixed_ms: the fixed part as measured; the other costs are then fitted to
        each point's ms - fixed_ms (else the fixed part is the fit's intercept)."""
        x = np.array([[1.0, b / 1e9, n] for b, n, _ in points])  # [P, 3]
        y = np.array([ms for _, _, ms in points])  # [P]
        if np.ptp(x[:, 1]) * 1e9 < 1:
            raise HybridError("the calibration decodes read the same CPU bytes: give the GPU a "
                              "budget that holds some experts")
        if len(points) < 3 or np.ptp(x[:, 2]) == 0:
            x = x[:, :2]
        if fixed_ms is None:
            coef = np.linalg.lstsq(x, y, rcond=None)[0]
        else:
            coef = np.concatenate([[fixed_ms], np.linalg.lstsq(x[:, 1:], y - fixed_ms,
                                                                rcond=None)[0]])
        return cls(float(coef[0]), float(coef[1]), float(coef[2]) if len(coef) > 2 else 0.0,
                   fixed_measured=fixed_ms is not None)

    @property
    def is_noise(self) -> bool:
        """Reading more bytes on the CPU cannot make a step faster: a cost per GB <= 0 says the
        calibration decodes measured noise, not the machine."""
        return self.ms_per_gb <= 0

    def ms(self, cpu_bytes: float, cpu_layers: int = 0) -> float:
        return self.fixed_ms + self.ms_per_gb * cpu_bytes / 1e9 + self.ms_per_layer * cpu_layers
