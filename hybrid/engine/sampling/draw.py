"""Sampled tokens for many rows at once, on the logits' device: temperature, min_p, top_k and
top_p as `sampler.sampling_probs` applies them to one row (its plain reference), then one draw
a row by the inverse of the kept tokens' cumulative distribution.

    draw(scores [S, V], params, u [S]) -> token ids [S] (int64, scores' device)

Why not a row at a time on the host: a row of a 100k-token vocabulary sorted for top_p costs
milliseconds on a CPU whose cores run the experts, and every sampled stream pays it every step.
Here each filter is a few batched launches, and top_k/top_p rows sort their CANDIDATES best
tokens, which is exact whenever those hold the kept set; the rows where they do not (a flat
distribution under top_p) are sorted whole (on a GPU every such row is, beside its candidates,
so that nothing is read back: a draw may be queued behind a step that waits for the host).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from hybrid.engine.device_values import on_device
from hybrid.engine.sampling.sampling_params import SamplingParams

# Tokens a top_k/top_p row sorts first: a nucleus is usually far smaller.
CANDIDATES = 1024


def draw(scores: torch.Tensor, params: Sequence[SamplingParams], u: torch.Tensor
         ) -> torch.Tensor:
    """scores: [S, V] penalized logits (float32); params: a row's settings (none greedy);
    u: [S] float64 uniforms in [0, 1), one a row from its request's generator. The token of
    row i is the first whose cumulative kept probability exceeds u[i] times the kept mass."""
    s, vocab = scores.shape
    dev = scores.device
    table = on_device([[p.temperature, p.min_p, p.top_k if 0 < p.top_k < vocab else 0, p.top_p]
                       for p in params], dev, torch.float32)  # [S, 4]
    scaled = scores / table[:, :1]  # [S, V]
    if any(p.min_p > 0 for p in params):
        # p < min_p * p_max  <=>  scaled < max + log(min_p); min_p 0 gives -inf: keeps all
        floor = scaled.amax(-1, keepdim=True) + torch.log(table[:, 1:2])  # [S, 1]
        scaled = scaled.masked_fill(scaled < floor, -math.inf)
    whole = [i for i, p in enumerate(params) if not (0 < p.top_k < vocab or p.top_p < 1)]
    if len(whole) == s:  # every kept token in id order: no sort needed
        return _inverse_cdf(_unnormalized(scaled), u)
    rest = sorted(set(range(s)) - set(whole))
    ks = [params[i].top_k for i in rest]
    # candidates: the largest top_k where every such row has one (its kept set lies inside),
    # else at least CANDIDATES; known here, not read back from the device
    most = max(ks) if all(0 < k < vocab for k in ks) else max(CANDIDATES, *ks)
    if not whole:
        return _ranked(scaled, table, u, most)
    tokens = torch.empty(s, dtype=torch.long, device=dev)
    rows = on_device(whole, dev)
    tokens[rows] = _inverse_cdf(_unnormalized(scaled[rows]), u[rows])
    rows = on_device(rest, dev)
    tokens[rows] = _ranked(scaled[rows], table[rows], u[rows], most)
    return tokens


def _unnormalized(scaled: torch.Tensor) -> torch.Tensor:
    """[R, V] -> [R, V] probabilities times a row's constant (what _inverse_cdf needs)."""
    return torch.exp(scaled - scaled.amax(-1, keepdim=True))


