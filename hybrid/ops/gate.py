"""The MoE router. V3: sigmoid scores, choice on score + bias, group-limited (top-2 sum per
group, best `topk_group` groups), weights = unbiased scores of the chosen, normalized if asked,
times the routed scaling factor. V2: softmax, greedy top-k (no normalization)."""

from __future__ import annotations

import torch
from torch import nn

from hybrid.model.spec import ModelSpec
from hybrid.ops.context import BuildContext
from hybrid.ops.weights import uses_gpu_kernels


def route(logits: torch.Tensor, bias: torch.Tensor | None, spec: ModelSpec
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [N, E] fp32 -> (weights [N, K] fp32, ids [N, K] int64), in torch."""
    from gpu_kernels.reference import route_ref

    return route_ref(logits, bias, spec.num_experts_per_tok, spec.scoring_func == "sigmoid",
                     spec.n_group, spec.topk_group, spec.norm_topk_prob,
                     spec.routed_scaling_factor)


class GateOp(nn.Module):
    """Same outputs as transformers' router: (router_logits, topk_weights, topk_indices)."""

    def __init__(self, ctx: BuildContext) -> None:
        super().__init__()
        self.device, self.spec = ctx.device, ctx.spec
        self.weight = ctx.weight("weight", "f32").get()  # [E, H]
        self.bias = ctx.weight("e_score_correction_bias", "f32").get() if ctx.spec.is_v3 else None
        self.layer_index = ctx.layer_index  # the model layer this router belongs to
        self.recorder = None  # a RoutingRecorder counting this router's choices, when on
        self.quant = None  # on CUDA: the weight as a gpu_kernels F32 matrix
        if uses_gpu_kernels(self.device):
            from gpu_kernels.qformat import GpuQuant
            from gpu_kernels.qtypes import F32

            self.quant = GpuQuant(F32, self.weight.shape[0], self.weight.shape[1], (self.weight,))

    def forward(self, hidden: torch.Tensor):
        x = hidden.reshape(-1, hidden.shape[-1]).to(self.device, torch.float32)
        logits, weights, ids = self.route(x)
        if self.recorder is not None:  # run in place (transformers' MoE block)
            self.recorder.add(self.layer_index, ids)
        return logits.to(hidden.device), weights.to(hidden.device), ids.to(hidden.device)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [N, H] f32 on this op's device -> (logits [N, E], weights [N, K], ids [N, K])."""
        s = self.spec
        if self.quant is not None:
            from gpu_kernels.qmatmul import qmatmul
            from gpu_kernels.router import route as gpu_route

            logits = qmatmul(x, self.quant)
            weights, ids = gpu_route(logits, self.bias, s.num_experts_per_tok,
                                     s.scoring_func == "sigmoid", s.n_group, s.topk_group,
                                     s.norm_topk_prob, s.routed_scaling_factor)
            return logits, weights, ids
        logits = x @ self.weight.T  # [N, E]
        weights, ids = route(logits, self.bias, s)
        return logits, weights, ids
