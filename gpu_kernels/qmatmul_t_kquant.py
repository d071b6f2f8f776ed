"""The transposed product on Q4_K and Q6_K rows at decode: MLA's legacy kv_b absorption of the
queries.

    qmatmul_t_kquant(x, w, in_rows, row0, gstride, y)
        y[m, g, k] = sum_n x[m, g, n] * W[row0 + g * gstride + n, k]     (qmatmul_t's contract)

qmatmul_t's general body dequantizes a [rows, columns] tile element by element, each weight
gathering its code, its sub-block's scale and min and its super-block's d and dmin: at one
token that costs far more instructions than the 4.5 bits a weight it reads. Here a program
takes CB chunks of columns of one group and walks the group's rows BN at a time:
- Q4_K: a row's chunk is 32 bytes of codes, read as they lie: byte b holds column 64j + b (low
  nibble) and 64j + 32 + b (high nibble). Its scales apply once per row and 32 columns: with
  w = (d * sc) * c - dmin * mn,
      sum_n x[n] w[n, k] = sum_n (x[n] * d[n] * sc[n]) * c[n, k] - sum_n x[n] * dmin[n] * mn[n]
  so the codes meet one fp32 factor per row and sub-block, the min terms one sum per sub-block.
- Q6_K: a chunk is half a super-block, 128 columns: 64 bytes of low bits and 32 of high bits.
  Run t (0-3) of 32 columns takes nibble t // 2 of low byte (t % 2) * 32 + b and bits 2t of
  high byte b; w = (d * sc) * (c - 32), sc one int8 per 16 columns.
Products are kept per row until the end of the walk (no reduction across threads inside it).
fp32 throughout; the sums run in another order than qmatmul_t_ref's, within fp32 rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu_kernels import qtypes as qt
from gpu_kernels.device_function import device_function
from gpu_kernels.qdot import CHUNK
from gpu_kernels.qformat import GpuQuant

TYPES = (qt.Q4_K, qt.Q6_K)


@triton.jit(do_not_specialize=["M"])
def _q4k_t_kernel(x_ptr, y_ptr, qs_ptr, sc_ptr, mn_ptr, d_ptr, dm_ptr, M, N, row0, gstride,
                  KB, KS, KD, sxm, sxg, sym, syg, BM: tl.constexpr, BN: tl.constexpr,
                  CB: tl.constexpr):
    """Program (chunk block, token block, group): y's BM tokens x CB * 64 columns. KB, KS,
    KD: bytes of codes, sub-blocks and super-blocks per row of W."""
    g = tl.program_id(2)
    m = tl.program_id(1) * BM + tl.arange(0, BM)  # [BM]
    mmask = m < M
    j = tl.program_id(0) * CB + tl.arange(0, CB)  # [CB] chunk
    b = tl.arange(0, 32)  # byte of a chunk's codes
    x_row = x_ptr + g.to(tl.int64) * sxg + m.to(tl.int64)[:, None] * sxm  # [BM, 1]
    acc_lo = tl.zeros((BM, BN, CB, 32), dtype=tl.float32)  # columns 64j + b
    acc_hi = tl.zeros((BM, BN, CB, 32), dtype=tl.float32)  # columns 64j + 32 + b
    min_lo = tl.zeros((BM, BN, CB), dtype=tl.float32)  # the low sub-block's min terms
    min_hi = tl.zeros((BM, BN, CB), dtype=tl.float32)
    for n0 in range(0, N, BN):
        n = n0 + tl.arange(0, BN)  # [BN]
        nmask = n < N
        r = (row0 + g * gstride + tl.where(nmask, n, 0)).to(tl.int64)[:, None]  # [BN, 1]
        x = tl.load(x_row + n[None, :], mask=mmask[:, None] & nmask[None, :], other=0.0)
        codes = tl.load(qs_ptr + (r * KB + j[None, :] * 32)[:, :, None] + b[None, None, :])
        codes = codes.to(tl.int32)  # [BN, CB, 32]
        lo = r * KS + 2 * j[None, :]  # [BN, CB] the low nibbles' sub-block; +1 the high's
        sup = r * KD + j[None, :] // 4  # [BN, CB] super-block
        d = tl.load(d_ptr + sup).to(tl.float32)
        dmin = tl.load(dm_ptr + sup).to(tl.float32)
        xs = x[:, :, None]  # [BM, BN, 1]
        f_lo = xs * (d * tl.load(sc_ptr + lo).to(tl.float32))[None]  # [BM, BN, CB]
        f_hi = xs * (d * tl.load(sc_ptr + lo + 1).to(tl.float32))[None]
        acc_lo += f_lo[:, :, :, None] * (codes & 15).to(tl.float32)[None]
        acc_hi += f_hi[:, :, :, None] * (codes >> 4).to(tl.float32)[None]
        min_lo += xs * (dmin * tl.load(mn_ptr + lo).to(tl.float32))[None]
        min_hi += xs * (dmin * tl.load(mn_ptr + lo + 1).to(tl.float32))[None]
    col = (j[:, None] * 64 + b[None, :])[None]  # [1, CB, 32]: a chunk is 64 columns
    y = y_ptr + g.to(tl.int64) * syg + m.to(tl.int64)[:, None, None] * sym + col
    keep = mmask[:, None, None]
    tl.store(y, tl.sum(acc_lo, axis=1) - tl.sum(min_lo, axis=1)[:, :, None], mask=keep)
    tl.store(y + 32, tl.sum(acc_hi, axis=1) - tl.sum(min_hi, axis=1)[:, :, None], mask=keep)


@triton.jit(do_not_specialize=["M"])
def _q6k_t_kernel(x_ptr, y_ptr, ql_ptr, qh_ptr, sc_ptr, d_ptr, M, N, row0, gstride, KL, KH,
                  KS, KD, sxm, sxg, sym, syg, BM: tl.constexpr, BN: tl.constexpr,
                  CB: tl.constexpr):
    """As _q4k_t_kernel, a chunk 128 columns (half a super-block). KL, KH, KS, KD: bytes of
    low bits, of high bits, 16-column scales and super-blocks per row of W."""
    g = tl.program_id(2)
    m = tl.program_id(1) * BM + tl.arange(0, BM)  # [BM]
    mmask = m < M
    j = tl.program_id(0) * CB + tl.arange(0, CB)  # [CB] chunk
    lane = tl.arange(0, 32)  # column of a run
    b = lane[None, None, :]  # [1, 1, 32]
    x_row = x_ptr + g.to(tl.int64) * sxg + m.to(tl.int64)[:, None] * sxm  # [BM, 1]
    acc0 = tl.zeros((BM, BN, CB, 32), dtype=tl.float32)  # run t: columns 128j + 32t + b
    acc1 = tl.zeros((BM, BN, CB, 32), dtype=tl.float32)
    acc2 = tl.zeros((BM, BN, CB, 32), dtype=tl.float32)
    acc3 = tl.zeros((BM, BN, CB, 32), dtype=tl.float32)
    upper = b >= 16  # a run's second 16 columns take the next scale
    for n0 in range(0, N, BN):
        n = n0 + tl.arange(0, BN)  # [BN]
        nmask = n < N
        r = (row0 + g * gstride + tl.where(nmask, n, 0)).to(tl.int64)[:, None]  # [BN, 1]
        x = tl.load(x_row + n[None, :], mask=mmask[:, None] & nmask[None, :], other=0.0)
        low = ql_ptr + (r * KL + j[None, :] * 64)[:, :, None] + b  # [BN, CB, 32]
        l0 = tl.load(low).to(tl.int32)  # runs 0 and 2
        l1 = tl.load(low + 32).to(tl.int32)  # runs 1 and 3
        h = tl.load(qh_ptr + (r * KH + j[None, :] * 32)[:, :, None] + b).to(tl.int32)
        s = sc_ptr + r * KS + j[None, :] * 8  # [BN, CB] the chunk's first scale
        f = x[:, :, None] * tl.load(d_ptr + r * KD + j[None, :] // 2).to(tl.float32)[None]
        f = f[:, :, :, None]  # [BM, BN, CB, 1]: x * d
        acc0 += f * _run_scale(s, 0, upper) * (((l0 & 15) | ((h & 3) << 4)) - 32)
        acc1 += f * _run_scale(s, 1, upper) * (((l1 & 15) | (((h >> 2) & 3) << 4)) - 32)
        acc2 += f * _run_scale(s, 2, upper) * (((l0 >> 4) | (((h >> 4) & 3) << 4)) - 32)
        acc3 += f * _run_scale(s, 3, upper) * (((l1 >> 4) | (((h >> 6) & 3) << 4)) - 32)
    col = (j[:, None] * 128 + lane[None, :])[None]  # [1, CB, 32]
    y = y_ptr + g.to(tl.int64) * syg + m.to(tl.int64)[:, None, None] * sym + col
    keep = mmask[:, None, None]
    tl.store(y, tl.sum(acc0, axis=1), mask=keep)
    tl.store(y + 32, tl.sum(acc1, axis=1), mask=keep)
    tl.store(y + 64, tl.sum(acc2, axis=1), mask=keep)
    tl.store(y + 96, tl.sum(acc3, axis=1), mask=keep)


@device_function
def _run_scale(s, t: tl.constexpr, upper):
    """Run t's scales [BN, CB, 32] as fp32: its first 16 columns' and its second 16's."""
    lo = tl.load(s + 2 * t).to(tl.float32)[:, :, None]
    hi = tl.load(s + 2 * t + 1).to(tl.float32)[:, :, None]
    return tl.where(upper, hi, lo)