def _ranked(scaled: torch.Tensor, table: torch.Tensor, u: torch.Tensor, most: int,
            sort_all: bool | None = None) -> torch.Tensor:
    """Rows under top_k and/or top_p: their `most` best tokens sorted, then the whole row
    sorted where those may miss a kept token. sort_all (default: on a GPU): every row is also
    sorted whole and the covered rows keep their candidates' token, the same tokens without
    asking the device which rows are covered (a wait that a step launched ahead, sitting on
    the stream, would make endless: engine.py's invariant)."""
    vocab = scaled.shape[1]
    c = min(vocab, most)
    probs, ids, covered = _filtered(scaled, table, c)
    tokens = ids.gather(1, _inverse_cdf(probs, u)[:, None]).flatten()  # [R]
    if c == vocab:
        return tokens
    if scaled.is_cuda if sort_all is None else sort_all:
        probs_all, ids_all, _ = _filtered(scaled, table, vocab)
        whole = ids_all.gather(1, _inverse_cdf(probs_all, u)[:, None]).flatten()  # [R]
        return torch.where(covered, tokens, whole)
    if not bool(covered.all()):
        rest = (~covered).nonzero().flatten()
        probs_all, ids_all, _ = _filtered(scaled[rest], table[rest], vocab)
        tokens[rest] = ids_all.gather(1, _inverse_cdf(probs_all, u[rest])[:, None]).flatten()
    return tokens


def _filtered(scaled: torch.Tensor, table: torch.Tensor, c: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The c best tokens of each row, best first: (kept probabilities [R, c], unnormalized;
    their ids [R, c]; [R] whether every token the filters keep is among them)."""
    vals, ids = scaled.topk(c, dim=-1, sorted=True)  # [R, c]
    k = table[:, 2:3]  # [R, 1], 0: no top_k
    col = torch.arange(c, device=scaled.device)[None, :]  # [1, c]
    in_k = (k == 0) | (col < k)  # [R, c]
    vals = vals.masked_fill(~in_k, -math.inf)
    # top_p renormalizes over what min_p and top_k kept: the c tokens hold it under top_k
    total = vals.logsumexp(-1)  # [R]
    if c < scaled.shape[1]:  # rows without top_k: over the whole row
        total = torch.where(k[:, 0] > 0, total, scaled.logsumexp(-1))
    probs = torch.exp(vals - total[:, None])  # [R, c]
    before = torch.cumsum(probs, -1) - probs  # the mass of the better tokens
    top_p = table[:, 3:4]
    probs = probs.masked_fill((top_p < 1) & (before >= top_p), 0.0)
    # covered: top_k within c, or top_p reached inside the c tokens
    covered = (k[:, 0] > 0) | ((top_p[:, 0] < 1) & (before[:, -1] + probs[:, -1] >= top_p[:, 0]))
    return probs, ids, covered


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor, block: int = 256) -> torch.Tensor:
    """[R, N] kept probabilities (any scale, 0: dropped), u [R] -> [R] the column drawn: the
    first whose cumulative sum exceeds u times the row's sum, found in two levels (the block,
    then the column in it) so no float64 scan runs over the whole row. Never a dropped column
    (float rounding falls back to the block's last kept column)."""
    r, n = probs.shape
    pad = -n % block  # none for DeepSeek's vocabularies (102400, 129280)
    blocks = (torch.nn.functional.pad(probs, (0, pad)) if pad else probs).view(r, -1, block)
    sums = torch.cumsum(blocks.sum(-1, dtype=torch.float64), -1)  # [R, B]
    target = u * sums[:, -1]  # [R]
    b = torch.searchsorted(sums, target[:, None], right=True).clamp_(max=sums.shape[1] - 1)
    before = torch.where(b > 0, sums.gather(1, (b - 1).clamp(min=0)), 0.0).flatten()  # [R]
    inner = blocks[torch.arange(r, device=probs.device), b.flatten()]  # [R, block]
    col = torch.searchsorted(torch.cumsum(inner.double(), -1), (target - before)[:, None],
                             right=True).clamp_(max=block - 1).flatten()  # [R]
    kept = inner > 0
    last = torch.where(kept, torch.arange(block, device=probs.device), -1).amax(-1)  # [R]
    col = torch.where(kept.gather(1, col[:, None]).flatten(), col, last.clamp(min=0))
    # a row of NaNs (a model gone wrong) keeps none: column 0 then, never an index out of range
    return b.flatten() * block + col
