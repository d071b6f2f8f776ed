"""What `hybrid tune` takes and gives: its options, the placements it compares and its result
(tune.py runs it; report.py and plots.py show the result)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hybrid.model.kv_budget import DEFAULT_CACHE_LENS
from hybrid.tuning.planner import ExpertBytes
from hybrid.tuning.predict import DecodeModel


@dataclass
class Placement:
    """One candidate: what it puts on the GPU and what it is predicted (and measured) to do."""

    name: str
    gpu_bytes: int
    hit_rate: float
    cpu_bytes: float  # routed expert bytes the CPU reads per decode step
    cpu_layers: int = 0  # MoE layers that keep CPU experts
    calibration: bool = False  # measured only to fit the time model (not a candidate)
    rules: Path | None = None
    predicted_ms: float | None = None
    measured_ms: float | None = None  # the median of `samples`
    samples: list[float] = field(default_factory=list)  # ms a step, one per round


@dataclass
class TuneResult:
    rules: Path
    free_bytes: int
    layers: tuple[int, ...]
    freq: np.ndarray  # [L, E]
    hot: dict[int, list[int]]
    sizes: ExpertBytes
    read_gbs: float = 0.0  # the CPU's read bandwidth: CPU expert ms a step >= bytes / it
    placements: list[Placement] = field(default_factory=list)  # by GPU bytes, then whole layers
    threads: list[tuple[int, float]] = field(default_factory=list)  # (cpu threads, ms)
    chunks: list[tuple[int, float]] = field(default_factory=list)  # (chunk size, prefill tok/s)
    model: DecodeModel | None = None
    devices: dict[int, str] = field(default_factory=dict)  # layer -> its hot experts' GPU


def variants_folder(out: Path) -> Path:
    """Where tune writes the rule files of the placements it compares (beside `out`, visible:
    they are results too)."""
    return out.parent / f"{out.stem}-variants"


@dataclass(frozen=True)
class TuneOptions:
    gguf_path: str
    profile: str
    gpu_memory: int | dict[str, int]  # one budget (gpu_device's), or one per GPU (spread)
    out: Path
    base_rules: str | None = None
    cache_lens: int = DEFAULT_CACHE_LENS
    gpu_device: str = "cuda:0"
    batch: int = 1
    phase: str = "decode"
    fractions: tuple[float, ...] = (0.25, 0.5, 0.75)  # budgets predicted and measured
    measure: bool = False
    steps: int = 32
    threads: tuple[int, ...] = ()  # CPU thread counts to sweep (with measure)
    chunk_sizes: tuple[int, ...] = ()  # --chunk-size values to sweep: prefill tok/s
    prefill_tokens: int = 2048  # the prompt the chunk sizes prefill
    device_map: Mapping[str, str] | None = None  # run GPU rule files elsewhere (tests)
    read_gbs: float | None = None  # the CPU's read bandwidth (None: measured now)
    # rounds of decode measurements, each over every placement in turn: medians, so a shared
    # host's drift between fresh engines lands in every placement alike
    repeats: int = 1
