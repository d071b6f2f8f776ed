"""A long prompt chunk's pass through the layers spread over several steps while other
requests decode, so their inter-token latency stays bounded (a streamed prompt step otherwise
holds every running stream for the whole pass; measurements: docs/long-prompts.md).

Policy: when a step carries decodes and one prompt chunk whose every MoE layer would stream,
the model runner takes the chunk out of the step and starts a job (`LayeredPasses`): its own
ForwardBatch and step state, kept on the GPU between steps, every MoE layer streamed (the
stream's queue runs on across steps, so the next layers' copies proceed during the decodes).
Each later step runs the decodes first (their CUDA graph), then advances the job by
`layers_per_step` MoE layers; the step where the last layer and the head run returns the
chunk's logits. The scheduler holds the request back meanwhile (Request.in_flight). One job at
a time; other prompt chunks of those steps run on the CPU experts; with no decode left in a
step the job runs to its end.

A job's first two steps carry less: the step that starts it only queues its index copy and its
first expert copies (the model stream would otherwise stand behind them), the next runs the
part before the first MoE layer (embedding, dense layers, the first attention); each later
step one MoE layer's experts and the next layer's attention, so no step carries the first
layers' extra work on top of a layer's.

`layers_per_step` keeps a step within `EngineConfig.decode_gap` decode steps: as many streamed
layers (at the chunk's token count, by the start-up cost model) as fit in `share`
(EngineConfig.prompt_share) times a one-token decode step (as start-up timed its graphs; where
it timed none, its CPU experts by the cost model), so the step stays within that bound even
where the layers run after the decodes rather than beside them; one layer a step where nothing
was measured.

Invariants (`LayeredPasses`): one job at a time; its pieces run on `job_stream` where there is
one (queued before the step's decodes, so the GPU runs them while the host runs the decodes' CPU
experts), else on the model stream; a job's last logits are read on the model stream only after
it waited for `job_stream` (`settle`), and a dropped job's queued work finishes before any
later step reuses its pages and buffers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from hybrid.engine.prefill.prefill_costs import ExpertPlacement
from hybrid.engine.scheduling.scheduler import ScheduledBatch, ScheduledChunk
from hybrid.engine.step.decoder import DecoderProgram
from hybrid.engine.step.forward_batch import ForwardBatch, SequenceRows
from hybrid.engine.step.kv_cache import PagedLatentCache
from hybrid.engine.step.step_result import StepResult
from hybrid.engine.step.step_state import StepState

log = logging.getLogger("hybrid.engine")


@dataclass
class LayeredPrefill:
    chunk: ScheduledChunk
    state: StepState  # the chunk's, on the device between steps
    layers_per_step: int
    pieces: int = 0  # the step's pieces run so far (decoder.DecoderProgram.run_pieces)
    waited: bool = False  # the step that started it has passed (it runs no piece)

    def next_stop(self, program: DecoderProgram, decodes: bool) -> int:
        """Where this step's run ends: piece 0 alone first (all before the first MoE layer),
        then `layers_per_step` more MoE layers; everything left when no decode waits."""
        if not decodes:
            return program.num_pieces
        if self.pieces == 0:
            return 1
        passed = program.layers_passed(self.pieces)
        return min(program.num_pieces, program.after_layer(passed + self.layers_per_step - 1))


def candidate(batch: ScheduledBatch, placement: ExpertPlacement,
              num_layers: int) -> ScheduledChunk | None:
    """The chunk to spread over steps: the step's only prompt chunk, when the step also
    decodes and every MoE layer would stream at the chunk's token count; else None."""
    prompts = [c for c in batch.chunks if c.request.is_prefilling]
    if len(prompts) != 1 or len(prompts) == len(batch.chunks) or num_layers == 0:
        return None
    chunk = prompts[0]
    return chunk if candidate_tokens(placement, len(chunk.token_ids), num_layers) else None


def candidate_tokens(placement: ExpertPlacement, tokens: int, num_layers: int) -> bool:
    """A chunk of `tokens` tokens beside decodes passes the layers over steps: every MoE layer
    would stream it."""
    return num_layers > 0 and len(placement.streamed(tokens, True)) == num_layers


