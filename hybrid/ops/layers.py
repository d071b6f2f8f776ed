"""Embedding, RMSNorm, linear layers and the dense/shared-expert MLP.

Each runs on its placement's device: inputs are moved there and results moved back to where
they came from, so neighbours on another device need no glue. Compute is fp32. On a CUDA device
the work goes to gpu_kernels (products on the quantized blocks, fused norms); elsewhere torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hybrid.ops.context import BuildContext
from hybrid.ops.weights import Weight, stack_rows, uses_gpu_kernels


class EmbeddingOp(nn.Module):
    def __init__(self, ctx: BuildContext) -> None:
        super().__init__()
        self.device = ctx.device
        self.weight = ctx.weight("weight")  # [V, H]
        self.hidden_size = ctx.spec.hidden_size

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = input_ids.to(self.device)
        if self.weight.quant is not None:
            from gpu_kernels.embedding import embedding

            out = embedding(ids.reshape(-1), self.weight.quant[0])
            return out.reshape(*ids.shape, self.hidden_size).to(input_ids.device)
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
        self.kernels = uses_gpu_kernels(self.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(self.device, torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * h).to(x.device, x.dtype)

    def add_norm(self, x: torch.Tensor, *deltas: torch.Tensor, x_bits: int = 0):
        """x += sum(deltas), in place (x: [N, D] f32 on this op's device); -> (RMSNorm(x),
        the same quantized to x_bits for the next product's integer path, or None)."""
        if self.kernels and len(deltas) <= 2:
            from gpu_kernels.fused import add_rmsnorm
            from gpu_kernels.qdot_i8 import empty_xq

            xq = empty_xq(*x.shape, x_bits, x.device)
            h = add_rmsnorm(x, self.weight, self.eps, *[d.to(x.device) for d in deltas], xq=xq)
            return h, xq
        for d in deltas:
            x += d.to(x.device)
        return self(x), None


def input_bits(w, tokens: int) -> int:
    """The bits a product of `tokens` rows with GpuQuant w (or None) takes x quantized to
    (qmatmul's integer path), 0 for fp32 x: what a fused producer of x should write."""
    if w is None:
        return 0
    from gpu_kernels.qmatmul import uses_int_path

    return w.x_bits if uses_int_path(w, tokens) else 0


def linear(x: torch.Tensor, weight: Weight, xq=None) -> torch.Tensor:
    """x: [..., in] -> [..., out] in fp32 (weights upcast, or quantized products on CUDA);
    xq: x quantized by its producer (qmatmul's `xq`)."""
    quant = weight.quant
    if quant is not None and len(quant) == 1 and x.device == weight.device:
        from gpu_kernels.qmatmul import qmatmul

        q = quant[0]
        return qmatmul(x.reshape(-1, q.cols), q, xq=xq).reshape(*x.shape[:-1], q.rows)
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
        self.gate_up = stack_rows(self.gate, self.up)

    def input_bits(self, tokens: int) -> int:
        """What forward's `xq` should be quantized to for `tokens` rows (0: none)."""
        return input_bits(self.gate_up, tokens)

    def forward(self, x: torch.Tensor, xq=None) -> torch.Tensor:
        """x [..., H]; xq: x quantized to input_bits (fused.add_rmsnorm), or None."""
        h = x.to(self.device)
        if self.gate_up is not None:
            from gpu_kernels.fused import silu_mul
            from gpu_kernels.qdot_i8 import empty_xq
            from gpu_kernels.qmatmul import qmatmul

            flat = h.reshape(-1, h.shape[-1]).float()
            down = self.down.quant[0]
            mid_q = empty_xq(flat.shape[0], down.cols, input_bits(down, flat.shape[0]), h.device)
            mid = silu_mul(qmatmul(flat, self.gate_up, xq=xq), xq=mid_q)  # [N, I]
            out = qmatmul(mid, down, xq=mid_q).reshape(*h.shape[:-1], -1)
            return out.to(x.device, x.dtype)
        h = F.silu(linear(h, self.gate)) * linear(h, self.up)
        return linear(h, self.down).to(x.device, x.dtype)
