"""Run one scheduled batch, mixed prefill chunks and decodes, as a single forward.

All N tokens of the step go through the model as rows [N, H] (decodes first); the attention
operators find their sequences and cache rows in a `ForwardBatch`, built on the host and copied
to the device once. Only the rows that sample (the last token of each chunk that reaches its
request's newest token) go through the final norm and lm_head. Decode-only steps replay CUDA
graphs (graphs/) when the model runs on one CUDA device with every MoE layer's routed experts
on the CPU, unless `cuda_graphs` is off; everything else runs the same DecoderProgram eagerly.
A step with prompt tokens may stream some MoE layers'
routed experts to the GPU instead of handing its rows to the CPU (eager_step.py). A greedy
decode step may be launched while the step before runs (`launch`, engine.py's launch-ahead).
Start-up (runner_start_up.py) runs every shape a step can take once, so no request pays for
compiling a kernel.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from hybrid.engine.config import EngineConfig
from hybrid.engine.prefill import layered_prefill
from hybrid.engine.prefill.layered_passes import LayeredPasses
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
        hf = model.config
        self.chunk_size = config.chunk_size or runner_start_up.auto_chunk_size(
            self, max_request_tokens, progress)
        # a step carries at most max_batch_size decodes plus chunk_size prompt tokens
        self.max_tokens = self.chunk_size + config.max_batch_size
        self.bridge = ExpertsBridge(self.max_tokens, hf.hidden_size, hf.num_experts_per_tok,
                                    self.device)
        self.program = DecoderProgram(model, self.bridge)
        self.recorder = runner_start_up.install_recorder(model, self.program) \
            if config.record_routing else None
        self.max_pages = -(-max_request_tokens // config.page_size)
        # [max_batch_size] a step's picks on the device, which the next step launched ahead
        # reads as its decodes' inputs (-(row + 1): engine.py)
        self.carried_ids = torch.zeros(config.max_batch_size, dtype=torch.int64,
                                       device=self.device)
        # The model's own stream, not CUDA's legacy default one, where a small pinned copy (the
        # CPU experts' sum coming back) waits for the expert stream's uploads on their stream
        # (docs/long-prompts.md). Start-up and every step run on it.
        self.model_stream = torch.cuda.Stream(self.device, priority=-1) \
            if self.device.type == "cuda" else None
        # A prompt chunk passed over steps (layered_prefill.py) runs its layers on a stream of
        # its own while the host runs the decodes' CPU experts (docs/serving.md); the model
        # stream's higher priority keeps decode kernels first.
        job_stream = torch.cuda.Stream(self.device, priority=0) \
            if self.device.type == "cuda" and config.overlap_prefill \
            and not config.record_routing else None
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
        chunks = batch.chunks
        if not (self.launches_ahead and chunks and self.layered.job is None
                and all(len(c.token_ids) == 1 for c in chunks)):
            return None
        rows = SequenceRows.of(chunks)
        if self.graphs is None:
            return EagerLaunch(rows)
        return self.graphs.launch(rows) if len(rows) <= self.graphs.max_batch else None

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch, before_experts: Callable[[], None] | None = None,
            ahead: Callable[[], None] | None = None,
            launched: LaunchedGraph | EagerLaunch | None = None) -> StepResult:
        """One step: the batch's chunks in one forward, and the layered chunk's next layers.
        A decode's token -(j + 1) is carried_ids[j]. before_experts(): host work once the
        step's GPU work is launched, before the host drives its CPU experts (called once, by
        the time this returns). ahead(): host work beside the CPU experts of a whole-step
        graph once it read its staged rows (after an eager forward), where the next step may
        be launched (never beside a layered chunk). launched: this batch, launched already."""
        layers = len(self.program.moe_layers)
        if isinstance(launched, EagerLaunch):
            logits, picks, _, on_cpu = self._run(launched.rows, False, None, before_experts,
                                                 ahead)
            return StepResult(logits, list(batch.chunks), None, 0, on_cpu, picks)
        if launched is not None:  # a whole-step graph's
            logits, picks = self.graphs.drive(launched, None, before_experts, ahead)
            return StepResult(logits, list(batch.chunks), None, 0, layers, picks)
        chunks, layered = batch.chunks, self.layered
        new = finished = done = None
        streamed, advanced = 0, []  # advanced: the pass's pieces launched during the decodes
        if layered.job is None and self.stream is not None \
                and (new := layered_prefill.candidate(batch, self.placement, layers)) is not None:
            chunks = [x for x in chunks if x is not new]
        overlapped = layered.job is not None and layered.overlaps and bool(chunks)
        beside = (lambda: advanced.append(layered.advance(decodes=True))) if overlapped else None
        if layered.job is not None or new is not None:
            ahead = None  # the next step waits for the pass
        logits, picks, on_stream, on_cpu = self._run(
            SequenceRows.of(chunks), layered.job is None and new is None, beside, before_experts, ahead)
        if advanced:
            done, streamed, finished = advanced[0]
        if new is not None:  # after the decodes are queued: the pass's first expert copies
            # would otherwise stand ahead of their per-layer copies back (docs/serving.md)
            layered.start(new, self.placement)
        if layered.job is not None and not overlapped:
            done, streamed, finished = layered.advance(decodes=bool(chunks))
        layered.settle()  # the job's last pieces before its logits are read
        if done is not None:
            logits, picks = torch.cat([logits, done]), None
        completed = [c for c in batch.chunks if c is not new]
        if finished is not None:
            completed.append(finished)
        return StepResult(logits, completed, new, streamed + on_stream, on_cpu, picks)

    def drop_job(self, request=None) -> None:
        """Forget the layered chunk (of `request`, or any): its request was cancelled or its
        step failed."""
        self.layered.drop(request)

    def _run(self, chunks: list[SequenceRows], may_stream: bool, beside=None,
             before_experts=None, ahead=None) -> tuple[torch.Tensor, StepPicks | None, int, int]:
        """One forward over `chunks` (graphs for decode-only steps) -> (their logits, the
        graph's greedy picks of them or None, MoE layers streamed, MoE layers on the CPU).
        beside(): host work during the step (a whole-step graph runs its CPU experts
        meanwhile), else before it; before_experts(), ahead(): see run."""
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
        if ahead is not None:
            ahead()
        return logits, None, streamed, on_cpu

