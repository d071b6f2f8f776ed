"""The engine worker: one background thread that owns the engine and runs every request.

The model is not thread-safe, so exactly one thread steps the engine. HTTP handlers (or any
thread) `submit()` requests and `cancel()` them; the worker loops `step()`:

- schedule (under the lock): drop cancelled requests (queued or running) and free their pages,
  pick this step's decodes and prefill chunks, admit waiting requests whose pages fit;
- execute (without the lock, so submit() never waits for a forward): one batched forward and
  a sampled token for each request that reached its newest token;
- update: hand each token to its request's sink, retire finished requests (pages freed).

A cancelled request therefore stops before its next token, whether it was running or queued.
Without `start()`, callers may drive `step()` themselves (offline generation, tests), or give
the loop their own thread with `run()`: `hybrid serve` steps the engine on the main thread,
the thread that loaded the model and ran its warm-up (a thread started later decodes slower:
docs/serving.md), and serves HTTP from another.
Imports no torch: the engine is anything with `hybrid.engine.engine.Engine`'s methods.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from hybrid.engine.scheduling.request import (
    Request,
    RequestEvent,
    RequestFailed,
    RequestStatus,
    TokenOutput,
)
from hybrid.errors import is_device_lost

log = logging.getLogger("hybrid.engine")


@dataclass(frozen=True)
class EngineStats:
    """A consistent snapshot of the worker's queues and counters (for /health, /metrics, tests)."""

    num_waiting: int
    num_running: int
    num_submitted: int
    num_finished: int  # ended with "stop" or "length"
    num_cancelled: int  # includes requests cancelled while still queued
    num_cancelled_waiting: int
    num_failed: int
    num_generated_tokens: int
    num_steps: int
    max_running: int  # the most requests in flight in one step so far
    max_batch_requests: int = 0  # the most requests sharing one forward so far
    num_prompt_tokens: int = 0  # prompt tokens prefilled so far
    kv_pages_used: int = 0  # pages held by live (admitted, unfinished) requests
    kv_pages_total: int = 0
    kv_page_size: int = 0
    kv_pages_cached: int = 0  # pages in the prefix cache (held by requests or idle)
    num_cached_prompt_tokens: int = 0  # prompt tokens admitted with their KV already cached
    # MoE layer-steps whose routed experts were streamed to the GPU / ran on the CPU
    num_expert_layers_streamed: int = 0
    num_expert_layers_cpu: int = 0


_COUNTERS = ("submitted", "finished", "cancelled", "cancelled_waiting", "failed", "tokens",
             "steps", "max_running", "max_batch_requests", "prompt_tokens")


