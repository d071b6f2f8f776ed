"""A long prompt chunk's pass through the layers spread over several steps while other
requests decode, so their inter-token latency stays bounded (a streamed prompt step otherwise
holds every running stream for the whole pass; measurements: docs/long-prompts.md).

Policy: when a step carries decodes and one prompt chunk whose every MoE layer would stream,
the model runner takes the chunk out of the step and starts a job (layered_passes.py): its own
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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hybrid.engine.prefill.prefill_costs import ExpertPlacement
from hybrid.engine.scheduling.scheduler import ScheduledBatch, ScheduledChunk

if TYPE_CHECKING:
    from hybrid.engine.step.decoder import DecoderProgram


@dataclass
class LayeredPrefill:
    chunk: ScheduledChunk
    state: object  # the chunk's step_state.StepState, on the device between steps
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
