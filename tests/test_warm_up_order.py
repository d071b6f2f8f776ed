"""Start-up's warm-up overlaps a first start's background compile of the CPU experts' kernels:
the steps that stream every MoE layer's experts to the GPU (no CPU kernel) run first, then the
GPU-only work (the streamed launches' block sizes, the steps that will run the CPU experts with
those left out) compiles its device kernels, then the wait for the compile, then the steps with
the CPU experts. Where Triton compiles ahead, a dry run of the GPU-only work comes first and
its pool compiles beside the streamed steps. The warm-up needs CUDA to run for real (the GPU
machine's first start shows the order in its start-up lines, and
tests/gpu_kernels/test_precompile.py runs the dry run); here the order alone, over a
runner that records its steps."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from hybrid.engine.runner import warm_up
from hybrid.engine.step.forward_batch import ForwardBatch


def _runner(events: list, stream: bool, compile_threads: int = 1) -> SimpleNamespace:
    def run(state) -> None:
        kind = "streamed" if state.streamed else "left out" if state.routed_off \
            else "cpu experts"
        events.append((state.num_real, kind))

    model = nn.Module()
    model.config = SimpleNamespace(hidden_size=8)
    return SimpleNamespace(
        max_tokens=8192 + 16, chunk_size=8192, page_size=16, cache=None,
        device=torch.device("cpu"), model=model, max_pages=4,
        config=SimpleNamespace(max_batch_size=16, compile_threads=compile_threads),
        attention=SimpleNamespace(prepare=lambda fb: None),
        stream=SimpleNamespace(begin=lambda layers: None) if stream else None,
        program=SimpleNamespace(moe_layers=[object(), object()], run=run))


SMALL = (1, 2, 4, 8, 16, 32, 64)
BUCKETS = (1, 2, 4, 8, 12, 16)  # decode steps of each graph bucket (max_batch_size 16)


def _patch(monkeypatch, events: list) -> None:
    monkeypatch.setattr(ForwardBatch, "scratch_prefill", staticmethod(lambda *a, **k: None))
    monkeypatch.setattr(ForwardBatch, "scratch_decode",
                        staticmethod(lambda *a, **k: (None, None)))
    monkeypatch.setattr(warm_up.prefill_setup, "warm_up",
                        lambda *a: events.append("block sizes"))


def test_streamed_steps_run_before_the_wait_for_the_cpu_kernels(monkeypatch) -> None:
    events: list = []
    _patch(monkeypatch, events)
    warm_up.warm_up(_runner(events, stream=True),
                    cpu_kernels_ready=lambda: events.append("ready"))
    first_ready = events.index("ready")
    assert events[:first_ready] == [(8192, "streamed"), "block sizes"] + [
        (n, "left out") for n in (*SMALL, *BUCKETS)]
    steps = [e for e in events[first_ready:] if e != "ready"]
    assert steps == [(n, "cpu experts") for n in SMALL]


def test_without_streamed_experts_the_device_kernels_compile_before_the_wait(monkeypatch) -> None:
    events: list = []
    _patch(monkeypatch, events)
    warm_up.warm_up(_runner(events, stream=False), decode=True,
                    cpu_kernels_ready=lambda: events.append("ready"))
    first_ready = events.index("ready")
    assert events[:first_ready] == [(n, "left out") for n in (*SMALL, 8192, *BUCKETS)]
    assert [e for e in events[first_ready:] if e != "ready"] == [
        (n, "cpu experts") for n in (*SMALL, 8192, 1)]


class _Pool:
    """A stand-in for precompile.Precompile that records being joined or cancelled."""

    def __init__(self, events: list) -> None:
        self.events = events

    def wait(self) -> None:
        self.events.append("joined")

    def cancel(self) -> None:
        self.events.append("cancelled")


def test_compiling_ahead_dry_runs_the_gpu_only_work_first_and_joins_before_its_real_run(
        monkeypatch) -> None:
    events: list = []
    _patch(monkeypatch, events)

    def ahead(runner, work, threads, progress):
        events.append(("dry run", threads))
        work()
        events.append("dry run ends")
        return _Pool(events)

    monkeypatch.setattr(warm_up, "_precompile", ahead)
    warm_up.warm_up(_runner(events, stream=True, compile_threads=8),
                    cpu_kernels_ready=lambda: events.append("ready"))
    device_only = ["block sizes"] + [(n, "left out") for n in (*SMALL, *BUCKETS)]
    assert events == [("dry run", 8), *device_only, "dry run ends", (8192, "streamed"),
                      "joined", *device_only, "ready",
                      *[(n, "cpu experts") for n in SMALL]]


def test_a_failing_streamed_step_cancels_the_pool(monkeypatch) -> None:
    events: list = []
    _patch(monkeypatch, events)

    monkeypatch.setattr(warm_up, "_precompile", lambda *a: _Pool(events))
    runner = _runner(events, stream=True, compile_threads=8)

    def run(state) -> None:
        raise RuntimeError("out of memory")

    runner.program.run = run
    with pytest.raises(RuntimeError, match="out of memory"):
        warm_up.warm_up(runner)
    assert events == ["cancelled"]


def test_one_compile_thread_runs_no_dry_run(monkeypatch) -> None:
    events: list = []
    _patch(monkeypatch, events)
    monkeypatch.setattr(warm_up, "_precompile", lambda *a: events.append("dry run"))
    warm_up.warm_up(_runner(events, stream=True, compile_threads=1))
    assert "dry run" not in events


def test_a_step_with_the_routed_experts_left_out_runs_no_host_piece(models) -> None:
    """On a real model: a warm-up step with routed_off hands nothing to the CPU experts and
    gives every layer's routed output as zeros; the next real step is as before it."""
    from hybrid.engine.config import EngineConfig
    from hybrid.engine.llm import LLM
    from hybrid.engine.step.step_state import StepState

    path = str(models.path("tiny-v3", "q4_k_m"))
    runner = LLM(path, "cpu", engine_config=EngineConfig(cache_lens=1024)).engine.runner
    program, bridge = runner.program, runner.program.bridge
    assert program.moe_layers

    def step(**state) -> torch.Tensor:
        fb = ForwardBatch.scratch_prefill(8, runner.page_size, runner.cache, runner.device)
        return program.run(StepState(fb, num_real=8, **state)).clone()

    with torch.inference_mode():
        before = step()
        calls: list = []
        real = bridge.send, bridge.compute
        bridge.send = bridge.compute = lambda *a, **k: calls.append(a)
        try:
            off = step(routed_off=True)
        finally:
            bridge.send, bridge.compute = real
        after = step()
    assert calls == []
    assert torch.isfinite(off).all() and not torch.equal(off, before)
    assert torch.equal(after, before)
