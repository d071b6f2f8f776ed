"""The MoE router. V3: sigmoid scores, choice on score + bias, group-limited (top-2 sum per
group, best `topk_group` groups), weights = unbiased scores of the chosen, normalized if asked,
times the routed scaling factor. V2: softmax, greedy top-k (no normalization)."""

from __future__ import annotations

import torch
from torch import nn

from hybrid.model.spec import ModelSpec
from hybrid.ops.context import BuildContext


def route(logits: torch.Tensor, bias: torch.Tensor | None, spec: ModelSpec
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [N, E] fp32 -> (weights [N, K] fp32, ids [N, K] int64)."""
    k = spec.num_experts_per_tok
    if spec.scoring_func == "sigmoid":
        scores = logits.sigmoid()
        choice = scores + bias if bias is not None else scores
    else:
        scores = logits.softmax(dim=-1)
        choice = scores
    if spec.n_group > 1:
        n, e = choice.shape
        grouped = choice.view(n, spec.n_group, e // spec.n_group)
        group_scores = grouped.topk(2, dim=-1).values.sum(-1)  # [N, G]
        keep = group_scores.topk(spec.topk_group, dim=-1).indices
        mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
        choice = choice.masked_fill(~mask.repeat_interleave(e // spec.n_group, dim=1),
                                    float("-inf"))
    ids = choice.topk(k, dim=-1).indices
    weights = scores.gather(1, ids)
    if spec.norm_topk_prob:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * spec.routed_scaling_factor, ids


class GateOp(nn.Module):
    """Same outputs as transformers' router: (router_logits, topk_weights, topk_indices)."""

    def __init__(self, ctx: BuildContext) -> None:
        super().__init__()
        self.device, self.spec = ctx.device, ctx.spec
        self.weight = ctx.weight("weight", "f32").get()  # [E, H]
        self.bias = ctx.weight("e_score_correction_bias", "f32").get() if ctx.spec.is_v3 else None

    def forward(self, hidden: torch.Tensor):
        x = hidden.reshape(-1, hidden.shape[-1]).to(self.device, torch.float32)
        logits = x @ self.weight.T  # [N, E]
        weights, ids = route(logits, self.bias, self.spec)
        return logits.to(hidden.device), weights.to(hidden.device), ids.to(hidden.device)
