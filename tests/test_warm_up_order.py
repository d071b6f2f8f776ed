"""Start-up's warm-up overlaps a first start's background compile of the CPU experts' kernels:
the steps that stream every MoE layer's experts to the GPU (no CPU kernel) run first, then the
wait for the compile, then the steps that run the CPU experts. The warm-up needs CUDA to run
for real (the GPU machine's first start shows the order in its start-up lines); here the
order alone, over a runner that records its steps."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from hybrid.engine.runner import runner_start_up
from hybrid.engine.step.forward_batch import ForwardBatch


def _runner(events: list, stream: bool) -> SimpleNamespace:
    def run(state) -> None:
        events.append((state.num_real, "streamed" if state.streamed else "cpu experts"))

    return SimpleNamespace(
        max_tokens=8192 + 16, chunk_size=8192, page_size=16, cache=None,
        device=torch.device("cpu"), model=nn.Module(),
        stream=SimpleNamespace(begin=lambda layers: None) if stream else None,
        program=SimpleNamespace(moe_layers=[object(), object()], run=run))


def test_streamed_steps_run_before_the_wait_for_the_cpu_kernels(monkeypatch) -> None:
    monkeypatch.setattr(ForwardBatch, "scratch_prefill", staticmethod(lambda *a, **k: None))
    events: list = []
    runner_start_up.warm_up(_runner(events, stream=True),
                            cpu_kernels_ready=lambda: events.append("ready"))
    first_ready = events.index("ready")
    assert events[:first_ready] == [(8192, "streamed")]
    steps = [e for e in events[first_ready:] if e != "ready"]
    assert steps == [(n, "cpu experts") for n in (1, 2, 4, 8, 16, 32, 64)]


def test_without_streamed_experts_the_wait_comes_first(monkeypatch) -> None:
    monkeypatch.setattr(ForwardBatch, "scratch_prefill", staticmethod(lambda *a, **k: None))
    events: list = []
    runner_start_up.warm_up(_runner(events, stream=False),
                            cpu_kernels_ready=lambda: events.append("ready"))
    assert events[0] == "ready"
    assert [e for e in events if e != "ready"] == [
        (n, "cpu experts") for n in (1, 2, 4, 8, 16, 32, 64, 8192)]
