"""MLA attention in the absorbed form, over a latent KV cache.

Per token and layer the cache holds the normalized latent c [kv_lora] and the rotated shared
key k_r [rope]: 576 values for DeepSeek-V3, instead of heads x (k + v) = 32,768. With
W_UK [h, nope, c] and W_UV [h, v, c] the two halves of kv_b_proj:
    q_c  = q_nope @ W_UK                 # [T, h, c]  queries moved into latent space
    s    = (q_c . c_s + q_r . k_r,s) * scale
    o_c  = softmax(s) @ c                # [T, h, c]
    out  = o_proj(o_c @ W_UV^T)          # [T, h*v] -> [T, H]
which equals the expanded attention exactly in real arithmetic.

NOTE: in the serving engine (`step`, paged cache) every token, the current chunk's included,
is read back as stored in kv_cache_dtype. Without the engine (transformers' own cache, or none)
the current chunk attends to its own latents at compute precision. `step` runs the kernel set
of its device (kernel_sets/: gpu_kernels' quantized products, fused RoPE and cache write on
CUDA; the same arithmetic in torch elsewhere); its decode rows attend through the engine's
decode attention backend (hybrid/engine/attention/, set on the step's ForwardBatch). On CUDA
prompt chunks take the expanded form instead: their keys' latents multiplied out by kv_b once per
step, then per-head flash attention (gpu_kernels/mla_prefill_expanded.py): with many keys per
query that is ~7x fewer products than the absorbed form, whose advantage is reading a short cache
per decode token.

DeepSeek-V3.2 (a layer with a lightning indexer, mla_indexer.py): each query attends only to the
top-k keys its indexer scores highest; the indexer's key of every token is cached beside its
latent (the paged cache's `index_layer`). Every row of a step runs the kernel set's
`sparse_attention`: on gpu_kernels the decode rows in Triton (gpu_kernels/mla_index.py, CUDA graphs
capture them), the prompt chunks in torch as off gpu_kernels.
"""

from __future__ import annotations

import torch
from torch import nn

