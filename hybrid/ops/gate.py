"""The MoE router. V3: sigmoid scores, choice on score + bias, group-limited (top-2 sum per
group, best `topk_group` groups), weights = unbiased scores of the chosen, normalized if asked,
times the routed scaling factor. V2: softmax, greedy top-k (no normalization)."""

from __future__ import annotations

import torch
from torch import nn

from hybrid.ops.context import BuildContext
from hybrid.ops.kernel_sets import kernels_for


class GateOp(nn.Module):
    """Same outputs as transformers' router: (router_logits, topk_weights, topk_indices)."""

    def __init__(self, ctx: BuildContext) -> None:
        super().__init__()
        self.device, self.spec = ctx.device, ctx.spec
        self.weight = ctx.weight("weight", "f32").get()  # [E, H]
        self.bias = ctx.weight("e_score_correction_bias", "f32").get() if ctx.spec.is_v3 else None
        self.layer_index = ctx.layer_index  # the model layer this router belongs to
        self.recorder = None  # a RoutingRecorder counting this router's choices, when on
        self.kernels = kernels_for(self.device)
        self.quant = self.kernels.router_matrix(self.weight)  # as the products read it, or None

    def forward(self, hidden: torch.Tensor):
        x = hidden.reshape(-1, hidden.shape[-1]).to(self.device, torch.float32)
        logits, weights, ids = self.route(x)
        if self.recorder is not None:  # run in place (transformers' MoE block)
            self.recorder.add(self.layer_index, ids)
        return logits.to(hidden.device), weights.to(hidden.device), ids.to(hidden.device)

    def route(self, x: torch.Tensor, send=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [N, H] f32 on this op's device -> (logits [N, E], weights [N, K], ids [N, K]).
        send: a gpu_kernels.handshake.Handover that x and the choices then go to, its flag
        raised (in the router's own launch on gpu_kernels)."""
        return self.kernels.route(x, self.weight, self.quant, self.bias, self.spec, send)
