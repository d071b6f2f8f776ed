"""The operators' kernel interface (torch_set.py) on gpu_kernels: quantized products on the
GGUF's blocks, fused norms, RoPE and cache writes, the router, the expanded prompt attention.
What its kernels do not take (a weight of two source matrices, more than two deltas) falls back
to torch's."""

from __future__ import annotations

import torch

from gpu_kernels.dequant_tile import embedding
from gpu_kernels.fused import add_rmsnorm, rope_cache, silu_mul
from gpu_kernels.handshake import Awaited
from gpu_kernels.hyper_connection import hc_weights
from gpu_kernels.mla_decode import choose_splits
from gpu_kernels.mla_index import sparse_mla_decode
from gpu_kernels.mla_prefill_expanded import mla_prefill_expanded
from gpu_kernels.qdot_i8 import empty_xq
from gpu_kernels.qformat import GpuQuant
from gpu_kernels.qmatmul import qmatmul, qmatmul_t, uses_int_path
from gpu_kernels.qtypes import F32
from gpu_kernels.router import route as gpu_route
from hybrid.ops.kernel_sets.torch_set import MLADims, TorchKernels, resolved

# a prompt chunk's sparse rows run in blocks whose indexer scores [rows, keys] f32 stay within
# this (256 MiB: 512 rows at 128K keys)
SPARSE_SCORE_BYTES = 1 << 28


