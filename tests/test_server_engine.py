"""The engine worker and FCFS scheduler with a fake model: no torch, no threads (step() by hand)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from hybrid.engine.config import EngineConfig
from hybrid.engine.request import Request, RequestFailed, RequestStatus, TokenOutput
from hybrid.engine.sampling_params import SamplingParams
from hybrid.engine.worker import EngineWorker
from hybrid.errors import HybridError


@dataclass(frozen=True)
class FakeSampled:
    token_id: int
    logprob: float = -0.5
    top_logprobs: tuple = ()


@dataclass(frozen=True)
class FakeEvent:
    sampled: FakeSampled
    text_delta: str
    finish_reason: str | None


class FakeModel:
    """Emits prompt[-1] + 1, + 2, ...; finishes with "length" after max_tokens."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.fail_on = fail_on
        self.started: list[list[int]] = []
        self.closed = 0

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[FakeEvent]:
        self.started.append(prompt_ids)
        try:
            for step in range(params.max_tokens):
                token = prompt_ids[-1] + step + 1
                if token == self.fail_on:
                    raise RuntimeError("boom")
                last = step == params.max_tokens - 1
                yield FakeEvent(FakeSampled(token), f"<{token}>", "length" if last else None)
        finally:
            self.closed += 1


def make(prompt: list[int], max_tokens: int = 3) -> tuple[Request, list]:
    events: list = []
    return Request(f"r{prompt[0]}", prompt, SamplingParams(max_tokens=max_tokens),
                   events.append), events


def run_until_idle(worker: EngineWorker, limit: int = 100) -> None:
    for _ in range(limit):
        if not (worker.stats().num_running or worker.stats().num_waiting):
            return
        worker.step()
    raise AssertionError("the worker did not go idle")


def test_fcfs_with_max_batch_size_interleaves_and_finishes() -> None:
    model = FakeModel()
    worker = EngineWorker(model, EngineConfig(max_batch_size=2))
    (a, ea), (b, eb), (c, ec) = make([10], 2), make([20], 3), make([30], 1)
    for r in (a, b, c):
        worker.submit(r)
    worker.step()
    # a and b run first (arrival order); c waits for a free slot.
    assert (a.status, b.status, c.status) == (RequestStatus.RUNNING, RequestStatus.RUNNING,
                                              RequestStatus.WAITING)
    assert worker.stats().num_waiting == 1 and worker.stats().num_running == 2
    run_until_idle(worker)
    assert model.started == [[10], [20], [30]]
    assert [e.token_id for e in ea] == [11, 12] and a.output_ids == [11, 12]
    assert [e.finish_reason for e in eb] == [None, None, "length"]
    assert [e.text for e in ec] == ["<31>"]
    assert all(r.status is RequestStatus.FINISHED_LENGTH for r in (a, b, c))
    stats = worker.stats()
    assert (stats.num_finished, stats.num_generated_tokens, stats.max_running) == (3, 6, 2)
    assert model.closed == 3  # every KV stream released


def test_cancel_queued_request_never_runs() -> None:
    model = FakeModel()
    worker = EngineWorker(model, EngineConfig(max_batch_size=1))
    (a, _), (b, eb) = make([10], 5), make([20], 5)
    worker.submit(a)
    worker.submit(b)
    worker.step()
    worker.cancel(b)
    run_until_idle(worker)
    assert b.status is RequestStatus.FINISHED_CANCELLED and eb == []
    assert model.started == [[10]]
    assert (worker.stats().num_cancelled, worker.stats().num_cancelled_waiting) == (1, 1)


def test_cancel_running_request_stops_before_next_token() -> None:
    model = FakeModel()
    worker = EngineWorker(model, EngineConfig())
    a, ea = make([10], 50)
    worker.submit(a)
    worker.step()
    worker.step()
    a.cancel()
    worker.step()
    assert len(ea) == 2 and a.status is RequestStatus.FINISHED_CANCELLED
    assert model.closed == 1 and worker.stats().num_running == 0


def test_failing_request_reports_and_others_continue() -> None:
    model = FakeModel(fail_on=22)
    worker = EngineWorker(model, EngineConfig())
    (a, ea), (b, eb) = make([20], 4), make([40], 3)
    worker.submit(a)
    worker.submit(b)
    run_until_idle(worker)
    assert isinstance(ea[-1], RequestFailed) and "boom" in ea[-1].message
    assert a.status is RequestStatus.FINISHED_FAILED
    assert [e.token_id for e in eb if isinstance(e, TokenOutput)] == [41, 42, 43]
    assert worker.stats().num_failed == 1 and worker.stats().num_finished == 1


def test_broken_sink_cancels_its_request() -> None:
    def sink(event: object) -> None:
        raise RuntimeError("event loop is closed")

    worker = EngineWorker(FakeModel(), EngineConfig())
    r = Request("x", [1], SamplingParams(max_tokens=9), sink)
    worker.submit(r)
    run_until_idle(worker)
    assert r.status is RequestStatus.FINISHED_CANCELLED and r.output_ids == [2]


def test_worker_thread_serves_and_shuts_down() -> None:
    import threading

    worker = EngineWorker(FakeModel(), EngineConfig())
    worker.start()
    done = threading.Event()
    out: list = []

    def sink(event: object) -> None:
        out.append(event)
        if event.finish_reason:  # type: ignore[attr-defined]
            done.set()

    worker.submit(Request("t", [5], SamplingParams(max_tokens=4), sink))
    assert done.wait(5)
    worker.shutdown()
    assert [e.token_id for e in out] == [6, 7, 8, 9]
    with pytest.raises(RuntimeError, match="shutting down"):
        worker.submit(Request("late", [1], SamplingParams(), sink))


def test_engine_config_validates() -> None:
    with pytest.raises(HybridError, match="max_batch_size"):
        EngineConfig(max_batch_size=0)


def test_scheduling_code_imports_no_torch() -> None:
    import subprocess
    import sys

    code = ("import sys; import hybrid.engine.worker, hybrid.engine.scheduler; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
