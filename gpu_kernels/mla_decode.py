"""MLA attention for a batch of decodes over the paged latent cache, in the absorbed form.

Sequence b (one query token, H heads) attends to its seq_lens[b] cached tokens, found through
its row of the page table:
    s[h, t] = (q_lat[b, h] . c[t] + q_rope[b, h] . k_r[t]) * scale     c, k_r: cache rows
    out[b, h] = softmax_t(s[h]) @ c                                     [B, H, C]
Every head of a sequence reads the same latent rows (MLA shares them), so a program takes a
block of heads and reads each cache row once for all of them. Long sequences are split over
`num_splits` programs (flash-decoding); a second kernel merges the splits by their
log-sum-exp. The split count is fixed at launch while the lengths are read on the device, so
one launch (or one captured CUDA graph) serves sequences of any length. A sequence uses only
the splits its length fills (`_used_splits`, whole blocks each): a graph's count is sized for
the longest sequence the cache holds, and a short one's empty splits return at once, before
reading the queries, and are not merged. A sequence of length 0
(a padding row) gets zeros. Products run on tensor cores in bf16x2 for a bf16 cache: its rows
as they are, each fp32 query and probability as the sum of two bf16 (two products), so the
output is within ~3e-6 of the float64 reference (tf32 products: ~4e-4) at the same speed
(docs/kernel-tuning.md); other caches in tf32. Softmax and sums in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu_kernels.device_function import INTERPRETED, device_function

PRECISION = "tf32"  # the absorbed prefill kernel's products (mla_prefill.py)
DECODE_PRECISION = "bf16x2"  # for a bf16 cache (else tf32)


@device_function
def split_bf16(x):
    """x fp32 -> (hi, lo) bf16 with hi + lo = x to ~2^-16 relative: two bf16 products with an
    exact bf16 operand then equal an fp32 product to that (tf32 keeps ~2^-11)."""
    hi = x.to(tl.bfloat16)
    return hi, (x - hi.to(tl.float32)).to(tl.bfloat16)


# Triton's interpreter multiplies bf16 tiles wrongly (3.9: values ~1e10 off); the same products
# in fp32 there are exact (a bf16 x bf16 product fits fp32)
_NATIVE_BF16 = tl.constexpr(not INTERPRETED)


@device_function
def dot_bf16x2(x_hi, x_lo, y):
    """(x_hi + x_lo) @ y in fp32, y bf16 (exact): two bf16 tensor-core products."""
    if _NATIVE_BF16:
        return tl.dot(x_hi, y) + tl.dot(x_lo, y)
    y32 = y.to(tl.float32)
    return (tl.dot(x_hi.to(tl.float32), y32, input_precision="ieee")
            + tl.dot(x_lo.to(tl.float32), y32, input_precision="ieee"))


@device_function
def softmax_step(s, kv, m_i, l_i, acc, PREC: tl.constexpr):
    """One block of keys into a running softmax (flash attention): s [rows, BS] scaled scores
    (-inf where a key is not seen; every row must see a key of its first block), kv [BS, C]
    values (bf16 for PREC "bf16x2", fp16 for "fp16ops"); m_i, l_i [rows] the running max and sum,
    acc [rows, C] -> the three updated."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    p = tl.exp(s - m_new[:, None])
    alpha = tl.exp(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if PREC == "bf16x2":
        p_hi, p_lo = split_bf16(p)
        acc = acc * alpha[:, None] + dot_bf16x2(p_hi, p_lo, kv)
    elif PREC == "fp16ops":  # p in [0, 1] rounded to fp16: tf32's 10-bit mantissa, 2x its rate
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), kv)
    else:
        acc = acc * alpha[:, None] + tl.dot(p, kv, input_precision=PREC)
    return m_new, l_i, acc


@device_function
def _used_splits(length, NSPLIT, BS: tl.constexpr):
    """(tokens a split takes, splits a sequence of `length` tokens uses): whole blocks of BS
    each, so the used splits are the first ceil(length / chunk); (0, 0) for length 0."""
    chunk = tl.cdiv(tl.cdiv(length, NSPLIT), BS) * BS
    return chunk, tl.cdiv(length, tl.maximum(chunk, 1))


