"""A step run eagerly, not as a CUDA graph: every prefill step, and decodes where no graph
serves them. Its rows are packed and copied to the device once (ForwardBatch), a decode whose
input is still only on the device (-(j + 1), the launch-ahead's pending token) takes it from
the runner's carried ids, the decode attention backend prepares, and a step with prompt tokens
may stream some MoE layers' routed experts to the GPU instead of handing its rows to the CPU
(prefill_costs.py chooses, expert_stream.py streams). Takes the ModelRunner (untyped: this sits
below it)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from hybrid.engine.step.forward_batch import ForwardBatch, SequenceRows
from hybrid.engine.step.step_state import StepState

log = logging.getLogger("hybrid.engine")


@dataclass(frozen=True)
class EagerLaunch:
    """An eager decode step launched ahead (ModelRunner.launch): its rows, as they were then,
    run when the step is driven (as a stream would run a launched graph then)."""

    rows: list[SequenceRows]


def run(runner, chunks: list[SequenceRows], may_stream: bool) -> tuple[torch.Tensor, int, int]:
    """One eager forward over `chunks` (decodes first, at least one chunk) -> (logits [R, V]
    of the rows that sample, MoE layers streamed, MoE layers on the CPU)."""
    fb = ForwardBatch.build(chunks, runner.page_size, runner.cache, runner.device)
    if any(c.token_ids[0] < 0 for c in chunks[:fb.num_decodes]):
        ids = fb.input_ids[:fb.num_decodes]  # [B] -(j + 1): carried_ids[j]
        ids.copy_(torch.where(ids < 0, runner.carried_ids[(-ids - 1).clamp(min=0)], ids))
    runner.attention.prepare(fb)
    layers = len(runner.program.moe_layers)
    streamed = runner.placement.streamed(fb.num_tokens,
                                         any(len(c.token_ids) > 1 for c in chunks)) \
        if may_stream else ()
    if streamed:
        runner.stream.begin(streamed)
        log.debug("step of %d tokens streams %d of %d MoE layers' experts", fb.num_tokens,
                  len(streamed), layers)
    logits = runner.program.run(StepState(fb, num_real=fb.num_tokens,
                                          streamed=frozenset(streamed)))
    return logits, len(streamed), layers - len(streamed)
