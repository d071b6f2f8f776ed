"""Embedding, RMSNorm, linear layers and the dense/shared-expert MLP.

Each runs on its placement's device: inputs are moved there and results moved back to where
they came from, so neighbours on another device need no glue. Compute is fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hybrid.ops.context import BuildContext
from hybrid.ops.weights import Weight


class EmbeddingOp(nn.Module):
    def __init__(self, ctx: BuildContext) -> None:
        super().__init__()
        self.device = ctx.device
        self.weight = ctx.weight("weight")  # [V, H]
        self.hidden_size = ctx.spec.hidden_size

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = input_ids.to(self.device)
        if self.weight.fmt == "gguf" and self.weight._dense is None:
            # Dequantize only the rows looked up: raw rows are whole blocks.
            raw = self.weight._raw[0]
            rows = raw.data.reshape(raw.shape[0], -1)[ids.reshape(-1)]
            from hybrid.gguf.dequant import dequantize

            out = dequantize(rows, raw.qtype, (ids.numel(), self.hidden_size))
            return out.reshape(*ids.shape, self.hidden_size).to(input_ids.device)
        return F.embedding(ids, self.weight.get()).float().to(input_ids.device)


class RMSNormOp(nn.Module):
    def __init__(self, ctx: BuildContext) -> None:
        super().__init__()
        self.device = ctx.device
        self.weight = ctx.weight("weight", "f32").get()  # [D]
        self.eps = ctx.spec.rms_norm_eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(self.device, torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * h).to(x.device, x.dtype)


def linear(x: torch.Tensor, weight: Weight) -> torch.Tensor:
    """x: [..., in] -> [..., out] in fp32 (weights upcast)."""
    return F.linear(x.float(), weight.get().float())


class LinearOp(nn.Module):
    def __init__(self, ctx: BuildContext, leaf: str = "weight") -> None:
        super().__init__()
        self.device = ctx.device
        self.weight = ctx.weight(leaf)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x.to(self.device), self.weight).to(x.device)


class MLPOp(nn.Module):
    """down(silu(gate x) * up x) for dense layers and shared experts."""

    def __init__(self, ctx: BuildContext) -> None:
        super().__init__()
        self.device = ctx.device
        self.gate = ctx.weight("gate_proj.weight")
        self.up = ctx.weight("up_proj.weight")
        self.down = ctx.weight("down_proj.weight")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(self.device)
        h = F.silu(linear(h, self.gate)) * linear(h, self.up)
        return linear(h, self.down).to(x.device, x.dtype)
