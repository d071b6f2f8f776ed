"""FCFS scheduling of requests onto the worker (no torch, no threads: the worker holds the lock).

This slice's scheduler admits waiting requests in arrival order until `max_batch_size` are
running; each step then advances every running request by one token. Chunked prefill, KV page
reservation and preemption come with continuous batching in a later slice.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from hybrid.engine.request import Request, RequestStatus


@dataclass(frozen=True)
class ScheduledStep:
    """What one step does: advance `running` by a token; drop `cancelled` (already finished)."""

    running: list[Request]
    cancelled: list[Request]


class Scheduler:
    def __init__(self, max_batch_size: int) -> None:
        self.max_batch_size = max_batch_size
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def schedule(self) -> ScheduledStep:
        """Drop cancelled requests (queued or running), then admit waiting ones FCFS."""
        cancelled = [r for r in (*self.running, *self.waiting) if r.is_cancel_requested]
        if cancelled:
            gone = set(map(id, cancelled))
            self.running = [r for r in self.running if id(r) not in gone]
            self.waiting = deque(r for r in self.waiting if id(r) not in gone)
            for r in cancelled:
                r.finish(RequestStatus.FINISHED_CANCELLED)
        while self.waiting and len(self.running) < self.max_batch_size:
            request = self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
        return ScheduledStep(list(self.running), cancelled)

    def finish(self, request: Request, status: RequestStatus) -> None:
        """Take a running request out; its slot goes to the next waiting one at the next step."""
        self.running.remove(request)
        request.finish(status)
