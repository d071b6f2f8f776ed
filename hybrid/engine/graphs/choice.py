"""Which form of decode graphs runs a decode step faster on this machine, measured at start-up.

The two forms (piecewise.py, whole_step.py) trade differently against the host: "step" replays
the whole step as one graph and the host drives every layer's CPU experts from one call,
spinning on flags in mapped pinned memory; "layers" replays one graph per stretch between two
layers' experts and runs Python, a launch and an event wait per layer. Which wins depends on the
host's caches and cores, on PCIe and on the GPU (measured both ways on the same GPU kind across
leases: docs/gpu-path.md), so `decode_graph="auto"` times one-request decode steps of each form,
alternating, and keeps the faster.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from hybrid.engine.step.forward_batch import SequenceRows

FORMS = ("step", "layers")
ROUNDS, STEPS = 5, 4  # alternating rounds of STEPS steps each: a noisy host's drift hits both


def faster(step_seconds: dict[str, list[float]]) -> str:
    """The form with the lower median step time (ties: "step", which launches less)."""
    return min(FORMS, key=lambda form: (statistics.median(step_seconds[form]), form != "step"))


def measure(capture: Callable[[str], object], device: torch.device) -> dict[str, list[float]]:
    """capture(form) -> DecodeGraphs of batch 1 in that form. Times one-request decode steps
    (token 0 at position 0 of page 0: nothing is cached at start-up) each way, with a device
    sync after each step as sampling reads its logits -> seconds a step, per round."""
    graphs = {form: capture(form) for form in FORMS}
    chunk = [SequenceRows(token_ids=[0], page_ids=[0], start=0, samples=True)]
    for g in graphs.values():  # the first replay of each pays one-time costs
        g.run(chunk)
    torch.cuda.synchronize(device)
    seconds: dict[str, list[float]] = {form: [] for form in FORMS}
    for _ in range(ROUNDS):
        for form, g in graphs.items():
            start = time.perf_counter()
            for _ in range(STEPS):
                g.run(chunk)
                torch.cuda.synchronize(device)
            seconds[form].append((time.perf_counter() - start) / STEPS)
    return seconds


def describe(step_seconds: dict[str, list[float]], chosen: str) -> str:
    ms = {form: 1e3 * statistics.median(s) for form, s in step_seconds.items()}
    return (f"decode graphs: a whole step as one graph {ms['step']:.2f} ms a step, layer by "
            f"layer {ms['layers']:.2f} ms: {'whole steps' if chosen == 'step' else 'layers'} "
            f"(--decode-graph sets it)")
