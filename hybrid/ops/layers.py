"""Embedding, RMSNorm, linear layers (plain and grouped), the dense/shared-expert MLP and the
MoE router.

Each runs on its placement's device: inputs are moved there and results moved back to where
they came from, so neighbours on another device need no glue. Compute is fp32, in the kernel
set of the device (kernel_sets/: gpu_kernels' products on the quantized blocks and fused norms
on CUDA, torch elsewhere).
"""

from __future__ import annotations

import torch
from torch import nn

from hybrid.ops.context import BuildContext
from hybrid.ops.kernel_sets import kernels_for
from hybrid.ops.weights import stack_rows


class EmbeddingOp(nn.Module):
    def __init__(self, ctx: BuildContext) -> None:
        super().__init__()
        self.device = ctx.device
        self.kernels = kernels_for(self.device)
        self.weight = ctx.weight("weight")  # [V, H]
        self.hidden_size = ctx.spec.hidden_size

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = input_ids.to(self.device)
        out = self.kernels.embedding(ids.reshape(-1), self.weight, self.hidden_size)
        return out.reshape(*ids.shape, self.hidden_size).to(input_ids.device)


class RMSNormOp(nn.Module):
    def __init__(self, ctx: BuildContext) -> None:
        super().__init__()
        self.device = ctx.device
        self.kernels = kernels_for(self.device)
        self.weight = ctx.weight("weight", "f32").get()  # [D]
        self.eps = ctx.spec.rms_norm_eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.kernels.rmsnorm(x.to(self.device, torch.float32), self.weight, self.eps)
        return h.to(x.device, x.dtype)

    def add_norm(self, x: torch.Tensor, *deltas: torch.Tensor, x_bits: int = 0):
        """x += sum(deltas), in place (x: [N, D] f32 on this op's device); -> (RMSNorm(x),
        the same quantized to x_bits for the next product's integer path, or None)."""
        return self.kernels.add_rmsnorm(x, self.weight, self.eps, deltas, x_bits)


class LinearOp(nn.Module):
    def __init__(self, ctx: BuildContext, leaf: str = "weight") -> None:
        super().__init__()
        self.device = ctx.device
        self.kernels = kernels_for(self.device)
        self.weight = ctx.weight(leaf)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernels.linear(x.to(self.device), self.weight).to(x.device)


class GroupedLinearOp(nn.Module):
    """DeepSeek-V4's grouped output projection (transformers' DeepseekV4GroupedLinear): x
    [..., G, in] -> [..., G, out/G], group g through rows g*out/G .. (g+1)*out/G of one [out, in]
    weight, kept in the file's blocks (on CUDA one grouped quantized product)."""

    def __init__(self, ctx: BuildContext) -> None:
        super().__init__()
        self.device = ctx.device
        self.kernels = kernels_for(self.device)
        self.groups = ctx.module.n_groups
        self.weight = ctx.weight("weight")  # [out, in]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.to(self.device).reshape(-1, self.groups, x.shape[-1])  # [N, G, in]
        out = self.kernels.grouped_linear(flat, self.weight)  # [N, G, out/G]
        return out.reshape(*x.shape[:-1], -1).to(x.device, x.dtype)


class MLPOp(nn.Module):
    """down(silu(gate x) * up x) for dense layers and shared experts."""

    def __init__(self, ctx: BuildContext) -> None:
        super().__init__()
        self.device = ctx.device
        self.kernels = kernels_for(self.device)
        self.gate = ctx.weight("gate_proj.weight")
        self.up = ctx.weight("up_proj.weight")
        self.down = ctx.weight("down_proj.weight")
        self.gate_up = stack_rows(self.gate, self.up)  # one product for both, or None

    def input_bits(self, tokens: int) -> int:
        """What forward's `xq` should be quantized to for `tokens` rows (0: none)."""
        return self.kernels.input_bits(self.gate_up, tokens)

    def forward(self, x: torch.Tensor, xq=None) -> torch.Tensor:
        """x [..., H]; xq: x quantized to input_bits (by the norm before), or None."""
        flat = x.to(self.device).reshape(-1, x.shape[-1]).float()  # [N, H]
        out = self.kernels.mlp(flat, self.gate, self.up, self.down, self.gate_up, xq)
        return out.reshape(*x.shape[:-1], -1).to(x.device, x.dtype)


class GateOp(nn.Module):
    """The MoE router, with transformers' outputs: (router_logits, topk_weights, topk_indices).

    V3: sigmoid scores, choice on score + bias, group-limited (top-2 sum per
    group, best `topk_group` groups), weights = unbiased scores of the chosen, normalized if
    asked, times the routed scaling factor. V2: softmax, greedy top-k (no normalization)."""

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
