"""MLA attention's arithmetic in torch (the absorbed form, over latent keys): what operators off
gpu_kernels run (transformers' interface, a CPU engine's prompt chunks and, through
hybrid/engine/attention/torch_decode.py, its decode rows), and the reference the attention
kernels' tests hold them to.
"""

from __future__ import annotations

import torch


def attend(q_lat: torch.Tensor, q_rope: torch.Tensor, kv: torch.Tensor, allowed: torch.Tensor,
           scale: float) -> torch.Tensor:
    """q_lat [..., t, h, c], q_rope [..., t, h, r], kv [..., S, c + r] fp32,
    allowed [..., t, S] -> o_c [..., t, h, c]."""
    c = q_lat.shape[-1]
    lat, rope = kv[..., :c], kv[..., c:]
    scores = (torch.einsum("...thc,...sc->...hts", q_lat, lat)
              + torch.einsum("...thr,...sr->...hts", q_rope, rope)) * scale
    scores = scores.masked_fill(~allowed.unsqueeze(-3), float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no keys (padding) -> 0
    return torch.einsum("...hts,...sc->...thc", probs, lat)


def causal_mask(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """[q_len, kv_len]: query i (at position kv_len - q_len + i) sees keys 0..its position."""
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)
    return torch.arange(kv_len, device=device)[None, :] <= q_pos[:, None]
