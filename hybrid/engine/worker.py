"""The engine worker: one background thread that owns the model and runs every request.

The model is not thread-safe, so exactly one thread touches it. HTTP handlers (or any thread)
`submit()` requests and `cancel()` them; the worker loops `step()` = schedule -> run -> update:

- schedule: drop cancelled requests (queued or running), admit waiting ones FCFS up to
  `max_batch_size`;
- run: advance each running request by one token (one forward per request; see `EngineConfig`
  for why this is interleaving, not batching, in this slice);
- update: record the token on the `Request`, hand it to the request's sink, retire finished ones.

A cancelled request therefore stops before its next token, whether it was running or queued.
Imports no torch: the model is anything with `stream(prompt_ids, params)` (`hybrid.LLM`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from hybrid.engine.config import EngineConfig
from hybrid.engine.request import Request, RequestFailed, RequestStatus, TokenOutput
from hybrid.engine.sampling_params import SamplingParams
from hybrid.engine.scheduler import Scheduler

log = logging.getLogger("hybrid.engine")


class TokenStreamer(Protocol):
    """What the worker needs from a model: `hybrid.LLM.stream`'s contract (StreamEvents)."""

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[Any]: ...


@dataclass(frozen=True)
class EngineStats:
    """A consistent snapshot of the worker's queues and counters (for /health and tests)."""

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
    kv_pages_used: int = 0  # pages held by live (waiting-admitted or running) requests
    kv_pages_total: int = 0
    kv_page_size: int = 0


class EngineWorker:
    def __init__(self, model: TokenStreamer, config: EngineConfig) -> None:
        self.model = model
        self.config = config
        self._scheduler = Scheduler(config.max_batch_size)
        self._streams: dict[int, Iterator[Any]] = {}  # id(request) -> its model stream (KV cache)
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._counts = {k: 0 for k in ("submitted", "finished", "cancelled", "cancelled_waiting",
                                       "failed", "tokens", "steps", "max_running")}

    # -- any thread --------------------------------------------------------------------------

    def start(self) -> None:
        assert self._thread is None, "the worker is already started"
        self._thread = threading.Thread(target=self._loop, name="hybrid-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Cancel everything, then stop the thread (waits at most `timeout` for the step)."""
        with self._lock:
            self._stopping = True
            for r in (*self._scheduler.running, *self._scheduler.waiting):
                r.cancel()
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, request: Request) -> None:
        with self._lock:
            if self._stopping:
                raise RuntimeError("the engine is shutting down")
            self._scheduler.add(request)
            self._counts["submitted"] += 1
            self._lock.notify_all()

    def cancel(self, request: Request) -> None:
        """Drop `request` before its next token (a no-op once it has finished)."""
        request.cancel()
        with self._lock:
            self._lock.notify_all()

    def stats(self) -> EngineStats:
        with self._lock:
            c = self._counts
            return EngineStats(
                self._scheduler.num_waiting, self._scheduler.num_running, c["submitted"],
                c["finished"], c["cancelled"], c["cancelled_waiting"], c["failed"], c["tokens"],
                c["steps"], c["max_running"],
            )

    # -- worker thread -----------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._scheduler.has_work and not self._stopping:
                    self._lock.wait()
                if self._stopping and not self._scheduler.has_work:
                    return
            self.step()

    def step(self) -> int:
        """schedule -> run -> update; returns the number of tokens generated."""
        with self._lock:
            was_waiting = {id(r) for r in self._scheduler.waiting}
            scheduled = self._scheduler.schedule()
            for r in scheduled.cancelled:
                self._counts["cancelled"] += 1
                self._counts["cancelled_waiting"] += id(r) in was_waiting
            self._counts["steps"] += 1
            self._counts["max_running"] = max(self._counts["max_running"], len(scheduled.running))
        for r in scheduled.cancelled:
            self._close_stream(r)
        num_tokens = 0
        for request in scheduled.running:
            status = self._advance(request)
            num_tokens += status is not RequestStatus.FINISHED_FAILED
            if status is not RequestStatus.RUNNING:
                self._retire(request, status)
        with self._lock:
            self._counts["tokens"] += num_tokens
        return num_tokens

    def _advance(self, request: Request) -> RequestStatus:
        """Run one token of `request` and hand it to the sink; its status after this token."""
        try:
            stream = self._streams.get(id(request))
            if stream is None:
                stream = self._streams[id(request)] = iter(
                    self.model.stream(request.prompt_ids, request.params))
            event = next(stream)
        except Exception as e:  # a failing request must not take the server down
            log.exception("request %s failed", request.request_id)
            self._emit(request, RequestFailed(f"generation failed: {type(e).__name__}: {e}"))
            return RequestStatus.FINISHED_FAILED
        s = event.sampled
        request.append(s.token_id)
        out = TokenOutput(s.token_id, event.text_delta, s.logprob, tuple(s.top_logprobs),
                          event.finish_reason)
        if not self._emit(request, out):
            return RequestStatus.FINISHED_CANCELLED
        if event.finish_reason is None:
            return RequestStatus.RUNNING
        return RequestStatus(event.finish_reason)

    def _emit(self, request: Request, event: TokenOutput | RequestFailed) -> bool:
        try:
            request.sink(event)
            return True
        except Exception:  # e.g. the handler's event loop is gone: nobody is listening
            log.warning("request %s: its sink failed; cancelling it", request.request_id,
                        exc_info=True)
            request.cancel()
            return False

    def _retire(self, request: Request, status: RequestStatus) -> None:
        self._close_stream(request)
        with self._lock:
            self._scheduler.finish(request, status)
            key = {RequestStatus.FINISHED_FAILED: "failed",
                   RequestStatus.FINISHED_CANCELLED: "cancelled"}.get(status, "finished")
            self._counts[key] += 1

    def _close_stream(self, request: Request) -> None:
        stream = self._streams.pop(id(request), None)
        close = getattr(stream, "close", None)
        if close is not None:
            close()  # frees the request's KV cache now, not at garbage collection
