"""Repetition, frequency and presence penalties on the raw logits, before temperature and the
filters (vLLM's order): `apply_penalties` on one row (the reference) and `batch_penalties` on a
batch's penalized rows at once, on the logits' device, from each request's `PenaltyState`.

Repetition (vLLM's and HF's, > 0, 1 = off) divides positive and multiplies negative logits of
every token in the prompt or generated so far; frequency and presence (OpenAI's) subtract
`frequency` per occurrence and `presence` once for each token generated so far.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hybrid.engine.device_values import on_device
from hybrid.engine.sampling.sampling_params import SamplingParams


def apply_penalties(logits: torch.Tensor, params: SamplingParams, prompt_ids: Sequence[int],
                    output_ids: Sequence[int]) -> torch.Tensor:
    """logits: [V] float32 -> [V]; the input is returned untouched when no penalty is set."""
    if not params.has_penalties:
        return logits
    vocab = logits.numel()
    out_ids = torch.as_tensor(output_ids, dtype=torch.long).reshape(-1).to(logits.device)  # [O]
    if params.repetition_penalty != 1.0:
        seen = torch.zeros(vocab, dtype=torch.bool, device=logits.device)  # [V]: prompt or output
        seen.index_fill_(0, torch.as_tensor(prompt_ids, dtype=torch.long).reshape(-1)
                         .to(logits.device), True)
        seen.index_fill_(0, out_ids, True)
        rp = params.repetition_penalty
        penalized = torch.where(logits > 0, logits / rp, logits * rp)
        logits = torch.where(seen, penalized, logits)
    if params.presence_penalty or params.frequency_penalty:
        counts = torch.bincount(out_ids, minlength=vocab).to(logits.dtype)  # [V]
        logits = (logits - params.frequency_penalty * counts
                  - params.presence_penalty * (counts > 0).to(logits.dtype))
    return logits


class PenaltyState:
    """One request's penalty inputs on the logits' device, grown by its new tokens only: which
    tokens its prompt and output hold (`seen`, for repetition) and how often each was generated
    (`counts`, for frequency and presence). Kept from step to step, so a long history is sent
    to the device once, not every step."""

    def __init__(self, prompt_ids: Sequence[int], vocab: int, device: torch.device) -> None:
        self.seen = torch.zeros(vocab, dtype=torch.bool, device=device)  # [V]
        if len(prompt_ids):
            # index_fill_, not `seen[ids] = True`: setting a CUDA tensor's items to a Python
            # scalar copies the scalar from the host and waits for the stream to get there
            self.seen.index_fill_(0, on_device(list(prompt_ids), device), True)
        self.counts = torch.zeros(vocab, dtype=torch.float32, device=device)  # [V]
        self.applied = 0  # output tokens already in seen and counts

    def sync(self, output_ids: Sequence[int]) -> PenaltyState:
        """Take in the output tokens since the last sync (usually one); -> self."""
        if len(output_ids) > self.applied:
            new = on_device(list(output_ids[self.applied:]), self.seen.device)  # [N]
            self.seen.index_fill_(0, new, True)
            # scatter_add_ (atomic adds of ones: exact in any order), not bincount, whose
            # size is read back from a GPU, nor an accumulating index_put_, which sorts
            self.counts.scatter_add_(0, new, torch.ones(new.shape, device=new.device))
            self.applied = len(output_ids)
        return self


def batch_penalties(logits: torch.Tensor, params: Sequence[SamplingParams],
                    states: Sequence[PenaltyState]) -> torch.Tensor:
    """logits: [P, V] float32, a row per request with penalties, states: theirs, synced ->
    [P, V], equal to apply_penalties on each row."""
    dev = logits.device
    table = on_device([[q.repetition_penalty, q.frequency_penalty, q.presence_penalty]
                       for q in params], dev, logits.dtype)  # [P, 3]
    counts = torch.stack([s.counts for s in states])  # [P, V]
    if any(q.repetition_penalty != 1.0 for q in params):
        seen = torch.stack([s.seen for s in states])  # [P, V]
        rp = table[:, :1]  # [P, 1]; 1 leaves a row as it is
        logits = torch.where(seen, torch.where(logits > 0, logits / rp, logits * rp), logits)
    return logits - table[:, 1:2] * counts - table[:, 2:3] * (counts > 0).to(logits.dtype)