# (rows per step, chunks per program, warps) by type and token block; V3's 128 heads of 128
# rows over 512 columns: 8 Q4_K chunks or 4 Q6_K chunks a head
TILES = {(qt.Q4_K, 1): (64, 1, 4), (qt.Q4_K, 2): (16, 1, 4), (qt.Q4_K, 4): (8, 1, 4),
         (qt.Q4_K, 8): (4, 1, 4), (qt.Q6_K, 1): (16, 1, 4), (qt.Q6_K, 2): (8, 1, 4),
         (qt.Q6_K, 4): (4, 1, 4), (qt.Q6_K, 8): (2, 1, 4)}


def takes(w: GpuQuant, tokens: int) -> bool:
    """Whether qmatmul_t_kquant serves a product of `tokens` rows of x with w."""
    return w.qtype in TYPES and w.cols % 256 == 0 and tokens <= 8


def qmatmul_t_kquant(x3: torch.Tensor, w: GpuQuant, in_rows: int, row0: int, gstride: int,
                     y3: torch.Tensor, tiles: tuple[int, int, int] | None = None) -> None:
    """x3 [M, G, in_rows] fp32 (M <= 8, last dim dense), W Q4_K or Q6_K with columns a
    multiple of 256 -> y3 [M, G, K] fp32 (last dim dense), written."""
    m, g, _ = x3.shape
    k = w.cols
    if not takes(w, m):
        raise ValueError(f"{qt.name(w.qtype)} rows of {k} columns at {m} tokens: need Q4_K or "
                         f"Q6_K, a multiple of 256 columns, at most 8 tokens")
    bm = max(1, triton.next_power_of_2(m))
    bn, cb, warps = tiles or TILES[w.qtype, bm]
    chunks = k // CHUNK[w.qtype]
    if chunks % cb:
        raise ValueError(f"{cb} chunks a program do not divide {chunks}")
    grid = (chunks // cb, triton.cdiv(m, bm), g)
    strides = (x3.stride(0), x3.stride(1), y3.stride(0), y3.stride(1))
    if w.qtype == qt.Q4_K:
        qs, sc, mn, d, dmin = w.planes
        _q4k_t_kernel[grid](x3, y3, qs, sc, mn, d, dmin, m, in_rows, row0, gstride, k // 2,
                            k // 32, k // 256, *strides, BM=bm, BN=bn, CB=cb, num_warps=warps)
    else:
        ql, qh, sc, d = w.planes
        _q6k_t_kernel[grid](x3, y3, ql, qh, sc, d, m, in_rows, row0, gstride, k // 2, k // 4,
                            k // 16, k // 256, *strides, BM=bm, BN=bn, CB=cb, num_warps=warps)
