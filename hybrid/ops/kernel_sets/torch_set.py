"""The operators' kernel interface, in torch. Every method is a contract both sets keep (same
inputs, same outputs within their arithmetic's error); gpu_set.py overrides them with
gpu_kernels. Compute is f32; tensors stay on the operator's device."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gpu_kernels.reference import hc_weights_ref, rope_cache_ref, route_ref
from hybrid.ops.mla_indexer import (
    index_keys,
    index_scores,
    rope_cos_sin,
    rotate_halves,
    sparse_attend,
    top_k_keys,
)
from hybrid.ops.mla_torch import attend, causal_mask

# a chunk's sparse rows attend in blocks: each gathers its K keys, [rows, K, c + r] f32
# (64 rows of V3.2: 300 MB)
SPARSE_ROWS = 64


@dataclass(frozen=True)
class MLADims:
    heads: int
    nope: int  # per-head query/key dims without RoPE
    rope: int  # the shared rotated key's dims
    v: int  # per-head value dims
    kv_lora: int  # the latent's dims (c)


class TorchKernels:
    name = "torch"
    # whether `route` writes a Handover from the router's own launch (else: copies, then a flag)
    sends_from_router = False

    # -- products and norms ------------------------------------------------------------------

    def linear(self, x: torch.Tensor, weight, xq=None) -> torch.Tensor:
        """x [..., in] @ weight (a hybrid.ops.weights.Weight [out, in])^T -> [..., out] f32.
        xq: x quantized by its producer for the integer path (ignored where there is none)."""
        return F.linear(x.float(), weight.get().float())

    def grouped_linear(self, x: torch.Tensor, weight) -> torch.Tensor:
        """x [N, G, in] -> [N, G, out/G] f32: group g times rows g*out/G .. (g+1)*out/G of
        weight (a Weight [out, in]): a block-diagonal product (DeepSeek-V4's grouped output
        projection)."""
        groups = x.shape[1]
        w = weight.get().float()  # [out, in]
        return torch.einsum("ngk,grk->ngr", x.float(), w.view(groups, -1, w.shape[-1]))

    def product(self, x: torch.Tensor, matrix, xq=None) -> torch.Tensor:
        """x [N, in] @ matrix (a gpu_kernels GpuQuant [out, in], as stack_rows makes)^T ->
        [N, out] f32."""
        from gpu_kernels.dequant_ref import dequantize

        return x.float() @ dequantize(matrix).float().T

    def input_bits(self, matrix, tokens: int) -> int:
        """The bits a product of `tokens` rows with `matrix` (GpuQuant or None) takes its input
        quantized to (0: f32 input): what a fused producer of that input should write."""
        return 0

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x [N, D] f32 -> weight * x / rms(x)."""
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def add_rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                    deltas: tuple = (), x_bits: int = 0):
        """x += sum(deltas), in place (x [N, D] f32); -> (rmsnorm(x), the same quantized to
        x_bits for the next product's integer path, or None). A delta may be the host's answer
        not yet on the device (gpu_kernels.handshake.Awaited): it is waited for first."""
        for d in deltas:
            x += resolved(d).to(x.device)
        return self.rmsnorm(x, weight, eps), None

    # -- layers ------------------------------------------------------------------------------

    def embedding(self, ids: torch.Tensor, weight, hidden: int) -> torch.Tensor:
        """ids [N] -> rows [N, hidden] f32 of the embedding `weight` [V, hidden]."""
        if weight.fmt == "gguf" and weight._dense is None:
            # dequantize only the rows looked up: raw rows are whole blocks
            from hybrid.gguf.dequant import dequantize

            raw = weight._raw[0]
            rows = raw.data.reshape(raw.shape[0], -1)[ids]
            return dequantize(rows, raw.qtype, (ids.numel(), hidden))
        return F.embedding(ids, weight.get()).float()

    def mlp(self, x: torch.Tensor, gate, up, down, gate_up=None, xq=None) -> torch.Tensor:
        """down(silu(gate x) * up x): x [N, H] f32 -> [N, H]; gate_up: gate's and up's rows
        stacked as one GpuQuant (stack_rows) or None; xq: x quantized for gate_up."""
        return self.linear(F.silu(self.linear(x, gate)) * self.linear(x, up), down)

    def route(self, x: torch.Tensor, weight: torch.Tensor, matrix, bias, spec, send=None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The router: x [N, H] f32, weight [E, H] f32 (matrix: the same as a GpuQuant, or
        None) -> (logits [N, E], weights [N, K] f32, ids [N, K] int64). send: a
        gpu_kernels.handshake.Handover that x and the choices then go to, its flag raised."""
        logits = x @ weight.T
        weights, ids = route_ref(logits, bias, spec.num_experts_per_tok,
                                 spec.scoring_func == "sigmoid", spec.n_group, spec.topk_group,
                                 spec.norm_topk_prob, spec.routed_scaling_factor)
        if send is not None:
            send.send(x, ids, weights)
        return logits, weights, ids

    def hc_weights(self, mix: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, n: int,
                   iters: int, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """DeepSeek-V4's hyper-connection weights: mix [T, (2 + n) n] f32 -> (pre [T, n],
        post [T, n], comb [T, n, n]) (gpu_kernels.hyper_connection's contract)."""
        return hc_weights_ref(mix, base, scale, n, iters, eps)

    def router_matrix(self, weight: torch.Tensor) -> object | None:
        """The router's weight as the products read it (None: torch reads it as it is)."""
        del weight
        return None

    # -- MLA attention -----------------------------------------------------------------------

    def rope_cache(self, q, kv, positions, slots, norm_weight, inv_freq, rope_scale, eps,
                   cache, nope) -> None:
        """q [N, h, nope + r]: its rope dims rotated in place; kv [N, c + r]: the latent
        normed and its key rotated, written to cache rows `slots` (gpu_kernels.fused's
        contract)."""
        rope_cache_ref(q, kv, positions, slots, norm_weight, inv_freq, rope_scale, eps, cache,
                       nope)

    def absorb(self, q_nope: torch.Tensor, kv_b, d: MLADims) -> torch.Tensor:
        """q_nope [N, h, nope] -> q_nope @ W_UK: [N, h, c] (kv_b: the layer's Weight)."""
        return torch.einsum("nhk,hkc->nhc", q_nope.float(), _w_kv(kv_b, d)[:, :d.nope])

    def values(self, o_lat: torch.Tensor, kv_b, d: MLADims) -> torch.Tensor:
        """o_c [N, h, c] -> o_c @ W_UV^T: [N, h, v]."""
        return torch.einsum("nhc,hvc->nhv", o_lat, _w_kv(kv_b, d)[:, d.nope:])

    def prefill_attention(self, q: torch.Tensor, cache: torch.Tensor, fb, kv_b, d: MLADims,
                          scale: float, out: torch.Tensor) -> None:
        """A step's prompt chunks (fb.prefill_spans), each causal over its cached keys:
        q [N, h, nope + r] (rope dims rotated) -> out's chunk rows [., h, v]. Here in the
        absorbed form, a chunk at a time."""
        for span in fb.prefill_spans:
            rows = slice(span.q_start, span.q_start + span.q_len)
            kv = cache[span.kv_slots].float()  # [S, c + r]
            o_lat = attend(self.absorb(q[rows, :, :d.nope], kv_b, d), q[rows, :, d.nope:], kv,
                           causal_mask(span.q_len, span.kv_len, q.device), scale)
            out[rows] = self.values(o_lat, kv_b, d)

    # -- DeepSeek-V3.2's lightning indexer and sparse attention (mla_indexer.py) -------------

    def index_rope_cache(self, iq: torch.Tensor, ik: torch.Tensor, positions: torch.Tensor,
                         slots: torch.Tensor, norm_weight: torch.Tensor,
                         norm_bias: torch.Tensor, inv_freq: torch.Tensor, rope_scale: float,
                         index_cache: torch.Tensor) -> torch.Tensor:
        """iq [N, Hi, D] -> its rotated copy; ik [N, D] (wk's product): LayerNorm'd, rotated
        and written to index_cache rows `slots` (the same rows as the tokens' latents)."""
        cos, sin = rope_cos_sin(positions, inv_freq, rope_scale)  # [N, rope / 2]
        index_cache[slots.long()] = index_keys(ik, norm_weight, norm_bias, cos, sin
                                               ).to(index_cache.dtype)
        return rotate_halves(iq.float(), cos, sin)

    def sparse_attention(self, q: torch.Tensor, iq: torch.Tensor, iw: torch.Tensor,
                         cache: torch.Tensor, index_cache: torch.Tensor, fb, kv_b, d: MLADims,
                         scale: float, topk: int, out: torch.Tensor) -> None:
        """Every row of the step, decodes and prompt chunks alike: score the keys it sees
        (a decode: its sequence's pages up to seq_len; a chunk row: its chunk's kv_slots up
        to its own position) with the indexer, keep the top `topk`, attend to those alone.
        q [N, h, nope + r] (rope dims rotated), iq [N, Hi, D] (rotated), iw [N, Hi]
        -> out [N, h, v]."""
        for rows, kv_slots in _sequences(fb):
            t, s = rows.stop - rows.start, kv_slots.shape[0]
            allowed = causal_mask(t, s, q.device)  # [t, S]
            scores = index_scores(iq[rows], iw[rows], index_cache[kv_slots])  # [t, S]
            ids, keep = top_k_keys(scores, allowed, topk)  # [t, K]
            q_lat = self.absorb(q[rows, :, :d.nope], kv_b, d)  # [t, h, c]
            q_rope, kv = q[rows, :, d.nope:], cache[kv_slots].float()
            o_lat = torch.empty_like(q_lat)
            # rows in blocks: each attends to its own K keys, gathered [rows, K, c + r]
            for r0 in range(0, t, SPARSE_ROWS):
                r = slice(r0, min(t, r0 + SPARSE_ROWS))
                o_lat[r] = sparse_attend(q_lat[r], q_rope[r], kv, ids[r], keep[r], scale)
            out[rows] = self.values(o_lat, kv_b, d)


def _sequences(fb):
    """(rows, kv_slots [S]) of each sequence of a step: each decode row, then each chunk."""
    page_size = fb.page_size
    for i in range(fb.num_decodes):
        positions = torch.arange(int(fb.seq_lens[i]), device=fb.page_table.device)  # [S]
        pages = fb.page_table[i, positions // page_size]
        yield slice(i, i + 1), pages * page_size + positions % page_size
    for span in fb.prefill_spans:
        yield slice(span.q_start, span.q_start + span.q_len), span.kv_slots


def _w_kv(kv_b, d: MLADims) -> torch.Tensor:
    """kv_b as [h, nope + v, c] f32."""
    return kv_b.get().float().view(d.heads, d.nope + d.v, d.kv_lora)


def resolved(delta):
    """A delta as a tensor: the host's answer (gpu_kernels.handshake.Awaited) waited for and
    fetched to the device, a tensor as it is."""
    return delta if isinstance(delta, torch.Tensor) else delta.resolve()
