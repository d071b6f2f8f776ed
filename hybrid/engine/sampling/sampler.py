"""Pick the next token from a row of logits, and report log-probabilities.

The order is vLLM's: penalties (repetition, then frequency and presence) on the raw logits,
then temperature, min_p, top_k and top_p, then a draw. Greedy takes the argmax after the
penalties, so penalties steer greedy decoding too. Reported log-probabilities are always those
of the raw model distribution (after a grammar's mask), at least MIN_LOGPROB.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hybrid.engine.device_values import on_device
from hybrid.engine.sampling.draw import draw
from hybrid.engine.sampling.penalties import PenaltyState, apply_penalties, batch_penalties
from hybrid.engine.sampling.sampling_params import SamplingParams

# A token masked out (by a grammar) has log-probability -inf, which JSON cannot carry: reported
# as OpenAI reports such tokens.
MIN_LOGPROB = -9999.0


def reported(logprob: float) -> float:
    """A log-probability as reported: at least MIN_LOGPROB (JSON carries no -inf)."""
    return max(MIN_LOGPROB, logprob)


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


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator,
           prompt_ids: Sequence[int] = (), output_ids: Sequence[int] = ()) -> Sampled:
    """logits: [V] (any float dtype); prompt_ids and output_ids: the request's history so far.
    Greedy ties break toward the lowest id, as argmax does. While params.forced_ids lasts, its
    next token is the pick (reported with the model's log-probability)."""
    logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1)  # [V], reported as-is
    scores = apply_penalties(logits, params, prompt_ids, output_ids)  # [V]
    if len(output_ids) < len(params.forced_ids):
        token = params.forced_ids[len(output_ids)]
    elif params.is_greedy:
        token = int(torch.argmax(scores))
    else:
        probs = sampling_probs(scores, params)
        token = int(torch.multinomial(probs, 1, generator=generator))
    top: tuple[tuple[int, float], ...] = ()
    if params.logprobs:
        values, ids = torch.topk(logprobs, params.logprobs)
        top = tuple((int(i), reported(float(v))) for i, v in zip(ids, values))
    return Sampled(token, reported(float(logprobs[token])), top)


def sample_batch(logits: torch.Tensor, rows: Sequence[tuple[SamplingParams, torch.Generator,
                                                          Sequence[int], Sequence[int]]],
                 penalties: Sequence[PenaltyState | None] | None = None) -> list[Sampled]:
    """`launch_samples(...).result()`: the batch's picks, waited for."""
    return launch_samples(logits, rows, penalties).result()


@dataclass(frozen=True)
class LaunchedSamples:
    """A batch's picks decided on the device, on their way to the host."""

    table: torch.Tensor  # [R, 2 + 2k] float64: id, logprob, top ids, top logprobs per row
    ready: torch.cuda.Event | None  # recorded after the table's copy to the host
    asked: tuple[int, ...]  # each row's top log-probabilities asked for (<= k)

    def result(self) -> list[Sampled]:
        """Wait for the table and read it (ids are exact in float64)."""
        if self.ready is not None:
            self.ready.synchronize()
        k, out = (self.table.shape[1] - 2) // 2, []
        for m, r in zip(self.asked, self.table.tolist()):
            best = tuple((int(t), reported(v)) for t, v in zip(r[2:2 + m], r[2 + k:2 + k + m])) \
                if m else ()
            out.append(Sampled(int(r[0]), reported(r[1]), best))
        return out


def launch_samples(logits: torch.Tensor, rows: Sequence[tuple[SamplingParams, torch.Generator,
                                                            Sequence[int], Sequence[int]]],
                   penalties: Sequence[PenaltyState | None] | None = None,
                   carry: torch.Tensor | None = None, carry_rows: Sequence[int] | None = None
                   ) -> LaunchedSamples:
    """logits: [R, V] on the model's device; rows: (params, generator, prompt ids, output ids)
    per row; penalties: the penalized rows' states kept between steps (synced here; None: made
    for this call); carry: int64 on the device whose row carry_rows[i] (default i) gets row
    i's pick (the next step's inputs, before the host has them). Every row is decided on the device in one batch
    (penalties, batch_penalties; then argmax, the forced token or `draw.draw`; the chosen
    log-probability and the top log-probabilities), and only those few numbers cross to the
    host, in one copy that is not waited for here. A sampled row takes one uniform from its
    request's generator. Equal in distribution to `sample` on each row."""
    n = len(rows)
    x = logits[:n].float()  # [R, V]
    lse = torch.logsumexp(x, dim=-1, keepdim=True)  # [R, 1]
    scores = x
    penalized = [i for i, (p, _, _, _) in enumerate(rows) if p.has_penalties]
    if penalized:
        scores = x.clone()
        at = on_device(penalized, x.device)
        states = [(penalties[i] if penalties is not None and penalties[i] is not None
                   else PenaltyState(rows[i][2], x.shape[1], x.device)).sync(rows[i][3])
                  for i in penalized]
        scores[at] = batch_penalties(x[at], [rows[i][0] for i in penalized], states)
    ids = scores.argmax(dim=-1)  # [R]: greedy's pick (the lowest id among ties)
    forced = {i: p.forced_ids[len(done)] for i, (p, _, _, done) in enumerate(rows)
              if len(done) < len(p.forced_ids)}
    drawn = [i for i, (p, _, _, _) in enumerate(rows) if not p.is_greedy and i not in forced]
    if drawn:
        u = on_device([float(torch.rand((), dtype=torch.float64, generator=rows[i][1]))
                       for i in drawn], x.device, torch.float64)  # [D]
        at = on_device(drawn, x.device)
        ids[at] = draw(scores[at], [rows[i][0] for i in drawn], u)
    if forced:
        ids[on_device(list(forced), x.device)] = on_device(list(forced.values()), x.device)
    if carry is not None and (carry_rows is None or list(carry_rows) == list(range(n))):
        carry[:n].copy_(ids)
    elif carry is not None:
        carry[on_device(list(carry_rows), carry.device)] = ids
    ids = ids[:, None]  # [R, 1]
    k = max((p.logprobs or 0 for p, _, _, _ in rows), default=0)
    cols = [ids.double(), (x.gather(1, ids) - lse).double()]
    if k:
        top = torch.topk(x, min(k, x.shape[1]), dim=-1)
        cols += [top.indices.double(), (top.values - lse).double()]
    table = torch.cat(cols, dim=1)  # [R, 2 + 2k]
    ready = None
    if table.is_cuda:  # into pinned memory (the caching host allocator's), then an event
        table = table.to("cpu", non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
    return LaunchedSamples(table, ready, tuple(p.logprobs or 0 for p, _, _, _ in rows))


def sampling_probs(scores: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """scores: [V] penalized logits -> [V] the distribution a non-greedy draw uses."""
    scaled = scores / params.temperature
    if params.min_p > 0:
        probs = torch.softmax(scaled, dim=-1)
        scaled = scaled.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    if 0 < params.top_k < scaled.numel():
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        cum_before = torch.cumsum(probs, dim=-1) - probs
        drop = cum_before >= params.top_p
        scaled = scaled.scatter(0, order[drop], float("-inf"))
    return torch.softmax(scaled, dim=-1)