class EngineWorker:
    def __init__(self, engine) -> None:
        self.engine = engine
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.fatal: str | None = None  # an unrecoverable device error ended the loop
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self.step_log: deque[tuple[int, int, int]] = deque(maxlen=64)  # (requests, decodes, tokens)
        self.trace = None  # a step_trace.StepTrace every step writes to (`--trace-steps`)
        self._ahead = None  # the next step's batch, when the engine scheduled it ahead

    # -- any thread --------------------------------------------------------------------------

    def start(self) -> None:
        assert self._thread is None, "the worker is already started"
        self._thread = threading.Thread(target=self._loop, name="hybrid-engine", daemon=True)
        self._thread.start()

    def run(self) -> None:
        """Run the worker's loop in the calling thread until `shutdown()` (from any thread, or
        a signal handler of this one)."""
        assert self._thread is None, "the worker is already started"
        self._thread = threading.current_thread()
        self._loop()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Cancel everything, then stop the loop (waits at most `timeout` for the step when
        called from another thread than the loop's)."""
        with self._lock:
            self._stopping = True
            s = self.engine.scheduler
            for r in (*s.running, *s.waiting):
                r.cancel()
            self._lock.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread() \
                and thread is not threading.main_thread():
            thread.join(timeout)

    def submit(self, request: Request) -> None:
        """Queue `request`; raises RequestRejected (nothing queued) if it can never run."""
        with self._lock:
            if self._stopping:
                raise RuntimeError("the engine is shutting down")
            self.engine.add(request)
            self._counts["submitted"] += 1
            self._lock.notify_all()

    def cancel(self, request: Request) -> None:
        """Drop `request` before its next token (a no-op once it has finished)."""
        request.cancel()
        with self._lock:
            self._lock.notify_all()

    def stats(self) -> EngineStats:
        with self._lock:
            c, s = self._counts, self.engine.scheduler
            layers = self.engine.expert_layer_counts
            return EngineStats(
                len(s.waiting), len(s.running), c["submitted"], c["finished"], c["cancelled"],
                c["cancelled_waiting"], c["failed"], c["tokens"], c["steps"], c["max_running"],
                c["max_batch_requests"], c["prompt_tokens"], s.num_pages_held,
                s.pages.num_pages, s.pages.page_size,
                s.cache.num_pages if s.cache is not None else 0, self.engine.cached_prompt_tokens,
                layers["stream"], layers["cpu"])

    @property
    def has_work(self) -> bool:
        with self._lock:
            return self.engine.has_work

    # -- the worker thread (or the caller, when not started) ----------------------------------

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self.engine.has_work and not self._stopping:
                    self._lock.wait()
                if self._stopping and not self.engine.has_work:
                    return
            self.step()

    def step(self) -> int:
        """schedule -> execute -> update; returns the number of tokens delivered. A batch the
        step before scheduled ahead (engine.execute's schedule_ahead) is this step's."""
        assert self._thread is None or threading.current_thread() is self._thread, \
            "only the worker thread steps a started engine"
        batch = self._ahead if self._ahead is not None else self._schedule()
        self._ahead = None
        start = time.perf_counter()
        try:
            outputs = self.engine.execute(batch, self._schedule_ahead)
        except Exception as e:  # a failing forward must not take the server down
            log.exception("a step of %d requests failed", len(batch.chunks))
            self._ahead = None
            self._fail_step(batch, e)
            return 0
        self._deliver(outputs, batch, time.perf_counter() - start)
        return len(outputs)

    def _schedule_ahead(self):
        """The next step's batch, scheduled during this one (on the engine's beside thread,
        while the worker thread drives the CPU experts)."""
        self._ahead = self._schedule()
        return self._ahead

    def _schedule(self):
        """The next batch (cancelled requests dropped), counted for /health."""
        with self._lock:
            was_waiting = {id(r) for r in self.engine.scheduler.waiting}
            batch = self.engine.schedule()
            c = self._counts
            for r in batch.cancelled:
                c["cancelled"] += 1
                c["cancelled_waiting"] += id(r) in was_waiting
            c["steps"] += 1
            c["max_running"] = max(c["max_running"], len(self.engine.scheduler.running))
            c["max_batch_requests"] = max(c["max_batch_requests"], len(batch.chunks))
            c["prompt_tokens"] += batch.num_tokens - batch.num_decodes
        self.step_log.append((len(batch.chunks), batch.num_decodes, batch.num_tokens))
        if batch.chunks:
            log.debug("step: %d requests, %d decodes, %d tokens", len(batch.chunks),
                      batch.num_decodes, batch.num_tokens)
        return batch

    def _deliver(self, outputs, batch, seconds: float) -> None:
        """Each sampled token to its request's sink; finished (or disconnected) requests
        retired. The step (`batch`, its `seconds`) goes to the trace first, if one is on."""
        if self.trace is not None:
            in_flight = [r for r in self.engine.scheduler.running if r.in_flight]
            self.trace.write(batch, in_flight, outputs, seconds)
        with self._lock:  # counted before any client sees them: /health never lags a response
            self._counts["tokens"] += sum(isinstance(o.token, TokenOutput) for o in outputs)
        for out in outputs:
            status = out.status
            if not self._emit(out.request, out.token):
                status = RequestStatus.FINISHED_CANCELLED
            if status is not RequestStatus.RUNNING:
                self._retire(out.request, status)

    def _fail_step(self, batch, e: Exception) -> None:
        """A step raised: its requests (and any whose chunk was part-way through the layers)
        fail with the cause; a lost device also fails the rest and stops the loop."""
        failed = [c.request for c in batch.chunks]
        failed += [r for r in self.engine.abandon_in_flight() if r not in failed]
        message = f"generation failed: {type(e).__name__}: {e}"
        lost = is_device_lost(e)
        if lost:
            self._stop_for_good(f"{type(e).__name__}: {e}")
            message = f"the GPU failed ({type(e).__name__}: {e}); the server stops"
            failed += [r for r in self.engine.scheduler.running if r not in failed]
        for request in failed:
            self._emit(request, RequestFailed(message))
            self._retire(request, RequestStatus.FINISHED_FAILED)
        if lost:  # the queue too: cancelled, told why, dropped with their pages
            with self._lock:
                waiting = list(self.engine.scheduler.waiting)
                for request in waiting:
                    request.cancel()
                self.engine.schedule()
            for request in waiting:
                self._emit(request, RequestFailed(message))

    def _stop_for_good(self, cause: str) -> None:
        """An unrecoverable device error: every later step would fail the same way, so the
        loop ends (after this step's requests and the queue are failed) and `fatal` says why;
        `hybrid serve` then exits non-zero rather than failing requests while looking alive."""
        log.critical("the GPU failed: %s; failing every request and stopping", cause)
        with self._lock:
            self.fatal = cause
            self._stopping = True

    def _emit(self, request: Request, event: RequestEvent) -> bool:
        try:
            request.sink(event)
            return True
        except Exception:  # e.g. the handler's event loop is gone: nobody is listening
            log.warning("request %s: its sink failed; cancelling it", request.request_id,
                        exc_info=True)
            request.cancel()
            return False

    def _retire(self, request: Request, status: RequestStatus) -> None:
        with self._lock:
            if request.is_finished:  # dropped as cancelled (and counted) by a schedule made
                return  # ahead of the delivery of its last token
            self.engine.retire(request, status)
            key = {RequestStatus.FINISHED_FAILED: "failed",
                   RequestStatus.FINISHED_CANCELLED: "cancelled"}.get(status, "finished")
            self._counts[key] += 1
