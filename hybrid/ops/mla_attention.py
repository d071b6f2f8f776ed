"""MLA attention in the absorbed form, over a latent KV cache.

Per token and layer the cache holds the normalized latent c [kv_lora] and the rotated shared
key k_r [rope]: 576 values for DeepSeek-V3, instead of heads x (k + v) = 32,768. With
W_UK [h, nope, c] and W_UV [h, v, c] the two halves of kv_b_proj:
    q_c  = q_nope @ W_UK                 # [T, h, c]  queries moved into latent space
    s    = (q_c . c_s + q_r . k_r,s) * scale
    o_c  = softmax(s) @ c                # [T, h, c]
    out  = o_proj(o_c @ W_UV^T)          # [T, h*v] -> [T, H]
which equals the expanded attention exactly in real arithmetic.

NOTE: in the serving engine (paged cache) every token, the current chunk's included, is read
back as stored in kv_cache_dtype. Without the engine (transformers' own cache, or none) the
current chunk attends to its own latents at compute precision.
"""

from __future__ import annotations

import torch
from torch import nn

from hybrid.ops.context import BuildContext
from hybrid.ops.layers import linear
from hybrid.ops.rotary import yarn_mscale

_KV_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on adjacent pairs (x0, x1), (x2, x3), ... as GGUF DeepSeek files define it.

    x: [B, T, ..., rope]  cos/sin: [B, T, rope] in transformers' cat(freqs, freqs) layout.
    """
    half = cos.shape[-1] // 2
    c, s = cos[..., :half], sin[..., :half]
    while c.dim() < x.dim():
        c, s = c.unsqueeze(-2), s.unsqueeze(-2)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).flatten(-2)


class MLAAttentionOp(nn.Module):
    def __init__(self, ctx: BuildContext) -> None:
        super().__init__()
        s = ctx.spec
        self.device, self.layer_idx = ctx.device, int(ctx.path.split(".")[2])
        self.heads, self.nope, self.rope, self.v = (s.num_heads, s.qk_nope_head_dim,
                                                    s.qk_rope_head_dim, s.v_head_dim)
        self.kv_lora, self.eps = s.kv_lora_rank, s.rms_norm_eps
        self.kv_dtype = _KV_DTYPES[ctx.options["kv_cache_dtype"]]
        if s.q_lora_rank is not None:
            self.q_a = ctx.weight("q_a_proj.weight")
            self.q_a_norm = ctx.weight("q_a_layernorm.weight", "f32").get()
            self.q_b = ctx.weight("q_b_proj.weight")
        else:
            self.q_proj = ctx.weight("q_proj.weight")
        self.kv_a = ctx.weight("kv_a_proj_with_mqa.weight")
        self.kv_a_norm = ctx.weight("kv_a_layernorm.weight", "f32").get()
        self.kv_b = ctx.weight("kv_b_proj.weight")
        self.o_proj = ctx.weight("o_proj.weight")
        self.scale = (self.nope + self.rope) ** -0.5
        rs = s.rope_scaling
        if rs is not None and rs.get("mscale_all_dim"):
            m = yarn_mscale(rs["factor"], rs["mscale_all_dim"])
            self.scale *= m * m

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def forward(self, hidden_states: torch.Tensor, position_embeddings, attention_mask=None,
                past_key_values=None, forward_batch=None, **kwargs):
        """hidden_states: [B, T, H] -> ([B, T, H], None), transformers' attention interface.

        With `forward_batch` (the serving engine) B is 1 and the T tokens belong to several
        sequences over the paged cache; otherwise one causal sequence per batch row, over
        transformers' `past_key_values` cache when given.
        """
        x = hidden_states.to(self.device, torch.float32)
        b, t, _ = x.shape
        if hasattr(self, "q_a"):
            q = linear(self._rms(linear(x, self.q_a), self.q_a_norm), self.q_b)
        else:
            q = linear(x, self.q_proj)
        q = q.view(b, t, self.heads, self.nope + self.rope)
        q_nope, q_rope = q.split([self.nope, self.rope], dim=-1)
        kv = linear(x, self.kv_a)  # [B, T, c + r]
        latent = self._rms(kv[..., : self.kv_lora], self.kv_a_norm)  # [B, T, c]
        cos, sin = _cos_sin(position_embeddings, self.device)
        q_rope = rotate_pairs(q_rope, cos, sin)  # [B, T, h, r]
        k_rope = rotate_pairs(kv[..., self.kv_lora:], cos, sin)  # [B, T, r]

        w_kv = self.kv_b.get().float().view(self.heads, self.nope + self.v, self.kv_lora)
        w_uk, w_uv = w_kv[:, : self.nope], w_kv[:, self.nope:]  # [h, nope, c], [h, v, c]
        q_lat = torch.einsum("bthn,hnc->bthc", q_nope, w_uk)  # [B, T, h, c]
        if forward_batch is not None:
            out_lat = self._paged(q_lat[0], q_rope[0], latent[0], k_rope[0],
                                  forward_batch)[None]  # [1, T, h, c]
        else:
            out_lat = self._contiguous(q_lat, q_rope, latent, k_rope, past_key_values)
        out = torch.einsum("bthc,hvc->bthv", out_lat, w_uv).reshape(b, t, self.heads * self.v)
        out = linear(out, self.o_proj)
        return out.to(hidden_states.device, hidden_states.dtype), None

    def _attend(self, q_lat: torch.Tensor, q_rope: torch.Tensor, kv: torch.Tensor,
                allowed: torch.Tensor) -> torch.Tensor:
        """q_lat [..., t, h, c], q_rope [..., t, h, r], kv [..., S, c + r] fp32,
        allowed [..., t, S] -> o_c [..., t, h, c]."""
        lat, rope = kv[..., : self.kv_lora], kv[..., self.kv_lora:]
        scores = (torch.einsum("...thc,...sc->...hts", q_lat, lat)
                  + torch.einsum("...thr,...sr->...hts", q_rope, rope)) * self.scale
        scores = scores.masked_fill(~allowed.unsqueeze(-3), float("-inf"))
        return torch.einsum("...hts,...sc->...thc", torch.softmax(scores, dim=-1), lat)

    def _paged(self, q_lat, q_rope, latent, k_rope, fb) -> torch.Tensor:
        """Tokens of many sequences [N, ...]: write their latents, then attend per sequence.

        The new tokens are read back from the cache like earlier ones, so a token's attention
        does not depend on whether its neighbours arrived in the same chunk (chunked and
        unchunked prefill agree exactly)."""
        idx = fb.on(self.device)
        cache = fb.cache.layer(self.layer_idx)  # [slots, c + r]
        cache[idx["slots"]] = torch.cat([latent, k_rope], dim=-1).to(self.kv_dtype)
        out = torch.empty_like(q_lat)  # [N, h, c]
        if "decode_rows" in idx:  # all decodes at once, padded to the longest
            rows = idx["decode_rows"]
            kv = cache[idx["decode_slots"]].float()  # [B, S_max, c + r]
            allowed = idx["decode_valid"].unsqueeze(1)  # [B, 1, S_max]
            out[rows] = self._attend(q_lat[rows, None], q_rope[rows, None], kv, allowed)[:, 0]
        for span, kv_slots in zip(fb.prefill_spans, idx["prefill_slots"]):
            rows = slice(span.q_start, span.q_start + span.q_len)
            kv = cache[kv_slots].float()  # [S, c + r]
            out[rows] = self._attend(q_lat[rows], q_rope[rows], kv,
                                     _causal(span.q_len, span.kv_len, self.device))
        return out

    def _contiguous(self, q_lat, q_rope, latent, k_rope, past_key_values) -> torch.Tensor:
        """[B, T, ...] causal sequences, optionally after transformers' cached prefix."""
        t = latent.shape[1]
        if past_key_values is not None:
            stored = past_key_values.update(latent.to(self.kv_dtype).unsqueeze(1),
                                            k_rope.to(self.kv_dtype).unsqueeze(1), self.layer_idx)
            prefix = stored[0].shape[2] - t
            latent = torch.cat([stored[0][:, 0, :prefix].float(), latent], dim=1)  # [B, S, c]
            k_rope = torch.cat([stored[1][:, 0, :prefix].float(), k_rope], dim=1)  # [B, S, r]
        kv = torch.cat([latent, k_rope], dim=-1)  # [B, S, c + r]
        return self._attend(q_lat, q_rope, kv, _causal(t, kv.shape[1], self.device))


def _causal(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """[q_len, kv_len]: query i (at position kv_len - q_len + i) sees keys 0..its position."""
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)
    return torch.arange(kv_len, device=device)[None, :] <= q_pos[:, None]


def _cos_sin(position_embeddings, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept (cos, sin) or transformers-V2's complex freqs_cis; return fp32 [B, T, rope]."""
    if isinstance(position_embeddings, torch.Tensor) and position_embeddings.is_complex():
        freqs = position_embeddings.to(device)
        cos, sin = freqs.real.float(), freqs.imag.float()
        return torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    cos, sin = position_embeddings
    return cos.to(device, torch.float32), sin.to(device, torch.float32)
