"""Repetition, frequency and presence penalties on the raw logits, before temperature and the
filters (vLLM's order): `apply_penalties` on one row (the reference) and `batch_penalties` on a
batch's penalized rows at once, on the logits' device.

Repetition (vLLM's and HF's, > 0, 1 = off) divides positive and multiplies negative logits of
every token in the prompt or generated so far; frequency and presence (OpenAI's) subtract
`frequency` per occurrence and `presence` once for each token generated so far.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

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
        seen[torch.as_tensor(prompt_ids, dtype=torch.long).reshape(-1).to(logits.device)] = True
        seen[out_ids] = True
        rp = params.repetition_penalty
        penalized = torch.where(logits > 0, logits / rp, logits * rp)
        logits = torch.where(seen, penalized, logits)
    if params.presence_penalty or params.frequency_penalty:
        counts = torch.bincount(out_ids, minlength=vocab).to(logits.dtype)  # [V]
        logits = (logits - params.frequency_penalty * counts
                  - params.presence_penalty * (counts > 0).to(logits.dtype))
    return logits


def batch_penalties(logits: torch.Tensor, params: Sequence[SamplingParams],
                    prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]
                    ) -> torch.Tensor:
    """logits: [P, V] float32, a row per request with penalties -> [P, V], equal to
    apply_penalties on each row. The histories cross to the device padded, one copy each, and
    nothing is read back (bincount would read the largest id: counts are a scatter_add)."""
    p, vocab = logits.shape
    dev = logits.device
    table = torch.tensor([[q.repetition_penalty, q.frequency_penalty, q.presence_penalty]
                          for q in params], dtype=logits.dtype).to(dev)  # [P, 3]
    counts = torch.zeros(p, vocab + 1, dtype=logits.dtype, device=dev)  # column V: padding
    out_ids = _padded(outputs, vocab).to(dev)  # [P, O]
    counts.scatter_add_(1, out_ids, torch.ones(out_ids.shape, dtype=logits.dtype, device=dev))
    counts = counts[:, :vocab]  # [P, V]
    if any(q.repetition_penalty != 1.0 for q in params):
        seen = torch.zeros(p, vocab + 1, dtype=torch.bool, device=dev)
        history = _padded([list(a) + list(b) for a, b in zip(prompts, outputs, strict=True)],
                          vocab).to(dev)  # [P, L]
        seen = seen.scatter_(1, history, True)[:, :vocab]  # [P, V]
        rp = table[:, :1]  # [P, 1]; 1 leaves a row as it is
        logits = torch.where(seen, torch.where(logits > 0, logits / rp, logits * rp), logits)
    return logits - table[:, 1:2] * counts - table[:, 2:3] * (counts > 0).to(logits.dtype)


def _padded(ids: Sequence[Sequence[int]], pad: int) -> torch.Tensor:
    """[P, max length] int64 on the host, each row's ids then `pad`."""
    out = torch.full((len(ids), max((len(r) for r in ids), default=0) or 1), pad,
                     dtype=torch.long)
    for i, r in enumerate(ids):
        if len(r):
            out[i, :len(r)] = torch.as_tensor(r, dtype=torch.long)
    return out