class GpuKernels(TorchKernels):
    name = "gpu_kernels"
    sends_from_router = True

    def linear(self, x, weight, xq=None):
        quant = weight.quant
        if quant is not None and len(quant) == 1 and x.device == weight.device:
            q = quant[0]
            return qmatmul(x.reshape(-1, q.cols), q, xq=xq).reshape(*x.shape[:-1], q.rows)
        return super().linear(x, weight)

    def grouped_linear(self, x, weight):
        quant = weight.quant
        if quant is None or len(quant) != 1 or x.device != weight.device:
            return super().grouped_linear(x, weight)
        q = quant[0]
        rows = q.rows // x.shape[1]  # group g reads rows g * rows + [0, rows)
        return qmatmul(x.contiguous(), q, out_rows=rows, gstride=rows)

    def product(self, x, matrix, xq=None):
        return qmatmul(x, matrix, xq=xq)

    def input_bits(self, matrix, tokens):
        if matrix is None:
            return 0
        return matrix.x_bits if uses_int_path(matrix, tokens) else 0

    def add_rmsnorm(self, x, weight, eps, deltas=(), x_bits=0):
        if len(deltas) > 2:  # the fused kernel adds up to two
            return super().add_rmsnorm(x, weight, eps, deltas)
        xq = empty_xq(*x.shape, x_bits, x.device)
        awaited = None
        if len(deltas) == 2 and isinstance(deltas[1], Awaited) \
                and isinstance(deltas[0], torch.Tensor) and deltas[1].dst.device == x.device:
            deltas, awaited = deltas[:1], deltas[1]  # waited for and read by the norm's launch
        h = add_rmsnorm(x, weight, eps, *[resolved(d).to(x.device) for d in deltas], xq=xq,
                        awaited=awaited)
        return h, xq

    def embedding(self, ids, weight, hidden):
        if weight.quant is None:
            return super().embedding(ids, weight, hidden)
        return embedding(ids, weight.quant[0])

    def mlp(self, x, gate, up, down, gate_up=None, xq=None):
        if gate_up is None:  # gate and up of different types: two products
            return super().mlp(x, gate, up, down)
        d = down.quant[0]
        mid_q = empty_xq(x.shape[0], d.cols, self.input_bits(d, x.shape[0]), x.device)
        mid = silu_mul(qmatmul(x, gate_up, xq=xq), xq=mid_q)  # [N, I]
        return qmatmul(mid, d, xq=mid_q)

    def route(self, x, weight, matrix, bias, spec, send=None):
        logits = qmatmul(x, matrix)
        weights, ids = gpu_route(logits, bias, spec.num_experts_per_tok,
                                 spec.scoring_func == "sigmoid", spec.n_group, spec.topk_group,
                                 spec.norm_topk_prob, spec.routed_scaling_factor,
                                 None if send is None else (x.contiguous(), send))
        return logits, weights, ids

    def hc_weights(self, mix, base, scale, n, iters, eps):
        return hc_weights(mix, base, scale, n, iters, eps)

    def router_matrix(self, weight):
        return GpuQuant(F32, weight.shape[0], weight.shape[1], (weight,))

    def rope_cache(self, q, kv, positions, slots, norm_weight, inv_freq, rope_scale, eps,
                   cache, nope):
        rope_cache(q, kv, positions, slots, norm_weight, inv_freq, rope_scale, eps, cache, nope)

    def absorb(self, q_nope, kv_b, d: MLADims):
        quant = kv_b.quant
        if quant is None:
            return super().absorb(q_nope, kv_b, d)
        if len(quant) == 2:  # the MLA layout's k_b: head g's rows g*c .. g*c + c, nope columns
            return qmatmul(q_nope, quant[0], out_rows=d.kv_lora, gstride=d.kv_lora)
        return qmatmul_t(q_nope, quant[0], in_rows=d.nope, gstride=d.nope + d.v)

    def values(self, o_lat, kv_b, d: MLADims):
        quant = kv_b.quant
        if quant is None:
            return super().values(o_lat, kv_b, d)
        if len(quant) == 2:  # the MLA layout's v_b [h * v, c]
            return qmatmul(o_lat, quant[1], out_rows=d.v, gstride=d.v)
        return qmatmul(o_lat, quant[0], out_rows=d.v, row0=d.nope, gstride=d.nope + d.v)

    def sparse_attention(self, q, iq, iw, cache, index_cache, fb, kv_b, d: MLADims, scale,
                         topk, out):
        """Every row on gpu_kernels/mla_index.py: the indexer's scores over the keys the row
        sees, the top-k slots, the absorbed decode kernel over them. Decode rows through their
        page tables, sized by the table's width with the lengths read on the device (a CUDA
        graph captures them); a prompt chunk's rows as sequences of their own sharing its key
        slots (pages of one token), row i of a chunk of t rows over S keys seeing S - t + i + 1
        of them, in blocks of rows whose scores stay within SPARSE_SCORE_BYTES."""
        b = fb.num_decodes
        if b:
            self._sparse_rows(slice(0, b), fb.page_table, fb.seq_lens, fb.page_size,
                              fb.page_table.shape[1] * fb.page_size, q, iq, iw, cache,
                              index_cache, kv_b, d, scale, topk, out)
        for span in fb.prefill_spans:
            keys = span.kv_slots.to(torch.int32)  # [S] the chunk's keys' slots, in order
            s, t = keys.shape[0], span.q_len
            seen = torch.arange(s - t + 1, s + 1, dtype=torch.int32, device=keys.device)  # [t]
            block = max(1, SPARSE_SCORE_BYTES // (4 * s))
            for r0 in range(0, t, block):
                r1 = min(t, r0 + block)
                self._sparse_rows(slice(span.q_start + r0, span.q_start + r1),
                                  keys[None, :].expand(r1 - r0, s), seen[r0:r1], 1, s, q, iq, iw,
                                  cache, index_cache, kv_b, d, scale, topk, out)

    def _sparse_rows(self, rows, table, lengths, page_size, capacity, q, iq, iw, cache,
                     index_cache, kv_b, d: MLADims, scale, topk, out):
        n = rows.stop - rows.start
        o_lat = sparse_mla_decode(
            self.absorb(q[rows, :, :d.nope], kv_b, d), q[rows, :, d.nope:], cache, iq[rows],
            iw[rows], index_cache, table, lengths, page_size, topk, capacity, scale,
            choose_splits(n, d.heads, min(topk, capacity)))
        out[rows] = self.values(o_lat, kv_b, d)

    def prefill_attention(self, q, cache, fb, kv_b, d: MLADims, scale, out):
        """The expanded form (gpu_kernels/mla_prefill_expanded.py): the chunks' keys' latents
        (prefix and own, in the prefill index's order) multiplied out by kv_b into per-head
        k_nope and v once per step; with many keys per query ~7x fewer products than the
        absorbed form. Products in fp16 with fp32 sums (the kernel's PRECISION)."""
        meta, slots, longest = fb.prefill_index()
        rows = cache[slots]  # [S, c + r] the chunks' keys, in the cache's dtype
        latent = rows[:, :d.kv_lora].float()  # [S, c]
        quant = kv_b.quant
        if quant is not None and len(quant) == 1:  # kv_b [h * (nope + v), c] on its blocks
            kv = qmatmul(latent, quant[0])  # [S, h * (nope + v)]
        else:  # dense kv_b, or the MLA layout's k_b [h * c, nope] (a transposed product)
            kv = torch.matmul(latent, kv_b.get().float().t())
        # [S, h, nope + v] in fp16: the kernel's operands (it reads them once per block of
        # queries: half the bytes of fp32)
        kv = kv.view(-1, d.heads, d.nope + d.v).half()
        mla_prefill_expanded(q, kv[..., :d.nope], rows[:, d.kv_lora:], kv[..., d.nope:], meta,
                             scale, longest, out)


GPU_KERNELS = GpuKernels()
