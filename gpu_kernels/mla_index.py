"""DeepSeek-V3.2's sparse MLA decode on the paged caches: the lightning indexer's scores over each
sequence's cached indexer keys, its top-k, and MLA attention over those keys alone.

Sequence b (one query token, Hi indexer heads of D dims, weights w [Hi]) scores its t-th cached
token, found through its row of the page table as mla_decode finds latents, by
    score[b, t] = sum_h relu(q[b, h] . k[t] / sqrt(D)) * w[b, h] / sqrt(Hi)     t < seq_lens[b]
(-inf past its length), the definition of hybrid/ops/mla_indexer.index_scores. The top
min(topk, seq_lens[b]) positions become a table of slots, one token a "page" (page size 1), so
mla_decode attends to them unchanged: the slots of a sequence that sees fewer than topk keys
come first, its count says how many. Everything is sized by the cache's capacity and the
lengths are read on the device, so one launch (or a captured CUDA graph) serves any lengths.

Ties between equal scores may pick either key here (torch.topk's order is unspecified); the
torch path breaks them toward the lower position. Real scores tie with probability ~0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu_kernels.mla_decode import mla_decode, sequence_slots

BLOCK_TOKENS = 64  # keys a program scores
HEAD_BLOCK = 16  # indexer heads a program's product takes at a time (the dot's smallest M)


@triton.jit(do_not_specialize=["P", "T"])
def _scores_kernel(q_ptr, w_ptr, keys_ptr, table_ptr, lens_ptr, out_ptr, P, T, page_size,
                   scale, head_scale, HI: tl.constexpr, HB: tl.constexpr, D: tl.constexpr,
                   BT: tl.constexpr):
    b = tl.program_id(0)
    t = tl.program_id(1) * BT + tl.arange(0, BT)  # [BT] positions
    length = tl.load(lens_ptr + b)
    tmask = t < length
    out = tl.full((BT,), float("-inf"), tl.float32)
    if tl.program_id(1) * BT < length:  # a block past the sequence's end reads nothing
        d = tl.arange(0, D)
        page = tl.load(table_ptr + b.to(tl.int64) * P + t // page_size, mask=tmask, other=0)
        slot = page.to(tl.int64) * page_size + t % page_size  # [BT]
        k = tl.trans(tl.load(keys_ptr + slot[:, None] * D + d[None, :], mask=tmask[:, None],
                             other=0.0).to(tl.float32))  # [D, BT]
        s = tl.zeros((BT,), tl.float32)
        # HB heads at a time: all Hi heads' q and products at once outgrow the registers
        # (docs/model-files.md); tf32x3 keeps fp32's accuracy on the tensor cores, so the
        # top-k is the float reference's
        for h0 in tl.static_range(0, HI, HB):
            h = h0 + tl.arange(0, HB)
            q = tl.load(q_ptr + (b * HI + h)[:, None] * D + d[None, :]).to(tl.float32)  # [HB, D]
            w = tl.load(w_ptr + b * HI + h).to(tl.float32)  # [HB]
            dots = tl.dot(q, k, input_precision="tf32x3")  # [HB, BT]
            s += tl.sum(tl.maximum(dots * scale, 0.0) * w[:, None], axis=0)
        out = tl.where(tmask, s * head_scale, float("-inf"))
    tl.store(out_ptr + b.to(tl.int64) * T + t, out, mask=t < T)


def index_scores_paged(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor,
                       page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int,
                       capacity: int) -> torch.Tensor:
    """q [B, Hi, D] (rotated), w [B, Hi], keys [slots, D] (the indexer key cache),
    page_table [B, P] int32 (its last dim dense; rows may share one, stride 0), seq_lens [B]
    int32 -> scores [B, capacity] f32, -inf at and past each length. Hi and D: powers of two,
    D >= 16."""
    b, heads, dim = q.shape
    if heads & (heads - 1) or dim & (dim - 1) or dim < 16 or keys.shape[-1] != dim:
        raise ValueError(f"indexer heads {heads} / dims {dim} (keys {keys.shape[-1]}): powers "
                         f"of two, dims >= 16, as the cache's")
    if heads < HEAD_BLOCK:  # heads of weight 0 add relu(.) * 0: nothing
        q = torch.cat([q, q.new_zeros(b, HEAD_BLOCK - heads, dim)], dim=1)
        w = torch.cat([w, w.new_zeros(b, HEAD_BLOCK - heads)], dim=1)
    out = torch.empty(b, capacity, dtype=torch.float32, device=q.device)
    grid = (b, triton.cdiv(capacity, BLOCK_TOKENS))
    _scores_kernel[grid](q.contiguous(), w.contiguous(), keys, page_table, seq_lens, out,
                         page_table.stride(0), capacity, page_size,
                         dim ** -0.5, heads ** -0.5, HI=q.shape[1], HB=HEAD_BLOCK, D=dim,
                         BT=BLOCK_TOKENS)
    return out


def index_scores_paged_ref(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor,
                           page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int,
                           capacity: int) -> torch.Tensor:
    """Float64 reference, a sequence and a head at a time (the module doc's formula)."""
    b, heads, dim = q.shape
    out = torch.full((b, capacity), float("-inf"), dtype=torch.float64)
    for i, slots in sequence_slots(page_table, seq_lens, page_size):
        n = slots.shape[0]
        k = keys[slots].double().cpu()  # [n, D]
        s = torch.zeros(n, dtype=torch.float64)
        for h in range(heads):
            s += (k @ q[i, h].double().cpu() / dim ** 0.5).clamp(min=0) * float(w[i, h])
        out[i, :n] = s / heads ** 0.5
    return out


def top_slots(scores: torch.Tensor, page_table: torch.Tensor, seq_lens: torch.Tensor,
              page_size: int, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """scores [B, T] (index_scores_paged's) -> (slots [B, K] int32 of the top K = min(topk, T)
    positions, best first; counts [B] int32 = min(topk, seq_lens)): mla_decode's page table
    and lengths at page size 1. Slots past a sequence's count are never read."""
    k = min(topk, scores.shape[1])
    pos = scores.topk(k, dim=1).indices  # [B, K]: the sequence's own positions first
    # a position past its sequence (never read) may lie past the table: any page will do;
    # indexing (not gather) reads rows that share one table without copying it
    rows = torch.arange(pos.shape[0], device=pos.device)[:, None]
    page = page_table[rows, (pos // page_size).clamp(max=page_table.shape[1] - 1)].long()
    slots = (page * page_size + pos % page_size).to(torch.int32)
    return slots, seq_lens.clamp(max=k).to(torch.int32)


def sparse_mla_decode(q_lat: torch.Tensor, q_rope: torch.Tensor, cache: torch.Tensor,
                      index_q: torch.Tensor, index_w: torch.Tensor, index_keys: torch.Tensor,
                      page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int,
                      topk: int, capacity: int, scale: float, num_splits: int) -> torch.Tensor:
    """One sparse MLA decode step of B sequences: q_lat [B, H, C], q_rope [B, H, R], the latent
    cache [slots, C + R], the indexer's q [B, Hi, D] and w [B, Hi] and key cache [slots, D],
    page_table [B, P] int32, seq_lens [B] int32 (each with the new token's rows already
    written) -> out [B, H, C] f32: mla_decode over each sequence's top-k keys."""
    scores = index_scores_paged(index_q, index_w, index_keys, page_table, seq_lens, page_size,
                                capacity)
    slots, counts = top_slots(scores, page_table, seq_lens, page_size, topk)
    return mla_decode(q_lat, q_rope, cache, slots, counts, 1, scale, num_splits)
