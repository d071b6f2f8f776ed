"""DeepSeek-V3.2's lightning indexer and the sparse MLA attention it drives, in torch: what
operators off gpu_kernels run, and (`*_ref`, float64, one query at a time) the definition the
tests hold them and transformers' DeepseekV32Indexer to.

Per layer the indexer has Hi small query heads and ONE key head of D dims, laid out
[rope | nope] (the first `rope` dims rotate, with half-split "NEOX" RoPE, unlike MLA's adjacent
pairs, at the same frequencies and YaRN scale). With x the attention's normed input and q_a the
normed q_a latent of MLA's own query path:
    q[s, h] = rope(wq_b q_a[s])[h]         # [T, Hi, D]
    k[t]    = rope(LayerNorm(wk x[t]))      # [T, D]   cached per token beside the latent
    w[s, h] = weights_proj x[s]             # [T, Hi]
    score[s, t] = sum_h relu(q[s, h] . k[t] / sqrt(D)) * w[s, h] / sqrt(Hi)
Each query keeps the top min(index_topk, keys) keys by score among those causality lets it see
(masked keys score -inf before the top-k) and attends, absorbed, to those alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hybrid.ops.mla_torch import attend

LAYER_NORM_EPS = 1e-6  # transformers' and the reference's indexer k_norm


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, rope_scale: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """positions: [N] -> (cos, sin) [N, rope / 2], YaRN's scale folded in (as MLA's RoPE)."""
    ang = positions.float()[:, None] * inv_freq[None, :]  # [N, rope / 2]
    return ang.cos() * rope_scale, ang.sin() * rope_scale


def rotate_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split RoPE on the first 2 * cos.shape[-1] dims of x [..., D], the rest kept.
    cos/sin: x's leading dims without its head dim, [..., rope / 2] -> rotated copy."""
    half = cos.shape[-1]
    while cos.dim() < x.dim():
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def index_keys(k: torch.Tensor, norm_weight: torch.Tensor, norm_bias: torch.Tensor,
               cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """wk's product k: [..., D] -> the cached key: LayerNorm (weight, bias), then RoPE."""
    normed = F.layer_norm(k.float(), (k.shape[-1],), norm_weight, norm_bias, LAYER_NORM_EPS)
    return rotate_halves(normed, cos, sin)


def index_scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """q: [t, Hi, D] (rotated), w: [t, Hi], keys: [S, D] -> scores [t, S] f32. A head at a
    time: memory [t, S], not [t, Hi, S] (64 heads of an 8K-token chunk over 8K keys: 17 GB)."""
    heads, dim = q.shape[-2], q.shape[-1]
    k = keys.float().t() * dim ** -0.5  # [D, S]
    q, w = q.float(), w.float()
    out = torch.zeros(q.shape[0], keys.shape[0], dtype=torch.float32, device=q.device)
    for h in range(heads):
        out += (q[:, h] @ k).relu_() * w[:, h:h + 1]
    return out * heads ** -0.5


def top_k_keys(scores: torch.Tensor, allowed: torch.Tensor, topk: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """scores, allowed: [t, S] -> (key indices [t, K], which of them may be attended [t, K]),
    K = min(topk, S). A query that sees fewer than K keys gets some masked ones too (-inf
    scores): the second tensor drops them. Equal scores go to the lower position (a stable
    sort, not topk's unspecified order), so a query's choice never depends on how many masked
    keys its row carries (chunking, batching)."""
    k = min(topk, scores.shape[-1])
    masked = scores.masked_fill(~allowed, float("-inf"))  # [t, S]
    ids = masked.sort(dim=-1, descending=True, stable=True).indices[:, :k]  # [t, K]
    return ids, allowed.gather(-1, ids)


def sparse_attend(q_lat: torch.Tensor, q_rope: torch.Tensor, kv: torch.Tensor,
                  ids: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
    """Each query attends, absorbed, to its own K keys only. q_lat [t, h, c], q_rope [t, h, r],
    kv [S, c + r] f32, ids/keep [t, K] (top_k_keys') -> o_c [t, h, c]."""
    picked = kv[ids]  # [t, K, c + r]
    return attend(q_lat.unsqueeze(1), q_rope.unsqueeze(1), picked, keep.unsqueeze(1),
                  scale).squeeze(1)


# -- float64 references: one query at a time, the definition spelled out -----------------------

def index_scores_ref(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The same contract as index_scores, in float64, a query and a head at a time."""
    t, heads, dim = q.shape
    out = torch.zeros(t, keys.shape[0], dtype=torch.float64)
    for s in range(t):
        for h in range(heads):
            dots = keys.double() @ q[s, h].double() / dim ** 0.5  # [S]
            out[s] += dots.clamp(min=0) * w[s, h].double()
    return out / heads ** 0.5


def sparse_attention_ref(q_lat: torch.Tensor, q_rope: torch.Tensor, kv: torch.Tensor,
                         scores: torch.Tensor, allowed: torch.Tensor, topk: int,
                         scale: float) -> torch.Tensor:
    """Float64: per query, softmax attention over its allowed keys of the top min(topk, S) by
    score (ties broken by the lower position). q_lat [t, h, c], q_rope [t, h, r],
    kv [S, c + r], scores/allowed [t, S] -> o_c [t, h, c]."""
    c = q_lat.shape[-1]
    kv = kv.double()
    out = torch.zeros(q_lat.shape, dtype=torch.float64)
    for s in range(q_lat.shape[0]):
        seen = [j for j in range(kv.shape[0]) if allowed[s, j]]
        best = sorted(seen, key=lambda j: (-float(scores[s, j]), j))[:topk]
        if not best:
            continue
        keys = kv[best]  # [K, c + r]
        logits = (q_lat[s].double() @ keys[:, :c].T + q_rope[s].double() @ keys[:, c:].T) * scale
        out[s] = torch.softmax(logits, dim=-1) @ keys[:, :c]  # [h, c]
    return out
