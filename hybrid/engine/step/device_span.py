"""The decoder's step over several devices (a model whose layer ranges run on different GPUs,
rules/layer_split.py): which device each step runs on, device work that sets its device current
(Triton launches on the current device, whatever its tensors' device), and the crossing that
moves a step to the next GPU.

A crossing runs in a host piece (the CPU experts' one before a range boundary), so the copy
overlaps the CPU's work and a graph per piece on each GPU can be captured around it. Eagerly it
moves what the step holds; in a captured step (`StepState.crossings` a dict) it copies between
the same tensors on every replay: those the graph before it wrote at capture into those the
graph after it read. A graph replay does not rebind the Python names, so `residual` and
`pending` are stale then (`StepState.replaying`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from hybrid.engine.step.step_state import StepState


def cross_to(key: int, to: torch.device, st: StepState) -> None:
    """The residual stream and the outputs pending on it move to `to`, the GPU the next
    piece runs on, and the step's index tensors with them (ForwardBatch.on); `key` names the
    crossing among the step's."""
    if st.crossings is None:  # eager: move what the step holds
        st.residual = st.residual.to(to, non_blocking=True)
        st.pending = [d.to(to, non_blocking=True) for d in st.pending]
        st.fb.on(to)
        return
    if not st.replaying:  # a warm-up or a capture: what the graphs now read and write
        sources = [st.residual, *st.pending]
        old = st.crossings.get(key)
        same = old is not None and [t.shape for t in old[1]] == [t.shape for t in sources]
        targets = old[1] if same else [torch.empty_like(t, device=to) for t in sources]
        st.crossings[key] = (sources, targets)
        st.residual, *st.pending = targets
    for source, target in zip(*st.crossings[key], strict=True):
        target.copy_(source, non_blocking=True)
    st.fb.refresh_on(to)


def guarded(steps: list[tuple[torch.device, Callable[[StepState], None]]], guard: bool
            ) -> tuple[list[Callable[[StepState], None]], torch.device | None]:
    """Device work's steps (a step of None only marks a device the work touches), each with
    its device current when `guard` (a model over several devices), and the one device they
    run on (None: several)."""
    devices = {d for d, _ in steps}
    device = devices.pop() if len(devices) == 1 else None
    if guard:
        steps = [(d, partial(_on, d, step) if d.type == "cuda" and step else step)
                 for d, step in steps]
    return [step for _, step in steps if step is not None], device


def _on(device: torch.device, step: Callable[[StepState], None], st: StepState) -> None:
    with torch.cuda.device(device):
        step(st)


def device_of(module: nn.Module | None) -> torch.device | None:
    """An operator's device, else the device of a module's first parameter (None: none)."""
    if module is None:
        return None
    device = getattr(module, "device", None)
    if device is not None:
        return torch.device(device)
    tensor = next(iter(module.parameters()), None)
    return tensor.device if tensor is not None else None


def resolve(stretch: list) -> None:
    """A step of unknown device (None) runs on the next known one's (else the previous')."""
    known = [d for d, _ in stretch if d is not None]
    following = known[-1] if known else torch.device("cpu")
    for k in range(len(stretch) - 1, -1, -1):
        d, step = stretch[k]
        if d is None:
            stretch[k] = (following, step)
        else:
            following = d
