"""The decode rows' attention in torch: operators that do not run gpu_kernels (the CPU)."""

from __future__ import annotations

import torch

from hybrid.engine.attention.base import DecodeAttention
from hybrid.ops.mla_torch import attend


class TorchDecode(DecodeAttention):
    name = "torch"

    def run(self, q_lat, q_rope, cache, fb, scale, out) -> None:
        """Every decode row at once, padded to the longest sequence."""
        s_max = max(fb.max_decode_len, 1)
        t = torch.arange(s_max, device=q_lat.device)
        b = q_lat.shape[0]
        pages = fb.page_table[:b, torch.clamp(t // fb.page_size, max=fb.page_table.shape[1] - 1)]
        slots = pages * fb.page_size + t % fb.page_size  # [B, S]
        valid = t[None, :] < fb.seq_lens[:b, None]  # [B, S]
        # padding reads each sequence's own first slot: written, so finite (masked out anyway)
        slots = torch.where(valid, slots, slots[:, :1])
        kv = cache[slots].float()  # [B, S, c + r]
        out[:] = attend(q_lat[:, None], q_rope[:, None], kv, valid[:, None, :], scale)[:, 0]
