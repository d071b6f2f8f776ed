"""The transposed product on Q4_K rows at decode: MLA's legacy kv_b absorption of the queries.

    qmatmul_t_q4k(x, w, in_rows, row0, gstride)
        y[m, g, k] = sum_n x[m, g, n] * W[row0 + g * gstride + n, k]     (qmatmul_t's contract)

qmatmul_t's general body dequantizes a [rows, columns] tile element by element, each weight
gathering its code, its sub-block's scale and min and its super-block's d and dmin: at one
token that costs far more instructions than the 4.5 bits a weight it reads. Here a program
takes CB chunks of 64 columns of one group and walks the group's rows BN at a time:
- a row's chunk is 32 bytes of codes, read as they lie: byte b holds column 64j + b (low
  nibble) and 64j + 32 + b (high nibble);
- its scales apply once per row and 32 columns: with w = (d * sc) * c - dmin * mn,
      sum_n x[n] w[n, k] = sum_n (x[n] * d[n] * sc[n]) * c[n, k] - sum_n x[n] * dmin[n] * mn[n]
  so the weights' codes meet one fp32 factor per row and sub-block, and the min terms one sum
  per sub-block.
Products are kept per row until the end of the walk (no reduction across threads inside it).
fp32 throughout; the sums run in another order than qmatmul_t_ref's, within fp32 rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu_kernels.qformat import GpuQuant

CHUNK = 64  # columns of a chunk: 32 bytes of codes, two sub-blocks


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


# (rows per step, chunks per program, warps) by token block; V3's 128 heads of 128 rows over
# 512 columns: 8 chunks a head
TILES = {1: (32, 1, 4), 2: (16, 1, 4), 4: (8, 1, 4), 8: (4, 1, 4)}


def qmatmul_t_q4k(x3: torch.Tensor, w: GpuQuant, in_rows: int, row0: int, gstride: int,
                  y3: torch.Tensor, tiles: tuple[int, int, int] | None = None) -> None:
    """x3 [M, G, in_rows] fp32 (M <= 8, last dim dense), W Q4_K with columns a multiple of
    256 -> y3 [M, G, K] fp32 (last dim dense), written."""
    m, g, _ = x3.shape
    k = w.cols
    if k % 256:
        raise ValueError(f"Q4_K rows of {k} columns: need a multiple of 256")
    bm = max(1, triton.next_power_of_2(m))
    bn, cb, warps = tiles or TILES[bm]
    if (k // CHUNK) % cb:
        raise ValueError(f"{cb} chunks a program do not divide {k // CHUNK}")
    qs, sc, mn, d, dmin = w.planes
    grid = (triton.cdiv(k // CHUNK, cb), triton.cdiv(m, bm), g)
    _q4k_t_kernel[grid](x3, y3, qs, sc, mn, d, dmin, m, in_rows, row0, gstride, k // 2,
                        k // 32, k // 256, x3.stride(0), x3.stride(1), y3.stride(0),
                        y3.stride(1), BM=bm, BN=bn, CB=cb, num_warps=warps)
