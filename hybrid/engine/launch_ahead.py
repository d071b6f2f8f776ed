"""Launching the next decode step beside this one's CPU experts (engine.py's overlapped decode).

While every running request decodes, `Ahead` runs on the whole-step graph's beside thread once
the step's graph read its staged rows (and the engine's thread took the step before's picks):
it makes the step before's outputs (its grammars' matchers taking their tokens), decides the
step's tokens on the device (a greedy step's graph picked them; other rows are masked by their
grammar and sampled, queued after the graph), each into its row of the runner's carried ids,
completes the step's chunks, counts
their tokens pending, schedules the next batch (its decodes' inputs `PENDING`) and launches it,
each pending input naming its carried row (`with_carried`: -(row + 1)). The engine drives that
launched step in its next call, after reading this step's tokens back.

Invariant: from the launch until its CPU experts are driven, the thread that drives them never
waits for the device (`live_rows` queues its index, the sampler its settings and a grammar's
mask: device_values.py, grammar.mask_logits; the draw asks the device nothing: draw.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from hybrid.engine.device_values import on_device
from hybrid.engine.outputs import LaunchedOutputs
from hybrid.engine.scheduling.request import Request
from hybrid.engine.scheduling.scheduler import ScheduledBatch, Scheduler


@dataclass(frozen=True)
class LaunchedAhead:
    """The next step's batch (its pending inputs resolved) and its launched graph: the next
    `execute` drives it, whatever batch it is passed (the same requests, or fewer where some
    finished since: their rows run and are dropped)."""

    batch: ScheduledBatch
    graph: object  # graphs/decode_graphs.py's LaunchedGraph (or runner/eager_step's)


class Ahead:
    """Beside a decode step's CPU experts (once its graph read its staged rows): its tokens
    decided on the device into the carried ids (`sampled`), its chunks completed (their KV is
    written before any later step reads it) and its tokens counted pending, the next batch
    scheduled (`scheduled`), and launched where it can run as a graph (`launched`; its pending
    inputs read from this step's picks, graph row i for chunk i)."""

    def __init__(self, scheduler: Scheduler, runner, batch: ScheduledBatch,
                 schedule: Callable[[], ScheduledBatch],
                 sample: Callable[[torch.Tensor, object], LaunchedOutputs],
                 read_back: Callable[[], None]) -> None:
        """runner: the ModelRunner (its `launch`, on its stream); schedule(): the next batch;
        sample(logits, picks): the step's tokens decided on the device, graph row i's into
        carried row i, not waited for (picks: the graph's greedy picks, or None);
        read_back(): the step before's tokens made outputs (outputs.PendingRead.finish), first:
        which of its requests ended, and their grammars' tokens, before this step's are
        decided."""
        self.scheduler, self.runner, self.batch, self.schedule = scheduler, runner, batch, schedule
        self.sample, self.read_back = sample, read_back
        self.sampled: LaunchedOutputs | None = None
        self.launched: LaunchedAhead | None = None

    @property
    def scheduled(self) -> bool:
        """Whether the step's tokens were left pending and the next batch scheduled (Ahead
        samples the step first, and then goes on to the end unless it raises)."""
        return self.sampled is not None

    def __call__(self, logits: torch.Tensor, picks) -> None:
        """logits: the step's [B, V] (a graph's: written by the time the queued work runs)."""
        self.read_back()
        chunks = self.batch.chunks
        if self.scheduler.waiting:  # a prompt comes next: these tokens are read back first
            return
        with self.runner.on_stream():  # after the step's graph, before the next one
            self.sampled = self.sample(logits, picks)
        self.scheduler.complete(chunks)
        for c in chunks:
            if not c.request.is_finished:  # a request retired since runs its row, dropped
                c.request.num_pending = 1
        nxt = self.schedule()
        if not nxt.chunks or not all(c.request.num_pending for c in nxt.chunks):
            return
        resolved = with_carried(nxt, {id(c.request): i for i, c in enumerate(chunks)})
        with self.runner.on_stream():  # this thread's stream: the model's, as the step's
            graph = self.runner.launch(resolved)
        if graph is not None:
            self.launched = LaunchedAhead(resolved, graph)


def with_carried(batch: ScheduledBatch, rows: dict[int, int]) -> ScheduledBatch:
    """The batch with each decode whose input is pending (scheduler.PENDING) naming its row j
    of the runner's carried ids (where the pending step's picks went) as -(j + 1); a request
    without a row stopped at the pending step (its row here runs on token 0, dropped)."""
    chunks = [replace(c, token_ids=[-(rows[id(c.request)] + 1)] if id(c.request) in rows
                      else [0]) if c.request.num_pending else c for c in batch.chunks]
    return replace(batch, chunks=chunks)


def rows_of(pending: LaunchedOutputs) -> dict[int, int]:
    """id(request) -> its row of the runner's carried ids."""
    return {id(r): j for r, j in zip(pending.requests, pending.rows, strict=True)}


def live_rows(logits: torch.Tensor, requests: list[Request], picks, live: list[int]
              ) -> tuple[torch.Tensor, list[Request], object]:
    """The step's logits rows, requests and picks (StepPicks or None) of the requests `live`
    indexes; the others stopped at the pending step, their rows dropped (the index queued, not
    waited for: a step launched ahead may sit on the stream)."""
    if len(live) == len(requests):
        return logits, requests, picks
    picks = picks.select(live) if picks is not None else None
    return logits.index_select(0, on_device(live, logits.device)), \
        [requests[i] for i in live], picks
