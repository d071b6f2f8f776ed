"""The decode graphs of every batch-size bucket, captured at start-up, in one of two forms
(piecewise.py: "layers"; whole_step.py: "step").

A decode step of B requests replays the graphs of the smallest bucket >= B (static_step.py
stages its rows). All buckets share one memory pool, captured largest first; within a bucket
the pieces replay in their capture order, so memory one piece frees and a later one reuses is
never live twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from hybrid.engine.graphs.device_picks import StepPicks
from hybrid.engine.graphs.piecewise import PiecewiseGraphs
from hybrid.engine.graphs.static_step import StaticStep
from hybrid.engine.graphs.whole_step import WholeStepGraphs
from hybrid.engine.step.decoder import DecoderProgram
from hybrid.engine.step.forward_batch import SequenceRows
from hybrid.engine.step.kv_cache import PagedLatentCache


def bucket_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, 12, 16, 24, 32, 48, 64, ... up to max_batch_size (always included)."""
    sizes, b = [], 1
    while b < max_batch_size:
        sizes.append(b)
        b = b * 2 if b < 8 else b + (b // 2 if b & (b - 1) == 0 else b // 3)
    return sizes + [max_batch_size]


class DecodeGraphs:
    def __init__(self, program: DecoderProgram, cache: PagedLatentCache, page_size: int,
                 max_pages: int, max_batch_size: int, device: torch.device, attention,
                 carried: torch.Tensor, progress: Callable[[str], None] | None = None,
                 whole_step: bool = False) -> None:
        """attention: the engine's decode attention backend (its capture and replay hooks);
        carried: [max_batch_size] int64 on the device, the previous step's sampled ids that
        a decode row's input may name (static_step.py); whole_step: the "step" form (else
        "layers")."""
        self.form = WholeStepGraphs(program, device, carried, progress) if whole_step \
            else PiecewiseGraphs(program)
        self.sizes = bucket_sizes(max_batch_size)
        devices = program.devices if program.spans_devices else [device]
        # a pool per GPU (a model over several captures a graph per piece on each)
        pools = {d: torch.cuda.graph_pool_handle() for d in devices}
        self._buckets: dict[int, tuple[StaticStep, object]] = {}
        for i, b in enumerate(sorted(self.sizes, reverse=True)):
            if progress is not None:
                progress(f"capturing decode graphs: batch {b} ({i + 1}/{len(self.sizes)})")
            static = StaticStep(b, page_size, max_pages, cache, device, attention, carried)
            program.run(static.state)  # warm-up: compiles every kernel of this shape
            _synchronize(devices)
            self._buckets[b] = (static, self.form.capture(static, pools))
            _synchronize(devices)

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    @property
    def whole_step(self) -> bool:
        return isinstance(self.form, WholeStepGraphs)

    def captured(self, batch: int):
        """What the bucket serving `batch` rows captured: the whole step's graph, or a graph
        per piece (None for host pieces) (profilers time them alone)."""
        return self._buckets[next(s for s in self.sizes if s >= batch)][1]

    def run(self, chunks: list[SequenceRows], beside: Callable[[], None] | None = None,
            before_experts: Callable[[], None] | None = None,
            ahead: Callable[[torch.Tensor, StepPicks], None] | None = None
            ) -> tuple[torch.Tensor, StepPicks | None]:
        """chunks: one decode (one token, its pages, its position, sampling) per request; a
        token -(j + 1) is the carried id j -> (logits [B, V], the rows' greedy picks where the
        form makes them). beside: host work run during the step (the form says when);
        before_experts: host work once the step is launched, before the host drives its CPU
        experts (the step before's tokens read back, or their picks taken); ahead(logits,
        picks): host work beside the CPU experts of a whole-step graph once it is past its
        first MoE layer (this step's tokens decided on the device, the next step launched),
        instead of `beside`."""
        if self.whole_step:
            return self.drive(self.launch(chunks), beside, before_experts, ahead)
        static, graphs = self._bucket(len(chunks))
        static.load(chunks)
        self.form.replay(graphs, static.state, beside, before_experts)
        return static.state.logits[:len(chunks)], None

    def launch(self, chunks: list[SequenceRows]) -> LaunchedGraph:
        """A whole step's graph staged and launched, its CPU experts not yet driven (`drive`)."""
        static, graph = self._bucket(len(chunks))
        static.load(chunks, fetch_now=False)  # the step's graph fetches them
        return LaunchedGraph(static, self.form.launch(graph), len(chunks))

    def drive(self, launched: LaunchedGraph, beside: Callable[[], None] | None = None,
              before_experts: Callable[[], None] | None = None,
              ahead: Callable[[torch.Tensor, StepPicks], None] | None = None
              ) -> tuple[torch.Tensor, StepPicks]:
        """The launched step's CPU experts (see run) -> (logits [B, V], greedy picks)."""
        seq, state, b = launched.seq, launched.static.state, launched.rows
        logits, picks = state.logits[:b], self.form.picks.of_step(seq, list(range(b)))
        if ahead is not None:  # in beside's place, once the step read its staged rows
            beside = partial(self._once_started, seq, partial(ahead, logits, picks))
        self.form.drive(seq, state, beside, before_experts)
        return logits, picks

    def _once_started(self, seq: int, fn: Callable[[], None]) -> None:
        self.form.started(seq)
        fn()

    def _bucket(self, b: int):
        return self._buckets[next(s for s in self.sizes if s >= b)]


@dataclass(frozen=True)
class LaunchedGraph:
    """A whole-step graph launched with `rows` decodes staged in `static`, as step `seq`."""

    static: StaticStep
    seq: int
    rows: int


def _synchronize(devices: list[torch.device]) -> None:
    for d in devices:
        torch.cuda.synchronize(d)
