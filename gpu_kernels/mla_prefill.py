"""MLA attention for a step's prefill chunks over the paged latent cache, in the absorbed form.

A chunk (span) is q_len query tokens of one sequence at positions kv_len - q_len .. kv_len - 1,
attending causally to that sequence's first kv_len cached tokens (its prefix and its own, the
latents already written), found through the span's slot list:
    s[i, h, t] = (q_lat[i, h] . c[t] + q_rope[i, h] . k_r[t]) * scale,  t <= pos(i)
    out[i, h] = softmax_t(s[i, h]) @ c                                   [N, H, C]
One launch serves every span of a step, whatever their lengths: a program takes BQ tokens x BH
heads of one span as the rows of its tiles (all heads share the latent rows) and streams the
span's keys once in blocks of BS, with an online softmax (flash attention); it stops at the
last key its tokens may see. Products on tensor cores in tf32 like mla_decode (bf16 cache rows
are exact in tf32; ~1e-3 relative error in the output), softmax and sums in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu_kernels.mla_decode import PRECISION, softmax_step

ROWS = 32  # query rows (tokens x heads) of a program's tiles
BLOCK_KEYS = 16


@triton.jit
def _prefill_kernel(q_ptr, qr_ptr, cache_ptr, meta_ptr, slots_ptr, o_ptr, H, scale,
                    sqn, sqh, sqrn, sqrh, C: tl.constexpr, R: tl.constexpr, BQ: tl.constexpr,
                    BH: tl.constexpr, BS: tl.constexpr, PREC: tl.constexpr):
    qb = tl.program_id(0)
    sp = tl.program_id(1)
    hb = tl.program_id(2)
    q_start = tl.load(meta_ptr + sp * 4)
    q_len = tl.load(meta_ptr + sp * 4 + 1)
    kv_len = tl.load(meta_ptr + sp * 4 + 2)
    kv_off = tl.load(meta_ptr + sp * 4 + 3)
    i = qb * BQ + tl.arange(0, BQ)  # [BQ] token of the chunk
    h = hb * BH + tl.arange(0, BH)  # [BH]
    imask = i < q_len
    m2 = imask[:, None] & (h < H)[None, :]  # [BQ, BH]
    c = tl.arange(0, C)
    rr = tl.arange(0, R)
    row = (q_start + i).to(tl.int64)[:, None, None]  # [BQ, 1, 1] rows of the step
    q = tl.load(q_ptr + row * sqn + h[None, :, None] * sqh + c[None, None, :],
                mask=m2[:, :, None], other=0.0)
    qr = tl.load(qr_ptr + row * sqrn + h[None, :, None] * sqrh + rr[None, None, :],
                 mask=m2[:, :, None], other=0.0)
    q = tl.reshape(q, (BQ * BH, C))
    qr = tl.reshape(qr, (BQ * BH, R))
    pos = kv_len - q_len + i  # [BQ] each token's position: it sees keys 0..pos
    pos_rows = tl.reshape(tl.broadcast_to(pos[:, None], (BQ, BH)), (BQ * BH,))
    # the keys the block's last token sees; none for a block past the chunk's end
    end = tl.where(qb * BQ < q_len, tl.minimum(kv_len, kv_len - q_len + qb * BQ + BQ), 0)
    m_i = tl.full((BQ * BH,), float("-inf"), tl.float32)
    l_i = tl.zeros((BQ * BH,), tl.float32)
    acc = tl.zeros((BQ * BH, C), tl.float32)
    for t0 in range(0, end, BS):
        t = t0 + tl.arange(0, BS)
        tmask = t < end
        slot = tl.load(slots_ptr + kv_off + t, mask=tmask, other=0) * (C + R)  # [BS]
        kv = tl.load(cache_ptr + slot[:, None] + c[None, :], mask=tmask[:, None], other=0.0)
        kr = tl.load(cache_ptr + slot[:, None] + C + rr[None, :], mask=tmask[:, None], other=0.0)
        kv = kv.to(tl.float32)
        s = tl.dot(q, tl.trans(kv), input_precision=PREC)
        s += tl.dot(qr, tl.trans(kr.to(tl.float32)), input_precision=PREC)
        seen = tmask[None, :] & (t[None, :] <= pos_rows[:, None])  # [rows, BS]
        s = tl.where(seen, s * scale, float("-inf"))
        # every row sees key 0 in the first block (padding rows too: their pos >= 0)
        m_i, l_i, acc = softmax_step(s, kv, m_i, l_i, acc, PREC)
    out = tl.reshape(acc / tl.maximum(l_i, 1e-30)[:, None], (BQ, BH, C))
    tl.store(o_ptr + (row * H + h[None, :, None]) * C + c[None, None, :], out,
             mask=m2[:, :, None])


def _heads_per_program(heads: int) -> int:
    # 16 heads x 2 tokens; fewer heads (tiny models) pad to 16: a 3-D tile of more tokens
    # than heads spills
    return 16 if heads >= 16 else max(16, triton.next_power_of_2(heads))


def mla_prefill(q_lat: torch.Tensor, q_rope: torch.Tensor, cache: torch.Tensor,
                meta: torch.Tensor, slots: torch.Tensor, scale: float, max_q_len: int,
                out: torch.Tensor, precision: str = PRECISION) -> torch.Tensor:
    """q_lat [N, H, C] f32, q_rope [N, H, R] f32 (a strided view is fine: the last dim dense),
    cache [slots, C + R]; meta [S, 4] int64 per span (first row, q_len, kv_len, offset of its
    kv_len slots in `slots`); slots [sum kv_len] int64 cache rows -> out [N, H, C] f32: the
    spans' rows written, the others untouched. max_q_len: the longest span (host-known)."""
    _, h, c = q_lat.shape
    r = q_rope.shape[-1]
    if cache.shape[-1] != c + r or c & (c - 1) or r & (r - 1):
        raise ValueError(f"cache rows of {cache.shape[-1]} for C={c}, R={r} (powers of two)")
    if q_lat.stride(-1) != 1 or q_rope.stride(-1) != 1 or not out.is_contiguous():
        raise ValueError("mla_prefill needs q_lat's and q_rope's last dims dense, out dense")
    spans = meta.shape[0]
    if spans == 0:
        return out
    bh = _heads_per_program(h)
    bq = max(1, ROWS // bh)
    grid = (triton.cdiv(max_q_len, bq), spans, triton.cdiv(h, bh))
    _prefill_kernel[grid](q_lat, q_rope, cache, meta, slots, out, h, scale, q_lat.stride(0),
                          q_lat.stride(1), q_rope.stride(0), q_rope.stride(1), C=c, R=r,
                          BQ=bq, BH=bh, BS=BLOCK_KEYS, PREC=precision, num_warps=8)
    return out


def mla_prefill_ref(q_lat: torch.Tensor, q_rope: torch.Tensor, cache: torch.Tensor,
                    meta: torch.Tensor, slots: torch.Tensor, scale: float,
                    out: torch.Tensor) -> torch.Tensor:
    """Float64 reference, one span at a time (out's other rows untouched)."""
    c = q_lat.shape[-1]
    for q_start, q_len, kv_len, off in meta.tolist():
        kv = cache[slots[off:off + kv_len]].double()  # [S, C + R]
        rows = slice(q_start, q_start + q_len)
        s = (torch.einsum("thc,sc->hts", q_lat[rows].double(), kv[:, :c])
             + torch.einsum("thr,sr->hts", q_rope[rows].double(), kv[:, c:])) * scale
        out[rows] = torch.einsum("hts,sc->thc", causal_softmax(s, q_len, kv_len),
                                 kv[:, :c]).float()
    return out


def causal_softmax(s: torch.Tensor, q_len: int, kv_len: int) -> torch.Tensor:
    """s [h, t, S] scores of a span's q_len tokens (the last of kv_len) -> the softmax over the
    keys each token sees (0 .. its position). The references' shared step."""
    pos = torch.arange(kv_len - q_len, kv_len, device=s.device)
    seen = torch.arange(kv_len, device=s.device)[None, :] <= pos[:, None]  # [t, S]
    return torch.softmax(s.masked_fill(~seen, float("-inf")), dim=-1)
