"""MLA attention over the paged latent cache, for a step's rows (decodes first, then prefill
chunks; see hybrid/engine/forward_batch.py).

Decode rows: one launch of gpu_kernels.mla_decode on CUDA (every sequence, any length, one
launch per layer; or flashinfer's, hybrid/engine/decode_attention.py), the same arithmetic in
torch elsewhere. Prefill chunks: one launch of gpu_kernels.mla_prefill for all of them (flash
attention, causal, reading their keys from the cache); elsewhere torch, one chunk at a time.
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


def paged_attention(q_lat: torch.Tensor, q_rope: torch.Tensor, cache: torch.Tensor, fb,
                    scale: float, num_splits: int | None = None, kernels: bool = False,
                    prefill: bool = True) -> torch.Tensor:
    """q_lat [N, h, c], q_rope [N, h, r] fp32; cache [slots, c + r] with this step's tokens
    already written; fb: the step's ForwardBatch on this device -> o_c [N, h, c] fp32.
    `num_splits` fixes the decode kernel's split count (a CUDA graph's, sized for the longest
    sequence the cache can hold); by default it follows this step's longest sequence.
    `kernels`: decode rows through gpu_kernels.mla_decode (or fb.decode_attention, a
    flashinfer wrapper planned for the step), prefill chunks through
    gpu_kernels.mla_prefill (else torch). `prefill` False: the decode rows only (q_lat may hold
    just those; the caller attends to the chunks another way)."""
    n, h, c = q_lat.shape
    b = fb.num_decodes
    out = torch.empty(n, h, c, dtype=torch.float32, device=q_lat.device)
    if b:
        if kernels and fb.decode_attention is not None:  # planned for this step's rows
            fb.decode_attention.run(q_lat[:b], q_rope[:b], cache, out=out[:b])
        elif kernels:
            from gpu_kernels.mla_decode import choose_splits, mla_decode

            splits = num_splits or choose_splits(b, h, max(fb.max_decode_len, 1))
            mla_decode(q_lat[:b], q_rope[:b], cache, fb.page_table, fb.seq_lens, fb.page_size,
                       scale, splits, out=out[:b])
        else:
            out[:b] = _decode_torch(q_lat[:b], q_rope[:b], cache, fb, scale)
    if not prefill:
        return out
    if kernels and fb.prefill_spans:
        from gpu_kernels.mla_prefill import mla_prefill

        meta, slots, longest = fb.prefill_index()
        mla_prefill(q_lat, q_rope, cache, meta, slots, scale, longest, out)
        return out
    for span in fb.prefill_spans:
        rows = slice(span.q_start, span.q_start + span.q_len)
        kv = cache[span.kv_slots].float()  # [S, c + r]
        out[rows] = attend(q_lat[rows], q_rope[rows], kv,
                           causal_mask(span.q_len, span.kv_len, q_lat.device), scale)
    return out


def _decode_torch(q_lat: torch.Tensor, q_rope: torch.Tensor, cache: torch.Tensor, fb,
                  scale: float) -> torch.Tensor:
    """All decode rows at once, padded to the longest sequence: [B, h, c]."""
    s_max = max(fb.max_decode_len, 1)
    t = torch.arange(s_max, device=q_lat.device)
    b = q_lat.shape[0]
    pages = fb.page_table[:b, torch.clamp(t // fb.page_size, max=fb.page_table.shape[1] - 1)]
    slots = pages * fb.page_size + t % fb.page_size  # [B, S]
    valid = t[None, :] < fb.seq_lens[:b, None]  # [B, S]
    # padding reads each sequence's own first slot: written, so finite (masked out anyway)
    slots = torch.where(valid, slots, slots[:, :1])
    kv = cache[slots].float()  # [B, S, c + r]
    return attend(q_lat[:, None], q_rope[:, None], kv, valid[:, None, :], scale)[:, 0]