def layers_per_step(placement: ExpertPlacement, tokens: int, num_layers: int,
                    share: float, decode_ms: float | None = None) -> int:
    """decode_ms: a one-token decode step as timed, or None."""
    costs = placement.costs
    if costs is None:
        return 1
    streamed = costs.costs(tokens, costs.layer_nbytes)[0]  # ms a streamed layer, these tokens
    decode = decode_ms if decode_ms is not None \
        else num_layers * costs.costs(1, costs.layer_nbytes)[1]  # a decode step's CPU experts
    return max(1, int(share * decode // max(streamed, 1e-3)))


class LayeredPasses:
    def __init__(self, program: DecoderProgram, cache: PagedLatentCache, page_size: int,
                 device: torch.device, model_stream, job_stream, share: float) -> None:
        """model_stream: the steps' stream (None on the CPU); job_stream: the jobs' own, or
        None to run them on the model stream; share: EngineConfig.prompt_share."""
        self.program, self.cache, self.page_size, self.device = program, cache, page_size, device
        self.share = share
        self.decode_ms: float | None = None  # a one-token decode step, timed at start-up
        self.model_stream, self.job_stream = model_stream, job_stream
        self.job: LayeredPrefill | None = None
        self.count = 0  # chunks passed over several steps so far
        self._retired = None  # a job finished this step: alive until the model stream waits

    @property
    def overlaps(self) -> bool:
        """A job's pieces run on a stream of their own, beside the step's decodes."""
        return self.job_stream is not None

    def run_step(self, batch: ScheduledBatch, placement: ExpertPlacement | None, forward,
                 before_experts=None, ahead=None) -> StepResult:
        """One step of the batch beside the job: a prompt chunk that should pass the layers
        over steps (`placement` given, no job yet) is taken out and started after the rest's
        forward is queued; the job's next layers run beside the decodes' CPU experts (on its
        own stream) or after them. forward(rows, may_stream, beside, before_experts, ahead)
        -> (logits, picks, MoE layers streamed, MoE layers on the CPU) runs the rest; no step
        is launched ahead (`ahead` dropped) while a job runs or starts."""
        layers = len(self.program.moe_layers)
        chunks, new = batch.chunks, None
        done = finished = None
        streamed, advanced = 0, []  # advanced: the pass's pieces launched during the decodes
        if self.job is None and placement is not None \
                and (new := candidate(batch, placement, layers)) is not None:
            chunks = [x for x in chunks if x is not new]
        overlapped = self.job is not None and self.overlaps and bool(chunks)
        beside = (lambda: advanced.append(self.advance(decodes=True))) if overlapped else None
        if self.job is not None or new is not None:
            ahead = None  # the next step waits for the pass
        logits, picks, on_stream, on_cpu = forward(
            SequenceRows.of(chunks), self.job is None and new is None, beside, before_experts,
            ahead)
        if advanced:
            done, streamed, finished = advanced[0]
        if new is not None:  # after the decodes are queued: the pass's first expert copies
            # would otherwise stand ahead of their per-layer copies back (docs/serving.md)
            self.start(new, placement)
        if self.job is not None and not overlapped:
            done, streamed, finished = self.advance(decodes=bool(chunks))
        self.settle()  # the job's last pieces before its logits are read
        if done is not None:
            logits, picks = torch.cat([logits, done]), None
        completed = [c for c in batch.chunks if c is not new]
        if finished is not None:
            completed.append(finished)
        return StepResult(logits, completed, new, streamed + on_stream, on_cpu, picks)

    def start(self, chunk: ScheduledChunk, placement: ExpertPlacement) -> None:
        """Take `chunk` out of the step: its forward state built, every MoE layer's expert
        copies queued; its layers run in the next steps' `advance`."""
        layers = len(self.program.moe_layers)
        rows = SequenceRows(chunk.token_ids, chunk.request.page_ids, chunk.start, chunk.samples)
        fb = ForwardBatch.build([rows], self.page_size, self.cache, self.device)
        self.program.stream.begin(list(range(layers)))
        per_step = layers_per_step(placement, len(chunk.token_ids), layers,
                                   self.share, self.decode_ms)
        if self.job_stream is not None:  # its pieces read what the model stream queued
            self.job_stream.wait_stream(self.model_stream)
        self.job = LayeredPrefill(
            chunk, StepState(fb, num_real=fb.num_tokens, streamed=frozenset(range(layers))),
            per_step)
        self.count += 1
        log.debug("a %d-token chunk passes the layers over steps, %d MoE layers a step",
                  len(chunk.token_ids), per_step)

    def advance(self, decodes: bool) -> tuple[torch.Tensor | None, int, ScheduledChunk | None]:
        """The job's next MoE layers (all that remain when no decode waits) -> (its logits
        rows when its pass ended (none if it does not sample), else None; the MoE layers it
        streamed; its chunk when its pass ended, else None)."""
        job = self.job
        if decodes and not job.waited:  # the starting step: its copies queue, nothing runs
            job.waited = True
            return None, 0, None
        program = self.program
        stop, before = job.next_stop(program, decodes), program.layers_passed(job.pieces)
        if self.job_stream is None:
            logits = self.program.run_pieces(job.state, job.pieces, stop)
        else:
            with torch.cuda.stream(self.job_stream):
                logits = self.program.run_pieces(job.state, job.pieces, stop)
        job.pieces = stop
        streamed = program.layers_passed(stop) - before
        if logits is None:
            return None, streamed, None
        if self.job_stream is not None:
            # read on the model stream (after `settle` makes it wait): not reused before
            # that; the job's tensors stay alive until then
            logits.record_stream(self.model_stream)
            self._retired = job
        self.job = None
        return logits, streamed, job.chunk

    def settle(self) -> None:
        """Before the step's logits are read: the model stream waits for a job that ended."""
        if self._retired is not None:
            self.model_stream.wait_stream(self.job_stream)
            self._retired = None

    def drop(self, request=None) -> None:
        """Forget the job (of `request`, or any): its request was cancelled or its step
        failed. Work already queued on the device finishes before any later step's."""
        if self.job is not None and (request is None or self.job.chunk.request is request):
            if self.job_stream is not None:  # its pages and buffers are reused after this
                self.model_stream.wait_stream(self.job_stream)
            self.job = None
