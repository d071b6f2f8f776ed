"""DeepSeek-V4's manifold-constrained hyper-connection (transformers'
DeepseekV4HyperConnection) as an operator, with its contract: the residual's `n` streams
[..., n, D] -> (post [..., n], comb [..., n, n], the block's input collapsed from the streams
[..., D]). Its weights are fp32 on its device; the streams' norm is transformers' own
(parameter-free) module; the Sinkhorn-normalized weights come from the kernel set
(gpu_kernels/hyper_connection.py on CUDA: one launch for the whole loop)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hybrid.ops.context import BuildContext
from hybrid.ops.kernel_sets import kernels_for


class HyperConnectionOp(nn.Module):
    def __init__(self, ctx: BuildContext) -> None:
        super().__init__()
        self.device = ctx.device
        self.kernels = kernels_for(self.device)
        m = ctx.module
        self.n, self.iters, self.eps = m.hc_mult, m.hc_sinkhorn_iters, m.hc_eps
        self.input_norm = m.input_norm  # DeepseekV4UnweightedRMSNorm: no weights
        self.fn = ctx.weight("fn", "f32").get()  # [(2 + n) n, n D]
        self.base = ctx.weight("base", "f32").get()  # [(2 + n) n]
        self.scale = ctx.weight("scale", "f32").get()  # [3]: pre's, post's, comb's

    def forward(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = streams.to(self.device)  # [..., n, D]
        lead, d = x.shape[:-2], x.shape[-1]
        flat = x.reshape(-1, self.n * d).float()  # [T, n D]
        mix = F.linear(self.input_norm(flat), self.fn)  # [T, (2 + n) n]
        pre, post, comb = self.kernels.hc_weights(mix, self.base, self.scale, self.n,
                                                  self.iters, self.eps)
        collapsed = (pre.unsqueeze(-1) * x.reshape(-1, self.n, d)).sum(1)  # [T, D]
        home = streams.device
        return (post.view(*lead, self.n).to(home), comb.view(*lead, self.n, self.n).to(home),
                collapsed.view(*lead, d).to(home, streams.dtype))