@triton.jit(do_not_specialize=["P", "NSPLIT"])  # P: page-table width, per eager step
def _split_kernel(q_ptr, qr_ptr, cache_ptr, table_ptr, lens_ptr, o_ptr, lse_ptr,
                  H, P, page_size, scale, NSPLIT, sqrb, sqrh,
                  C: tl.constexpr, R: tl.constexpr, BH: tl.constexpr, BS: tl.constexpr,
                  PREC: tl.constexpr):
    b = tl.program_id(0)
    hb = tl.program_id(1)
    sp = tl.program_id(2)
    length = tl.load(lens_ptr + b)
    chunk, used = _used_splits(length, NSPLIT, BS)
    if sp >= used:  # past the splits the length fills: never merged, nothing to read or store
        return
    h = hb * BH + tl.arange(0, BH)
    hmask = h < H
    c = tl.arange(0, C)
    rr = tl.arange(0, R)
    q = tl.load(q_ptr + (b * H + h)[:, None] * C + c[None, :], mask=hmask[:, None], other=0.0)
    qr = tl.load(qr_ptr + b * sqrb + h[:, None] * sqrh + rr[None, :], mask=hmask[:, None],
                 other=0.0)
    if PREC == "bf16x2":  # the cache is bf16: its rows stay so, the queries split in two
        q_hi, q_lo = split_bf16(q)
        qr_hi, qr_lo = split_bf16(qr)
    start = sp * chunk
    end = tl.minimum(length, start + chunk)
    m_i = tl.full((BH,), float("-inf"), tl.float32)
    l_i = tl.zeros((BH,), tl.float32)
    acc = tl.zeros((BH, C), tl.float32)
    for t0 in range(start, end, BS):
        t = t0 + tl.arange(0, BS)
        tmask = t < end
        page = tl.load(table_ptr + b.to(tl.int64) * P + t // page_size, mask=tmask, other=0)
        slot = (page.to(tl.int64) * page_size + t % page_size) * (C + R)  # [BS]
        kv = tl.load(cache_ptr + slot[:, None] + c[None, :], mask=tmask[:, None], other=0.0)
        kr = tl.load(cache_ptr + slot[:, None] + C + rr[None, :], mask=tmask[:, None], other=0.0)
        if PREC == "bf16x2":
            s = dot_bf16x2(q_hi, q_lo, tl.trans(kv)) + dot_bf16x2(qr_hi, qr_lo, tl.trans(kr))
        else:
            kv = kv.to(tl.float32)
            s = tl.dot(q, tl.trans(kv), input_precision=PREC)
            s += tl.dot(qr, tl.trans(kr.to(tl.float32)), input_precision=PREC)
        s = tl.where(tmask[None, :], s * scale, float("-inf"))  # [BH, BS]
        m_i, l_i, acc = softmax_step(s, kv, m_i, l_i, acc, PREC)
    row = (b * H + h) * NSPLIT + sp  # [BH]
    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    tl.store(o_ptr + row[:, None].to(tl.int64) * C + c[None, :], out, mask=hmask[:, None])
    lse = m_i + tl.log(tl.where(has, l_i, 1.0))
    tl.store(lse_ptr + row, tl.where(has, lse, float("-inf")), mask=hmask)


@triton.jit(do_not_specialize=["NSPLIT"])
def _merge_kernel(o_ptr, lse_ptr, lens_ptr, out_ptr, H, NSPLIT, C: tl.constexpr,
                  BS: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    _, used = _used_splits(tl.load(lens_ptr + bh // H), NSPLIT, BS)  # as the splits used
    top = float("-inf")
    for sp in range(used):
        top = tl.maximum(top, tl.load(lse_ptr + bh * NSPLIT + sp))
    c = tl.arange(0, C)
    acc = tl.zeros((C,), tl.float32)
    total = 0.0
    if top > float("-inf"):
        for sp in range(used):
            lse = tl.load(lse_ptr + bh * NSPLIT + sp)
            w = tl.exp(lse - top)
            acc += w * tl.load(o_ptr + (bh * NSPLIT + sp) * C + c)
            total += w
    tl.store(out_ptr + bh * C + c, acc / tl.maximum(total, 1e-30))


def decode_tiles(heads: int) -> tuple[int, int, int]:
    """(heads per program, cache rows per block, warps), as swept (docs/kernel-tuning.md).
    Longer blocks make the score and value products large enough for the tensor cores; more
    heads per program read each cache row for more of them (fewer than 16 heads still take a
    16-row product: the tensor cores' least)."""
    if heads >= 64:
        return 32, 64, 8
    return 16, 32, 4


def choose_splits(batch: int, heads: int, max_len: int, num_sms: int = 132,
                  heads_per_program: int | None = None, fill: int = 2,
                  block_tokens: int | None = None) -> int:
    """Splits per sequence: enough programs to fill the GPU `fill` times, none shorter than a
    block (the tiles decode_tiles picks unless given)."""
    bh, bs, _ = decode_tiles(heads)
    blocks = batch * triton.cdiv(heads, heads_per_program or bh)
    want = triton.cdiv(fill * num_sms, blocks)
    return max(1, min(want, triton.cdiv(max_len, block_tokens or bs), 64))


def mla_decode(q_lat: torch.Tensor, q_rope: torch.Tensor, cache: torch.Tensor,
               page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int, scale: float,
               num_splits: int, out: torch.Tensor | None = None,
               block_tokens: int | None = None, precision: str = DECODE_PRECISION,
               heads_per_program: int | None = None, num_warps: int | None = None
               ) -> torch.Tensor:
    """q_lat [B, H, C] f32, q_rope [B, H, R] f32 (any row strides), cache [slots, C + R]
    (bf16/f16/f32), page_table [B, P] int32 (its last dim dense; rows may share one, stride 0),
    seq_lens [B] int32 -> out [B, H, C] f32."""
    b, h, c = q_lat.shape
    r = q_rope.shape[-1]
    if cache.shape[-1] != c + r or c & (c - 1) or r & (r - 1):
        raise ValueError(f"cache rows of {cache.shape[-1]} for C={c}, R={r} (powers of two)")
    # q_rope may be a view of the queries' rope columns (rows strided): only its last dim
    # must be dense
    q_lat, q_rope = q_lat.float().contiguous(), q_rope.float()
    if q_rope.stride(-1) != 1:
        q_rope = q_rope.contiguous()
    o_part = torch.empty(b, h, num_splits, c, dtype=torch.float32, device=q_lat.device)
    lse = torch.empty(b, h, num_splits, dtype=torch.float32, device=q_lat.device)
    tiles = decode_tiles(h)
    bh, bs, warps = heads_per_program or tiles[0], block_tokens or tiles[1], num_warps or tiles[2]
    if precision == "bf16x2" and cache.dtype != torch.bfloat16:
        precision = "tf32"  # its rows are exact in bf16 only when they are bf16
    _split_kernel[(b, triton.cdiv(h, bh), num_splits)](
        q_lat, q_rope, cache, page_table, seq_lens, o_part, lse, h, page_table.stride(0),
        page_size, scale, num_splits, q_rope.stride(0), q_rope.stride(1), C=c, R=r, BH=bh,
        BS=bs, PREC=precision, num_warps=warps)
    out = out if out is not None else torch.empty(b, h, c, dtype=torch.float32,
                                                  device=q_lat.device)
    _merge_kernel[(b * h,)](o_part, lse, seq_lens, out, h, num_splits, C=c, BS=bs, num_warps=4)
    return out


def sequence_slots(page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int):
    """(i, the slots [n] of sequence i's n = seq_lens[i] tokens) for each non-empty sequence:
    the references' walk through the page table."""
    for i in range(page_table.shape[0]):
        n = int(seq_lens[i])
        if n:
            t = torch.arange(n, device=page_table.device)
            yield i, page_table[i, t // page_size].long() * page_size + t % page_size


def mla_decode_ref(q_lat: torch.Tensor, q_rope: torch.Tensor, cache: torch.Tensor,
                   page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int,
                   scale: float) -> torch.Tensor:
    """Float64 reference, one sequence at a time."""
    b, h, c = q_lat.shape
    out = torch.zeros(b, h, c, dtype=torch.float64, device=q_lat.device)
    for i, slots in sequence_slots(page_table, seq_lens, page_size):
        kv = cache[slots].double()  # [n, C + R]
        s = (q_lat[i].double() @ kv[:, :c].T + q_rope[i].double() @ kv[:, c:].T) * scale
        out[i] = torch.softmax(s, dim=-1) @ kv[:, :c]
    return out.float()