from hybrid.errors import HybridError
from hybrid.ops.context import BuildContext
from hybrid.ops.kernel_sets import MLADims, kernels_for, uses_gpu_kernels
from hybrid.ops.mla_indexer import index_keys, index_scores, rotate_halves, top_k_keys
from hybrid.ops.mla_torch import attend, causal_mask
from hybrid.ops.rotary import yarn_inv_freq, yarn_mscale
from hybrid.ops.weights import stack_rows

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
        self.device, self.layer_idx = ctx.device, ctx.layer_index
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
        # DeepSeek-V3.2's lightning indexer (0: none, as in every deepseek2 model)
        self.index_head_dim = s.index_head_dim if hasattr(ctx.module, "indexer") else 0
        if self.index_head_dim:
            self.index_heads, self.index_topk = s.index_n_heads, s.index_topk
            self.index_q = ctx.weight("indexer.wq_b.weight")  # [Hi * D, q_lora]
            self.index_k = ctx.weight("indexer.wk.weight")  # [D, H]
            self.index_w = ctx.weight("indexer.weights_proj.weight")  # [Hi, H]
            self.index_norm_w = ctx.weight("indexer.k_norm.weight", "f32").get()  # [D]
            self.index_norm_b = ctx.weight("indexer.k_norm.bias", "f32").get()  # [D]
        self.scale = (self.nope + self.rope) ** -0.5
        rs = s.rope_scaling
        if rs is not None and rs.get("mscale_all_dim"):
            m = yarn_mscale(rs["factor"], rs["mscale_all_dim"])
            self.scale *= m * m
        inv_freq, self.rope_scale = yarn_inv_freq(s)
        self.inv_freq = inv_freq.to(self.device)  # [rope / 2]
        self.uses_gpu_kernels = uses_gpu_kernels(self.device)  # gpu_kernels (else torch)
        self.kernels = kernels_for(self.device)
        self.dims = MLADims(self.heads, self.nope, self.rope, self.v, self.kv_lora)
        # legacy kv_b [h*(nope+v), c] is one matrix; the MLA layout's k_b [h*c, nope] and
        # v_b [h*v, c] are two (only as GGUF blocks: a dense kv_b is the legacy form); the
        # kernel sets read either from kv_b.quant
        # q (or q_a) and kv_a multiply the same rows: one launch for both where types match
        first = self.q_a if hasattr(self, "q_a") else self.q_proj
        self.q_kv_a = stack_rows(first, self.kv_a)  # None off the GPU kernels

    def forward(self, hidden_states: torch.Tensor, position_embeddings, attention_mask=None,
                past_key_values=None, **kwargs):
        """hidden_states: [B, T, H] -> ([B, T, H], None), transformers' attention interface:
        one causal sequence per batch row, over transformers' `past_key_values` when given
        (V3.2's decoder layer names it `cache`)."""
        if past_key_values is None:
            past_key_values = kwargs.get("cache")
        x = hidden_states.to(self.device, torch.float32)
        b, t, _ = x.shape
        if hasattr(self, "q_a"):
            qa = self.kernels.rmsnorm(self.kernels.linear(x, self.q_a), self.q_a_norm, self.eps)
            q = self.kernels.linear(qa, self.q_b)
        else:
            qa, q = None, self.kernels.linear(x, self.q_proj)
        q = q.view(b, t, self.heads, self.nope + self.rope)
        q_nope, q_rope = q.split([self.nope, self.rope], dim=-1)
        kv = self.kernels.linear(x, self.kv_a)  # [B, T, c + r]
        latent = self.kernels.rmsnorm(kv[..., : self.kv_lora], self.kv_a_norm, self.eps)
        cos, sin = _cos_sin(position_embeddings, self.device)
        q_rope = rotate_pairs(q_rope, cos, sin)  # [B, T, h, r]
        k_rope = rotate_pairs(kv[..., self.kv_lora:], cos, sin)  # [B, T, r]

        w_kv = self.kv_b.get().float().view(self.heads, self.nope + self.v, self.kv_lora)
        w_uk, w_uv = w_kv[:, : self.nope], w_kv[:, self.nope:]  # [h, nope, c], [h, v, c]
        q_lat = torch.einsum("bthn,hnc->bthc", q_nope, w_uk)  # [B, T, h, c]
        chosen = (self._index_contiguous(x, qa, cos, sin, past_key_values)
                  if self.index_head_dim else None)
        out_lat = self._contiguous(q_lat, q_rope, latent, k_rope, past_key_values, chosen)
        out = torch.einsum("bthc,hvc->bthv", out_lat, w_uv).reshape(b, t, self.heads * self.v)
        out = self.kernels.linear(out, self.o_proj)
        return out.to(hidden_states.device, hidden_states.dtype), None

    def input_bits(self, tokens: int) -> int:
        """What step's `hq` should be quantized to for `tokens` rows (0: none)."""
        return self.kernels.input_bits(self.q_kv_a, tokens)

    def step(self, h: torch.Tensor, fb, hq=None) -> torch.Tensor:
        """The serving engine's path. h: [N, H] f32 normed rows of a step (decodes first);
        fb: its ForwardBatch, prepared by the engine's decode attention backend
        (`fb.attention`) -> attention output [N, H] f32. Writes the step's latents into this
        layer's rows of the paged cache. hq: h quantized to input_bits, or None."""
        k, d = self.kernels, self.dims
        fb = fb.on(self.device)
        x = h.to(self.device, torch.float32)
        n = x.shape[0]
        if self.q_kv_a is not None:
            both = k.product(x, self.q_kv_a, hq)  # [N, Rq + c + r]: columns of q (or q_a), kv
            split = both.shape[1] - self.kv_lora - self.rope
            q, qa = self._queries(x, both[:, :split])
            kv = both[:, split:]  # [N, c + r], rows strided
        else:
            q, qa = self._queries(x)
            kv = k.linear(x, self.kv_a)  # [N, c + r]
        q = q.view(n, self.heads, self.nope + self.rope)
        cache = fb.cache.layer(self.layer_idx)
        k.rope_cache(q, kv, fb.positions, fb.slots, self.kv_a_norm, self.inv_freq,
                     self.rope_scale, self.eps, cache, self.nope)  # q's rope dims rotated
        o = torch.empty(n, self.heads, self.v, dtype=torch.float32, device=self.device)
        b = fb.num_decodes
        if self.index_head_dim:  # V3.2: every row attends to the keys its indexer picks
            index_cache = fb.cache.index_layer(self.layer_idx)
            iq = k.linear(qa, self.index_q).view(n, self.index_heads, self.index_head_dim)
            iq = k.index_rope_cache(iq, k.linear(x, self.index_k), fb.positions, fb.slots,
                                    self.index_norm_w, self.index_norm_b, self.inv_freq,
                                    self.rope_scale, index_cache)  # [N, Hi, D] rotated
            k.sparse_attention(q, iq, k.linear(x, self.index_w), cache, index_cache, fb,
                               self.kv_b, d, self.scale, self.index_topk, o)
            return k.linear(o.reshape(n, self.heads * self.v), self.o_proj).to(h.device)
        if b:  # decodes absorbed: a short cache read per query
            o_lat = torch.empty(b, self.heads, self.kv_lora, dtype=torch.float32,
                                device=self.device)
            fb.attention.run(k.absorb(q[:b, :, :self.nope], self.kv_b, d), q[:b, :, self.nope:],
                             cache, fb, self.scale, o_lat)
            o[:b] = k.values(o_lat, self.kv_b, d)
        if fb.prefill_spans:
            k.prefill_attention(q, cache, fb, self.kv_b, d, self.scale, o)
        return k.linear(o.reshape(n, self.heads * self.v), self.o_proj).to(h.device)

    def _queries(self, x: torch.Tensor, first: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: [N, H] -> (q [N, h * (nope + rope)], the normed q_a latent [N, q_lora] or None
        without q_lora); `first`: q_proj's (or q_a's) product of x when already computed."""
        k = self.kernels
        if not hasattr(self, "q_a"):
            return (first if first is not None else k.linear(x, self.q_proj)), None
        qa = first if first is not None else k.linear(x, self.q_a)
        q_b = self.q_b.quant[0] if self.q_b.quant is not None else None
        normed, xq = k.add_rmsnorm(qa, self.q_a_norm, self.eps, (),
                                   k.input_bits(q_b, qa.shape[0]))
        return k.linear(normed, self.q_b, xq), normed

    def _index_contiguous(self, x, qa, cos, sin, past_key_values) -> torch.Tensor:
        """The indexer over [B, T, ...] causal sequences (after transformers' cached prefix,
        whose indexer keys its cache keeps) -> the keys each query may attend [B, T, S] bool."""
        b, t, _ = x.shape
        half = self.rope // 2
        cos, sin = cos[..., :half], sin[..., :half]  # [B, T, rope / 2] of cat(freqs, freqs)
        iq = self.kernels.linear(qa, self.index_q).view(b, t, self.index_heads, -1)
        iq = rotate_halves(iq, cos, sin)  # [B, T, Hi, D]
        ik = index_keys(self.kernels.linear(x, self.index_k), self.index_norm_w,
                        self.index_norm_b, cos, sin)  # [B, T, D]
        iw = self.kernels.linear(x, self.index_w)  # [B, T, Hi]
        if past_key_values is not None:
            if not hasattr(past_key_values, "update_indexer"):
                raise HybridError(f"mla_attention with an indexer needs a cache that keeps "
                                  f"indexer keys (update_indexer); got "
                                  f"{type(past_key_values).__name__}")
            ik = past_key_values.update_indexer(ik, self.layer_idx)  # [B, S, D]
        allowed = causal_mask(t, ik.shape[1], self.device)  # [T, S]
        chosen = torch.zeros(b, t, ik.shape[1], dtype=torch.bool, device=self.device)
        for i in range(b):
            ids, keep = top_k_keys(index_scores(iq[i], iw[i], ik[i]), allowed, self.index_topk)
            chosen[i].scatter_(-1, ids, keep)
        return chosen

    def _contiguous(self, q_lat, q_rope, latent, k_rope, past_key_values,
                    chosen: torch.Tensor | None = None) -> torch.Tensor:
        """[B, T, ...] causal sequences, optionally after transformers' cached prefix;
        `chosen` [B, T, S]: the keys each query may attend besides causality (the indexer's)."""
        t = latent.shape[1]
        if past_key_values is not None:
            stored = past_key_values.update(latent.to(self.kv_dtype).unsqueeze(1),
                                            k_rope.to(self.kv_dtype).unsqueeze(1), self.layer_idx)
            prefix = stored[0].shape[2] - t
            latent = torch.cat([stored[0][:, 0, :prefix].float(), latent], dim=1)  # [B, S, c]
            k_rope = torch.cat([stored[1][:, 0, :prefix].float(), k_rope], dim=1)  # [B, S, r]
        kv = torch.cat([latent, k_rope], dim=-1)  # [B, S, c + r]
        allowed = causal_mask(t, kv.shape[1], self.device)  # [T, S]
        if chosen is not None:
            if chosen.shape[-1] != kv.shape[1]:  # e.g. a static cache's padded indexer keys
                raise HybridError(f"the indexer saw {chosen.shape[-1]} keys, the attention "
                                  f"{kv.shape[1]}: mla_attention takes transformers' dynamic "
                                  "cache only")
            allowed = allowed & chosen
        return attend(q_lat, q_rope, kv, allowed, self.scale)


def _cos_sin(position_embeddings, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept (cos, sin) or transformers-V2's complex freqs_cis; return fp32 [B, T, rope]."""
    if isinstance(position_embeddings, torch.Tensor) and position_embeddings.is_complex():
        freqs = position_embeddings.to(device)
        cos, sin = freqs.real.float(), freqs.imag.float()
        return torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    cos, sin = position_embeddings
    return cos.to(device, torch.float32), sin.to(device, torch.float32)
