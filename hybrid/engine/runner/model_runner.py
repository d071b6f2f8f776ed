"""Run one scheduled batch, mixed prefill chunks and decodes, as a single forward.

All N tokens of the step go through the model as rows [N, H] (decodes first) in a
`ForwardBatch` built on the host and copied to the device once; only the rows that sample go
through the final norm and lm_head. Decode-only steps replay CUDA graphs (graphs/) where
start-up captured them, others run the same DecoderProgram eagerly (eager_step.py), a prompt
chunk may pass the layers over several steps (layered_prefill.py), and a greedy decode step may
be launched while the step before runs (`launch`). Start-up (runner_start_up.py) runs every
shape a step can take once, so no request pays for compiling a kernel.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from hybrid.engine.config import EngineConfig
from hybrid.engine.prefill.layered_prefill import LayeredPasses
from hybrid.engine.runner import eager_step, runner_start_up
from hybrid.engine.runner.eager_step import EagerLaunch
from hybrid.engine.scheduling.scheduler import ScheduledBatch
from hybrid.engine.step.decoder import DecoderProgram
from hybrid.engine.step.experts_bridge import ExpertsBridge
from hybrid.engine.step.forward_batch import SequenceRows
from hybrid.engine.step.kv_cache import PagedLatentCache
from hybrid.engine.step.step_result import StepResult

if TYPE_CHECKING:  # graphs/ imports the kernels (Triton): only where a GPU captures them
    from hybrid.engine.graphs.decode_graphs import LaunchedGraph
    from hybrid.engine.graphs.device_picks import StepPicks

log = logging.getLogger("hybrid.engine")


class ModelRunner:
    def __init__(self, model: nn.Module, config: EngineConfig, max_request_tokens: int,
                 progress: Callable[[str], None] | None = None,
                 cpu_kernels_ready: Callable[[], None] | None = None) -> None:
        """`cpu_kernels_ready` returns once the CPU experts' kernels may be called (a first
        start's background compile done): start-up calls it before its first step that runs
        them, and before it returns."""
        self.model = model
        self.config = config
        self.page_size = config.page_size
        attention = runner_start_up.attention_ops(model)
        self.cache = PagedLatentCache(attention, config.num_pages * config.page_size)
        self.device = attention[0].device
        self.chunk_size = config.chunk_size or runner_start_up.auto_chunk_size(
            self, max_request_tokens, progress)
        # a step carries at most max_batch_size decodes plus chunk_size prompt tokens
        self.max_tokens = self.chunk_size + config.max_batch_size
        self.bridge = ExpertsBridge(self.max_tokens, model.config.hidden_size,
                                    model.config.num_experts_per_tok, self.device)
        self.program = DecoderProgram(model, self.bridge)
        self.recorder = runner_start_up.install_recorder(model, self.program) \
            if config.record_routing else None
        self.max_pages = -(-max_request_tokens // config.page_size)
        # [max_batch_size] a step's picks on the device, which the next step launched ahead
        # reads as its decodes' inputs (-(row + 1): engine.py)
        self.carried_ids = torch.zeros(config.max_batch_size, dtype=torch.int64,
                                       device=self.device)
        self.model_stream, job_stream = runner_start_up.streams(self.device, config)
        self.layered = LayeredPasses(self.program, self.cache, self.page_size, self.device,
                                     self.model_stream, job_stream, config.prompt_share)
        with self.on_stream():
            runner_start_up.start_up(self, config, attention, progress,
                                     cpu_kernels_ready or (lambda: None))

    def on_stream(self):
        """The context every step's device work runs in: the model's stream made current on
        the calling thread (a no-op on the CPU)."""
        return torch.cuda.stream(self.model_stream)

    @property
    def job(self):
        """The chunk passing the layers over several steps (layered_prefill.py), or None."""
        return self.layered.job

    @property
    def launches_ahead(self) -> bool:
        """Whether a decode step can be launched while the step before runs (`launch`): a
        whole-step graph form, or eager steps (whose launch runs when driven)."""
        return self.graphs is None or self.graphs.whole_step

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch) -> LaunchedGraph | EagerLaunch | None:
        """Launch a decode-only batch now, its CPU experts driven by the `run` that gets it back
        as `launched`: its whole-step graph, or, for eager steps, its rows as they are now (the
        forward runs when driven, as a stream would run it then); None (nothing launched) where
        it cannot. Called beside the CPU experts of the step before (its `ahead`)."""
        if not (self.launches_ahead and batch.chunks and self.layered.job is None
                and all(len(c.token_ids) == 1 for c in batch.chunks)):
            return None
        rows = SequenceRows.of(batch.chunks)
        if self.graphs is None:
            return EagerLaunch(rows)
        return self.graphs.launch(rows) if len(rows) <= self.graphs.max_batch else None

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch, before_experts: Callable[[], None] | None = None,
            ahead: Callable[[torch.Tensor, StepPicks | None], None] | None = None,
            launched: LaunchedGraph | EagerLaunch | None = None) -> StepResult:
        """One step: the batch's chunks in one forward, and the layered chunk's next layers.
        A decode's token -(j + 1) is carried_ids[j]. before_experts(): host work once the
        step's GPU work is launched, before the host drives its CPU experts (called once, by
        the time this returns). ahead(logits, picks): host work beside the CPU experts of a
        whole-step graph once it read its staged rows (after an eager forward where no graphs
        are) on the step's logits and greedy picks (or None) to come: this step's tokens
        decided, the next launched (never beside a layered chunk). launched: this batch's."""
        layers = len(self.program.moe_layers)
        if isinstance(launched, EagerLaunch):
            logits, picks, _, on_cpu = self._run(launched.rows, False, None, before_experts,
                                                 ahead)
            return StepResult(logits, list(batch.chunks), None, 0, on_cpu, picks)
        if launched is not None:  # a whole-step graph's
            logits, picks = self.graphs.drive(launched, None, before_experts, ahead)
            return StepResult(logits, list(batch.chunks), None, 0, layers, picks)
        placement = self.placement if self.stream is not None else None
        return self.layered.run_step(batch, placement, self._run, before_experts, ahead)

    def drop_job(self, request=None) -> None:
        """Forget the layered chunk (of `request`, or any): its request was cancelled or its
        step failed."""
        self.layered.drop(request)

    def _run(self, chunks: list[SequenceRows], may_stream: bool, beside=None,
             before_experts=None, ahead=None) -> tuple[torch.Tensor, StepPicks | None, int, int]:
        """One forward over `chunks` (graphs for decode-only steps) -> (their logits, the
        graph's greedy picks of them or None, MoE layers streamed, MoE layers on the CPU).
        beside(): host work during the step (a whole-step graph runs its CPU experts
        meanwhile), else before it; before_experts, ahead: see run."""
        layers = len(self.program.moe_layers)
        if chunks and self.graphs is not None and len(chunks) <= self.graphs.max_batch \
                and all(len(c.token_ids) == 1 for c in chunks):
            return *self.graphs.run(chunks, beside, before_experts,
                                    None if beside is not None else ahead), 0, layers
        for first in (beside, before_experts):
            if first is not None:
                first()
        if not chunks:
            return torch.empty(0, self.model.config.vocab_size, device=self.device), None, 0, 0
        logits, streamed, on_cpu = eager_step.run(self, chunks, may_stream)
        if ahead is not None and self.graphs is None:  # a graph launched now would run
            ahead(logits, None)  # before this step's eager sampling, which writes its inputs
        return logits, None, streamed, on_cpu

