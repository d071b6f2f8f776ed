"""`StepResult`: what one forward of the model runner did, returned by `ModelRunner.run`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from hybrid.engine.graphs.device_picks import StepPicks
    from hybrid.engine.scheduling.scheduler import ScheduledChunk


@dataclass(frozen=True)
class StepResult:
    """`completed` are the chunks whose forward ended in this step, in order: the batch's, less
    `deferred` (a chunk taken out to pass the layers over several steps, layered_prefill.py),
    then a chunk whose pass ended here (taken out in an earlier step). `logits` has one row per
    chunk of `completed` that samples, in that order, and `picks`, where a whole-step graph
    made them, each row's greedy token (graphs/device_picks.py)."""

    logits: torch.Tensor  # [R, V] fp32 on the model's device
    completed: list[ScheduledChunk]
    deferred: ScheduledChunk | None
    streamed_layers: int  # MoE layer-steps whose routed experts were streamed to the GPU
    cpu_layers: int  # MoE layer-steps whose routed experts ran on the CPU
    picks: StepPicks | None = None
