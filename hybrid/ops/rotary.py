"""YaRN rotary embedding: cos/sin tables per position, as DeepSeek (and llama.cpp) define them.

inv_freq blends interpolated (pos / factor) and extrapolated frequencies with a linear ramp
between the correction dims of beta_fast and beta_slow; the cos/sin factor is
mscale(factor, mscale) / mscale(factor, mscale_all_dim) (1 for DeepSeek). Output follows
transformers' convention: cos, sin of shape [B, T, rope_dim] = cat(freqs, freqs).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from hybrid.model.spec import ModelSpec
from hybrid.ops.context import BuildContext


def yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_inv_freq(spec: ModelSpec) -> tuple[torch.Tensor, float]:
    """(inv_freq [rope_dim / 2], cos/sin scale)."""
    dim, base = spec.qk_rope_head_dim, spec.rope_theta
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrapolation = 1.0 / pos_freqs
    rs = spec.rope_scaling
    if rs is None:
        return extrapolation, 1.0
    factor, original = rs["factor"], rs["original_max_position_embeddings"]

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(rs["beta_fast"])), 0)
    high = min(math.ceil(correction_dim(rs["beta_slow"])), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1 - ramp
    inv_freq = (extrapolation / factor) * (1 - extrapolation_weight) + extrapolation * extrapolation_weight
    scale = yarn_mscale(factor, rs["mscale"]) / yarn_mscale(factor, rs["mscale_all_dim"])
    return inv_freq, scale


class RotaryOp(nn.Module):
    def __init__(self, ctx: BuildContext) -> None:
        super().__init__()
        self.device = ctx.device
        inv_freq, self.scale = yarn_inv_freq(ctx.spec)
        self.inv_freq = inv_freq.to(self.device)
        # transformers' V2 attention takes complex freqs_cis; keep the replaced module's format.
        self.complex_output = type(ctx.module).__name__.startswith("DeepseekV2")

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        pos = position_ids.to(self.device).float()  # [B, T]
        freqs = pos[..., None] * self.inv_freq  # [B, T, rope/2]
        if self.complex_output:
            return (torch.polar(torch.ones_like(freqs), freqs) * self.scale).to(x.device)
        emb = torch.cat([freqs, freqs], dim=-1)
        return (emb.cos() * self.scale).to(x.device), (emb.sin() * self.scale).to(x.device)
