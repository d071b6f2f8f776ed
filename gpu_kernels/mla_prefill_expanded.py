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
of the span's keys in k_nope/k_rope/v). Products on tensor cores with fp32 sums, the operands
rounded to fp16 (default) or tf32: both keep 10 mantissa bits (~1e-3 relative error in the
output), fp16 at twice the rate and in half the registers, so its tiles are 4x larger. fp16's
range (65504) bounds the queries, keys and values; softmax weights are in [0, 1].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu_kernels.mla_decode import softmax_step
from gpu_kernels.mla_prefill import causal_softmax

PRECISION = "fp16"
# (tokens, keys per step, warps, pipeline stages) per precision. tf32: the fewest register
# spills on sm_90 (python -m gpu_kernels.compile_check); fp16 (keys and values in fp16): the
# fastest measured (scripts/bench_gpu_kernels.py --prefill-sweep). Both: docs/long-prompts.md.
TILES = {"tf32": (32, 32, 8, 1), "fp16": (128, 128, 8, 1)}
# The kernel's PREC for fp16 operands is "fp16ops", not "fp16": JITFunction.preload (which
# precompile.py compiles from) reads back a string constexpr that names a Triton dtype as that
# dtype, and the kernel compiled from it took the tf32 branch with a dtype and failed.
KERNEL_PRECISION = {"fp16": "fp16ops", "tf32": "tf32"}


@triton.jit
def _keys_block(t0, qn, qr, pos, end, m_i, l_i, acc, kn_ptr, kr_ptr, v_ptr, kv_off, hd, scale,
                skn, skh, skr, svn, svh, dn, dr, dv, BS: tl.constexpr, PREC: tl.constexpr,
                MASKED: tl.constexpr):
    """Keys t0 + [0, BS) into the running softmax; MASKED: some are past `end` or after a
    row's position (else every row sees every key of the block)."""
    t = t0 + tl.arange(0, BS)
    tmask = (t < end)[:, None]
    key = (kv_off + t).to(tl.int64)[:, None]  # [BS, 1]
    kn = tl.load(kn_ptr + key * skn + hd * skh + dn[None, :], mask=tmask, other=0.0)
    kr = tl.load(kr_ptr + key * skr + dr[None, :], mask=tmask, other=0.0)
    v = tl.load(v_ptr + key * svn + hd * svh + dv[None, :], mask=tmask, other=0.0)
    if PREC == "fp16ops":
        kn, kr, v = kn.to(tl.float16), kr.to(tl.float16), v.to(tl.float16)
        s = tl.dot(qn, tl.trans(kn)) + tl.dot(qr, tl.trans(kr))  # [BQ, BS] fp32 sums
    else:  # fp32 operands whatever the keys' and values' dtype
        kn, kr, v = kn.to(tl.float32), kr.to(tl.float32), v.to(tl.float32)
        s = tl.dot(qn, tl.trans(kn), input_precision=PREC)
        s += tl.dot(qr, tl.trans(kr), input_precision=PREC)  # [BQ, BS]
    s = s * scale
    if MASKED:
        seen = (t < end)[None, :] & (t[None, :] <= pos[:, None])
        s = tl.where(seen, s, float("-inf"))
    return softmax_step(s, v, m_i, l_i, acc, PREC)


@triton.jit
def _expanded_kernel(q_ptr, kn_ptr, kr_ptr, v_ptr, meta_ptr, o_ptr, scale, sqn, sqh, skn, skh,
                     skr, svn, svh, son, soh, NOPE: tl.constexpr, R: tl.constexpr,
                     V: tl.constexpr, BQ: tl.constexpr, BS: tl.constexpr, PREC: tl.constexpr,
                     STAGES: tl.constexpr):
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
    if PREC == "fp16ops":
        qn, qr = qn.to(tl.float16), qr.to(tl.float16)
    pos = kv_len - q_len + i  # [BQ] each token's position: it sees keys 0..pos
    # the keys the block's last token sees; none for a block past the span's end
    end = tl.where(qb * BQ < q_len, tl.minimum(kv_len, kv_len - q_len + qb * BQ + BQ), 0)
    # whole blocks of keys that the block's first token (so every token) sees: no mask
    free = tl.minimum((kv_len - q_len + qb * BQ + 1) // BS * BS, end)
    m_i = tl.full((BQ,), float("-inf"), tl.float32)
    l_i = tl.zeros((BQ,), tl.float32)
    acc = tl.zeros((BQ, V), tl.float32)
    for t0 in tl.range(0, free, BS, num_stages=STAGES):
        m_i, l_i, acc = _keys_block(t0, qn, qr, pos, end, m_i, l_i, acc, kn_ptr, kr_ptr, v_ptr,
                                    kv_off, hd, scale, skn, skh, skr, svn, svh, dn, dr, dv, BS,
                                    PREC, False)
    # every row sees key 0 in the first block (padding rows too: their pos >= 0), so no row's
    # running max stays -inf
    for t0 in tl.range(free, end, BS, num_stages=STAGES):
        m_i, l_i, acc = _keys_block(t0, qn, qr, pos, end, m_i, l_i, acc, kn_ptr, kr_ptr, v_ptr,
                                    kv_off, hd, scale, skn, skh, skr, svn, svh, dn, dr, dv, BS,
                                    PREC, True)
    out = acc / tl.maximum(l_i, 1e-30)[:, None]
    tl.store(o_ptr + row * son + hd * soh + dv[None, :], out, mask=imask[:, None])


def mla_prefill_expanded(q: torch.Tensor, k_nope: torch.Tensor, k_rope: torch.Tensor,
                         v: torch.Tensor, meta: torch.Tensor, scale: float, max_q_len: int,
                         out: torch.Tensor, precision: str = PRECISION,
                         tiles: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """q [N, h, nope + r] f32 (rope dims rotated), k_nope [S, h, nope] f32 or fp16, k_rope
    [S, r] (any float dtype), v [S, h, v] f32 or fp16 (strided views fine: last dims dense);
    meta [spans, 4] int64 (first row, q_len, kv_len, offset of its keys) -> out [N, h, v] f32:
    the spans' rows written, the others untouched. max_q_len: the longest span (host-known).
    precision: "fp16" or "tf32" products; tiles (tokens, keys, warps, stages) override TILES."""
    _, h, d = q.shape
    nope, r, dv = k_nope.shape[-1], k_rope.shape[-1], v.shape[-1]
    if d != nope + r or any(x & (x - 1) or x < 16 for x in (nope, r, dv)):
        raise ValueError(f"q of {d} dims for nope={nope}, rope={r}, v={dv} (powers of two, "
                         f">= 16)")
    if any(t.stride(-1) != 1 for t in (q, k_nope, k_rope, v, out)):
        raise ValueError("mla_prefill_expanded needs every operand's last dim dense")
    if meta.shape[0] == 0:
        return out
    if precision not in TILES:
        raise ValueError(f"precision {precision!r}: one of {sorted(TILES)}")
    bq, bs, warps, stages = tiles or TILES[precision]
    grid = (triton.cdiv(max_q_len, bq), meta.shape[0], h)
    _expanded_kernel[grid](q, k_nope, k_rope, v, meta, out, scale, q.stride(0), q.stride(1),
                           k_nope.stride(0), k_nope.stride(1), k_rope.stride(0), v.stride(0),
                           v.stride(1), out.stride(0), out.stride(1), NOPE=nope, R=r, V=dv,
                           BQ=bq, BS=bs, PREC=KERNEL_PRECISION[precision], STAGES=stages,
                           num_warps=warps)
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
