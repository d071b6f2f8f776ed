"""The engine worker over the real scheduler with a fake forward: no torch, step() by hand."""

from __future__ import annotations

import threading

import pytest

from hybrid.engine.config import EngineConfig
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.engine.scheduling.request import Request, RequestFailed, RequestStatus, TokenOutput
from hybrid.engine.worker import EngineWorker
from tests.engine_fakes import FakeEngine, make


def run_until_idle(worker: EngineWorker, limit: int = 200) -> None:
    for _ in range(limit):
        if not worker.has_work:
            return
        worker.step()
    raise AssertionError("the worker did not go idle")


def test_requests_share_steps_and_queue_beyond_max_batch_size() -> None:
    engine = FakeEngine(EngineConfig(max_batch_size=2, cache_lens=1024, page_size=16))
    worker = EngineWorker(engine)
    (a, ea), (b, eb), (c, ec) = make([10], 2), make([20], 3), make([30], 1)
    for r in (a, b, c):
        worker.submit(r)
    worker.step()
    # a and b run first (arrival order) in one forward; c waits for a slot.
    assert [ch.request for ch in engine.batches[0].chunks] == [a, b]
    assert c.status is RequestStatus.WAITING
    run_until_idle(worker)
    assert [e.token_id for e in ea] == [11, 12] and a.output_ids == [11, 12]
    assert [e.finish_reason for e in eb] == [None, None, "length"]
    assert [e.text for e in ec] == ["<31>"]
    stats = worker.stats()
    assert (stats.num_finished, stats.num_generated_tokens, stats.max_batch_requests) == (3, 6, 2)
    assert stats.kv_pages_used == 0 and stats.num_prompt_tokens == 3


def test_cancel_queued_request_never_runs() -> None:
    engine = FakeEngine(EngineConfig(max_batch_size=1, cache_lens=1024, page_size=16))
    worker = EngineWorker(engine)
    (a, _), (b, eb) = make([10], 5), make([20], 5)
    worker.submit(a)
    worker.submit(b)
    worker.step()
    worker.cancel(b)
    run_until_idle(worker)
    assert b.status is RequestStatus.FINISHED_CANCELLED and eb == []
    assert all(ch.request is a for batch in engine.batches for ch in batch.chunks)
    assert (worker.stats().num_cancelled, worker.stats().num_cancelled_waiting) == (1, 1)


def test_cancel_running_request_frees_its_pages_before_next_token() -> None:
    worker = EngineWorker(FakeEngine())
    a, ea = make([10], 50)
    worker.submit(a)
    worker.step()
    worker.step()
    assert worker.stats().kv_pages_used == 4  # 51 tokens in pages of 16
    a.cancel()
    worker.step()
    assert len(ea) == 2 and a.status is RequestStatus.FINISHED_CANCELLED
    assert worker.stats().kv_pages_used == 0 and worker.stats().num_running == 0


def test_failing_forward_fails_its_requests_and_the_worker_goes_on() -> None:
    worker = EngineWorker(FakeEngine(fail_on=22))
    (a, ea), (b, eb) = make([20], 4), make([40], 3)
    worker.submit(a)
    worker.submit(b)
    run_until_idle(worker)
    assert isinstance(ea[-1], RequestFailed) and "boom" in ea[-1].message
    # b shared the failing forward: it fails too, with the same message, never a hang.
    assert isinstance(eb[-1], RequestFailed) and eb[-1].message == ea[-1].message
    assert a.status is RequestStatus.FINISHED_FAILED and b.status is RequestStatus.FINISHED_FAILED
    assert worker.stats().num_failed == 2 and worker.stats().kv_pages_used == 0
    c, ec = make([60], 2)
    worker.submit(c)
    run_until_idle(worker)
    assert [e.token_id for e in ec if isinstance(e, TokenOutput)] == [61, 62]


def test_broken_sink_cancels_its_request() -> None:
    def sink(event: object) -> None:
        raise RuntimeError("event loop is closed")

    worker = EngineWorker(FakeEngine())
    r = Request("x", [1], SamplingParams(max_tokens=9), sink)
    worker.submit(r)
    run_until_idle(worker)
    assert r.status is RequestStatus.FINISHED_CANCELLED and r.output_ids == [2]


def test_worker_thread_serves_and_shuts_down() -> None:
    worker = EngineWorker(FakeEngine())
    worker.start()
    done = threading.Event()
    out: list = []

    def sink(event: object) -> None:
        out.append(event)
        if event.finish_reason:  # type: ignore[attr-defined]
            done.set()

    worker.submit(Request("t", [5], SamplingParams(max_tokens=4), sink))
    assert done.wait(5)
    with pytest.raises(AssertionError, match="only the worker thread"):
        worker.step()
    worker.shutdown()
    assert [e.token_id for e in out] == [6, 7, 8, 9]
    with pytest.raises(RuntimeError, match="shutting down"):
        worker.submit(Request("late", [1], SamplingParams(), sink))


def test_scheduling_code_imports_no_torch() -> None:
    import subprocess
    import sys

    code = ("import sys, pkgutil, importlib, hybrid.engine.worker, hybrid.engine.scheduling as s;"
            " [importlib.import_module(m.name) for m in pkgutil.iter_modules(s.__path__, "
            "'hybrid.engine.scheduling.')]; sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.parametrize("error", [
    RuntimeError("CUDA error: an illegal memory access was encountered"),
    __import__("hybrid.errors", fromlist=["DeviceLost"]).DeviceLost("the GPU did not hand over"),
])
def test_a_lost_gpu_fails_everything_and_ends_the_loop(error: Exception) -> None:
    """An unrecoverable CUDA error: the step's requests, the running and the queued ones all
    fail with a message naming it, and the worker stops (`fatal`), never serving on broken."""
    worker = EngineWorker(FakeEngine(EngineConfig(max_batch_size=1, cache_lens=1024,
                                                  page_size=16), fail_on=22, error=error))
    (a, ea), (b, eb) = make([20], 4), make([40], 3)  # b waits: one request per batch
    worker.submit(a)
    worker.submit(b)
    run_until_idle(worker)
    for events in (ea, eb):
        assert isinstance(events[-1], RequestFailed)
        assert events[-1].message.startswith("the GPU failed (") and "server stops" in events[-1].message
    assert worker.fatal is not None and str(error) in worker.fatal
    assert not worker.has_work and worker.stats().kv_pages_used == 0
    with pytest.raises(RuntimeError, match="shutting down"):
        worker.submit(make([60], 2)[0])
    worker.run()  # the loop returns at once: stopping and idle
