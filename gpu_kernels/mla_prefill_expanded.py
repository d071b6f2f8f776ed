"""MLA attention for a step's prefill chunks in the expanded form: per-head keys and values.

The absorbed form (mla_prefill.py) multiplies every query row of 512 latent + 64 rope columns
by every key: 576 + 512 multiply-adds per (query, head, key). For long prompts the expanded
form is ~7x less work: the keys' latents are first multiplied out by kv_b into per-head
k_nope [S, h, nope] and v [S, h, v] (one GEMM per step, linear in S), then
    s[i, t] = (q_nope[i] . k_nope[t] + q_rope[i] . k_rope[t]) * scale,  t <= pos(i)
    out[i] = softmax_t(s[i]) @ v                                          per head
costs nope + rope + v = 320 (DeepSeek's dims) per (query, head, key). k_rope [S, r] is shared
by the heads (read from the cache rows as they are).

One launch serves every span of a step: a program takes BQ tokens of one span and one head
and streams that span's keys in blocks of BS with an online softmax, up to the last key its
tokens see (causal). Spans use the same meta as mla_prefill: (first row, q_len, kv_len, offset
of the span's keys in k_nope/k_rope/v). Products on tensor cores in tf32 (~1e-3 relative error
in the output), softmax and sums in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu_kernels.mla_decode import PRECISION, softmax_step
from gpu_kernels.mla_prefill import causal_softmax

# tokens x keys per step, warps: sm_90 compiles (python -m gpu_kernels.compile_check) 32 x 32
# in 8 warps with the fewest spills in tf32 (40 bytes; 64 x 32: 96, 64 x 64: 280)
BLOCK_QUERIES = 32
BLOCK_KEYS = 32
WARPS = 8


@triton.jit
def _expanded_kernel(q_ptr, kn_ptr, kr_ptr, v_ptr, meta_ptr, o_ptr, scale, sqn, sqh, skn, skh,
                     skr, svn, svh, son, soh, NOPE: tl.constexpr, R: tl.constexpr,
                     V: tl.constexpr, BQ: tl.constexpr, BS: tl.constexpr, PREC: tl.constexpr):
    qb = tl.program_id(0)
    sp = tl.program_id(1)
    hd = tl.program_id(2).to(tl.int64)
    q_start = tl.load(meta_ptr + sp * 4)
    q_len = tl.load(meta_ptr + sp * 4 + 1)
    kv_len = tl.load(meta_ptr + sp * 4 + 2)
    kv_off = tl.load(meta_ptr + sp * 4 + 3)
    i = qb * BQ + tl.arange(0, BQ)  # [BQ] token of the span
    imask = i < q_len
    dn, dr, dv = tl.arange(0, NOPE), tl.arange(0, R), tl.arange(0, V)
    row = (q_start + i).to(tl.int64)[:, None]  # [BQ, 1] rows of the step
    q_row = q_ptr + row * sqn + hd * sqh
    qn = tl.load(q_row + dn[None, :], mask=imask[:, None], other=0.0)  # [BQ, NOPE]
    qr = tl.load(q_row + NOPE + dr[None, :], mask=imask[:, None], other=0.0)  # [BQ, R]
    pos = kv_len - q_len + i  # [BQ] each token's position: it sees keys 0..pos
    # the keys the block's last token sees; none for a block past the span's end
    end = tl.where(qb * BQ < q_len, tl.minimum(kv_len, kv_len - q_len + qb * BQ + BQ), 0)
    m_i = tl.full((BQ,), float("-inf"), tl.float32)
    l_i = tl.zeros((BQ,), tl.float32)
    acc = tl.zeros((BQ, V), tl.float32)
    for t0 in range(0, end, BS):
        t = t0 + tl.arange(0, BS)
        tmask = (t < end)[:, None]
        key = (kv_off + t).to(tl.int64)[:, None]  # [BS, 1]
        kn = tl.load(kn_ptr + key * skn + hd * skh + dn[None, :], mask=tmask, other=0.0)
        kr = tl.load(kr_ptr + key * skr + dr[None, :], mask=tmask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + key * svn + hd * svh + dv[None, :], mask=tmask, other=0.0)
        s = tl.dot(qn, tl.trans(kn), input_precision=PREC)
        s += tl.dot(qr, tl.trans(kr), input_precision=PREC)  # [BQ, BS]
        seen = (t < end)[None, :] & (t[None, :] <= pos[:, None])
        s = tl.where(seen, s * scale, float("-inf"))
        # every row sees key 0 in the first block (padding rows too: their pos >= 0)
        m_i, l_i, acc = softmax_step(s, v, m_i, l_i, acc, PREC)
    out = acc / tl.maximum(l_i, 1e-30)[:, None]
    tl.store(o_ptr + row * son + hd * soh + dv[None, :], out, mask=imask[:, None])


def mla_prefill_expanded(q: torch.Tensor, k_nope: torch.Tensor, k_rope: torch.Tensor,
                         v: torch.Tensor, meta: torch.Tensor, scale: float, max_q_len: int,
                         out: torch.Tensor, precision: str = PRECISION) -> torch.Tensor:
    """q [N, h, nope + r] f32 (rope dims rotated), k_nope [S, h, nope] f32, k_rope [S, r] (any
    float dtype), v [S, h, v] f32 (strided views fine: last dims dense); meta [spans, 4] int64
    (first row, q_len, kv_len, offset of its keys) -> out [N, h, v] f32: the spans' rows
    written, the others untouched. max_q_len: the longest span (host-known)."""
    _, h, d = q.shape
    nope, r, dv = k_nope.shape[-1], k_rope.shape[-1], v.shape[-1]
    if d != nope + r or any(x & (x - 1) or x < 16 for x in (nope, r, dv)):
        raise ValueError(f"q of {d} dims for nope={nope}, rope={r}, v={dv} (powers of two, "
                         f">= 16)")
    if any(t.stride(-1) != 1 for t in (q, k_nope, k_rope, v, out)):
        raise ValueError("mla_prefill_expanded needs every operand's last dim dense")
    if meta.shape[0] == 0:
        return out
    grid = (triton.cdiv(max_q_len, BLOCK_QUERIES), meta.shape[0], h)
    _expanded_kernel[grid](q, k_nope, k_rope, v, meta, out, scale, q.stride(0), q.stride(1),
                           k_nope.stride(0), k_nope.stride(1), k_rope.stride(0), v.stride(0),
                           v.stride(1), out.stride(0), out.stride(1), NOPE=nope, R=r, V=dv,
                           BQ=BLOCK_QUERIES, BS=BLOCK_KEYS, PREC=precision, num_warps=WARPS)
    return out


def mla_prefill_expanded_ref(q: torch.Tensor, k_nope: torch.Tensor, k_rope: torch.Tensor,
                             v: torch.Tensor, meta: torch.Tensor, scale: float,
                             out: torch.Tensor) -> torch.Tensor:
    """Float64 reference, one span at a time (out's other rows untouched)."""
    nope = k_nope.shape[-1]
    for q_start, q_len, kv_len, off in meta.tolist():
        rows, keys = slice(q_start, q_start + q_len), slice(off, off + kv_len)
        qs = q[rows].double()
        s = (torch.einsum("thd,shd->hts", qs[..., :nope], k_nope[keys].double())
             + torch.einsum("thr,sr->hts", qs[..., nope:], k_rope[keys].double())) * scale
        out[rows] = torch.einsum("hts,shv->thv", causal_softmax(s, q_len, kv_len),
                                 v[keys].double()).float()
    return out
