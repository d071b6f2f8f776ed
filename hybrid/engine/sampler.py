"""Pick the next token from a row of logits, and report log-probabilities."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybrid.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class Sampled:
    token_id: int
    logprob: float  # of the chosen token under the model's distribution
    top_logprobs: tuple[tuple[int, float], ...]  # the most likely tokens, best first


def make_generator(params: SamplingParams) -> torch.Generator:
    gen = torch.Generator(device="cpu")
    if params.seed is not None:
        gen.manual_seed(params.seed)
    else:
        gen.seed()
    return gen


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> Sampled:
    """logits: [V] (any float dtype). Greedy ties break toward the lowest id, as argmax does."""
    logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1)
    if params.is_greedy:
        token = int(torch.argmax(logits))
    else:
        token = _sample_filtered(logits, params, generator)
    top: tuple[tuple[int, float], ...] = ()
    if params.logprobs:
        values, ids = torch.topk(logprobs, params.logprobs)
        top = tuple((int(i), float(v)) for i, v in zip(ids, values))
    return Sampled(token, float(logprobs[token]), top)


def _sample_filtered(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    scaled = logits / params.temperature
    if params.top_k > 0 and params.top_k < scaled.numel():
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        cum_before = torch.cumsum(probs, dim=-1) - probs
        drop = cum_before >= params.top_p
        scaled = scaled.scatter(0, order[drop], float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
