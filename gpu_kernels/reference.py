"""Torch references of the gpu_kernels operators that need no Triton (norms, RoPE, routing).

The kernels' tests compare against these; the CPU placements of the same operators run them
(hybrid/ops), so both devices compute one definition. Shapes as in the kernels' docstrings.
"""

from __future__ import annotations

import math

import torch


def add_rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float,
                    delta: torch.Tensor | None = None, delta2: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """x: [T, H] f32, updated in place by the deltas -> normed [T, H] (fused.add_rmsnorm)."""
    if delta is not None:
        x += delta
        if delta2 is not None:
            x += delta2
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_pairs_ref(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor,
                     rope_scale: float) -> torch.Tensor:
    """x: [T, ..., R], pos: [T] -> rotated copy."""
    ang = pos.float()[:, None] * inv_freq[None, :]  # [T, R/2]
    while ang.dim() < x.dim():
        ang = ang.unsqueeze(1)
    cos, sin = ang.cos() * rope_scale, ang.sin() * rope_scale
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1).flatten(-2)


def rope_cache_ref(q: torch.Tensor, kv: torch.Tensor, positions: torch.Tensor,
                   slots: torch.Tensor, norm_weight: torch.Tensor, inv_freq: torch.Tensor,
                   rope_scale: float, eps: float, cache: torch.Tensor, nope: int) -> None:
    c = norm_weight.shape[0]
    q[..., nope:] = rotate_pairs_ref(q[..., nope:], positions, inv_freq, rope_scale)
    lat = add_rmsnorm_ref(kv[:, :c].clone(), norm_weight, eps)
    k_rope = rotate_pairs_ref(kv[:, c:], positions, inv_freq, rope_scale)
    cache[slots.long()] = torch.cat([lat, k_rope], dim=-1).to(cache.dtype)


def silu_mul_ref(gate_up: torch.Tensor, limit: float = math.inf) -> torch.Tensor:
    g, u = gate_up.chunk(2, dim=-1)
    g, u = g.clamp(max=limit), u.clamp(min=-limit, max=limit)
    return torch.nn.functional.silu(g) * u


def hc_weights_ref(mix: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, n: int,
                   iters: int, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DeepSeek-V4's hyper-connection weights (gpu_kernels/hyper_connection.py's contract), as
    transformers' DeepseekV4HyperConnection computes them: mix [T, (2 + n) n] -> (pre [T, n],
    post [T, n], comb [T, n, n])."""
    pre_w, post_w, comb_w = mix.split([n, n, n * n], dim=-1)
    pre_b, post_b, comb_b = base.split([n, n, n * n])
    pre = torch.sigmoid(pre_w * scale[0] + pre_b) + eps
    post = 2 * torch.sigmoid(post_w * scale[1] + post_b)
    comb = torch.softmax(comb_w.view(-1, n, n) * scale[2] + comb_b.view(n, n), dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return pre, post, comb


def route_ref(logits: torch.Tensor, bias: torch.Tensor | None, top_k: int, sigmoid: bool,
              n_group: int, topk_group: int, norm_topk_prob: bool, scale: float
              ) -> tuple[torch.Tensor, torch.Tensor]:
    if sigmoid:
        scores = logits.sigmoid()
        choice = scores + bias if bias is not None else scores
    else:
        scores = logits.softmax(dim=-1)
        choice = scores
    if n_group > 1:
        n, e = choice.shape
        grouped = choice.view(n, n_group, e // n_group)
        group_scores = grouped.topk(2, dim=-1).values.sum(-1)  # [N, G]
        keep = group_scores.topk(topk_group, dim=-1).indices
        mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
        choice = choice.masked_fill(~mask.repeat_interleave(e // n_group, dim=1), float("-inf"))
    ids = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if norm_topk_prob:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * scale, ids
