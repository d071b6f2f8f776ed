"""The load-time repack (packed.py's layouts) as parallel numba kernels: every core packs.

packed.py's numpy packers define the layouts (and stay as the reference: tests compare bytes);
these write the same bytes block by block, one (expert, group of 8 rows) per task, so a V3 start
packs at the memory's speed instead of one core's numpy speed. Per task and block the 8 rows'
GGUF blocks are copied into a small scratch `a` [8, type_size] (zeros past the last row), then
each packed field is written from it: see packed.py for the field order.

blocks: [E, R, row_bytes] uint8  out: [E, G, row_group_bytes] uint8 (G = ceil(rows / 8))
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit, prange

from cpu_kernels.exact.iquant1_dots import iq1_m_d
from cpu_kernels.fast.packed_iquants import SIGN_BYTES
from cpu_kernels.formats import qtypes as qt
from cpu_kernels.formats.scalars import F16_TABLE, u32_at

u8 = np.uint8
i64 = np.int64


@njit(inline="always", cache=True)
def _f16_as_f32(a, r, o, out32, at):
    out32[at] = F16_TABLE[i64(a[r, o]) | (i64(a[r, o + 1]) << 8)]


@njit(inline="always", cache=True)
def _q4_k(a, out, o, out32, o32):
    for r in range(8):
        for c in range(4):
            for k4 in range(8):
                for j in range(4):
                    out[o + 256 * c + 32 * k4 + 4 * r + j] = a[r, 16 + 32 * c + 4 * k4 + j]
        for sub in range(8):
            if sub < 4:
                sc = i64(a[r, 4 + sub]) & 63
                mn = i64(a[r, 8 + sub]) & 63
            else:
                sc = (i64(a[r, 8 + sub]) & 15) | ((i64(a[r, sub]) >> 6) << 4)
                mn = (i64(a[r, 8 + sub]) >> 4) | ((i64(a[r, sub + 4]) >> 6) << 4)
            out[o + 1024 + 8 * sub + r] = sc
            out[o + 1088 + 8 * sub + r] = mn
        _f16_as_f32(a, r, 0, out32, o32 + 288 + r)
        _f16_as_f32(a, r, 2, out32, o32 + 296 + r)


@njit(inline="always", cache=True)
def _q6_k_codes(a, r, codes):
    """Q6_K's 256 unsigned 6-bit codes of row r into codes [256] (packed._q6_k_codes): one pass
    over its low and high bits, rather than two loads per element where they are packed."""
    for n in range(2):
        for q in range(4):
            base = 64 * n + 32 * (q & 1)
            shift = 4 * (q >> 1)
            for lane in range(32):
                low = (i64(a[r, base + lane]) >> shift) & 15
                high = (i64(a[r, 128 + 32 * n + lane]) >> (2 * q)) & 3
                codes[128 * n + 32 * q + lane] = low | (high << 4)


@njit(inline="always", cache=True)
def _q6_k(a, out, o, out32, o32, codes):
    for r in range(8):
        _q6_k_codes(a, r, codes)
        for p in range(16):
            for j in range(4):
                c0 = codes[16 * p + j]
                c1 = codes[16 * p + 4 + j]
                c2 = codes[16 * p + 8 + j]
                c3 = codes[16 * p + 12 + j]
                b = o + 96 * p + 4 * r + j
                out[b] = (c0 & 15) | ((c1 & 15) << 4)
                out[b + 32] = (c2 & 15) | ((c3 & 15) << 4)
                out[b + 64] = (c0 >> 4) | ((c1 >> 4) << 2) | ((c2 >> 4) << 4) | ((c3 >> 4) << 6)
        for sub in range(16):
            out[o + 1536 + 8 * sub + r] = a[r, 192 + sub]
        _f16_as_f32(a, r, 208, out32, o32 + 416 + r)


@njit(inline="always", cache=True)
def _q8_0(a, out, o, out32, o32):
    for r in range(8):
        for s in range(8):
            for j in range(4):
                out[o + 32 * s + 4 * r + j] = a[r, 2 + 4 * s + j] ^ u8(0x80)
        _f16_as_f32(a, r, 0, out32, o32 + 64 + r)


@njit(inline="always", cache=True)
def _q5_0_code(a, r, k):
    qh = i64(a[r, 2]) | (i64(a[r, 3]) << 8) | (i64(a[r, 4]) << 16) | (i64(a[r, 5]) << 24)
    low = (i64(a[r, 6 + k]) & 15) if k < 16 else (i64(a[r, 6 + k - 16]) >> 4)
    return low | (((qh >> k) & 1) << 4)


@njit(inline="always", cache=True)
def _q5_0(a, out, o, out32, o32):
    for r in range(8):
        for j in range(4):
            hb = 0
            for s in range(8):
                c = _q5_0_code(a, r, 4 * s + j)
                hb |= ((c >> 4) & 1) << s
                m, odd = s >> 1, s & 1
                b = o + 32 * m + 4 * r + j
                if odd:
                    out[b] = u8(i64(out[b]) | ((c & 15) << 4))
                else:
                    out[b] = u8(c & 15)
            out[o + 128 + 4 * r + j] = hb
        _f16_as_f32(a, r, 0, out32, o32 + 40 + r)


@njit(inline="always", cache=True)
def _low_code(a, r, qs, e):
    """Q2_K/Q3_K 2-bit code of element e = 128 n + 32 j + l: bits 2j of qs[32 n + l]."""
    return (i64(a[r, qs + 32 * (e >> 7) + (e & 31)]) >> (2 * ((e >> 5) & 3))) & 3


@njit(inline="always", cache=True)
def _two_bit_steps(a, r, qs, out, o):
    for p in range(16):
        for j in range(4):
            v = 0
            for i in range(4):
                v |= _low_code(a, r, qs, 16 * p + 4 * i + j) << (2 * i)
            out[o + 32 * p + 4 * r + j] = v


@njit(inline="always", cache=True)
def _q2_k(a, out, o, out32, o32):
    for r in range(8):
        _two_bit_steps(a, r, 16, out, o)
        for sub in range(16):
            out[o + 512 + 8 * sub + r] = a[r, sub]
        _f16_as_f32(a, r, 80, out32, o32 + 160 + r)
        _f16_as_f32(a, r, 82, out32, o32 + 168 + r)


@njit(inline="always", cache=True)
def _q3_k(a, out, o, out32, o32):
    for r in range(8):
        _two_bit_steps(a, r, 32, out, o)
        for pair in range(8):
            for j in range(4):
                v = 0
                for odd in range(2):
                    for i in range(4):
                        e = 16 * (2 * pair + odd) + 4 * i + j
                        v |= ((i64(a[r, e & 31]) >> (e >> 5)) & 1) << (4 * odd + i)
                out[o + 512 + 32 * pair + 4 * r + j] = v
        for k in range(16):
            low = (i64(a[r, 96 + k]) & 15) if k < 8 else (i64(a[r, 96 + k - 8]) >> 4)
            high = (i64(a[r, 104 + (k & 3)]) >> (2 * (k >> 2))) & 3
            out[o + 768 + 8 * k + r] = u8(((low | (high << 4)) - 32) & 0xFF)
        _f16_as_f32(a, r, 108, out32, o32 + 224 + r)


@njit(inline="always", cache=True)
def _signs_scales(a, r, w_at, s, out, o_signs, o_scales):
    """IQ2_XXS/IQ3_XXS: sub-block s's u32 (4 sign indices, scale) at a[r, w_at] -> sign bytes
    [run][row] and a scale nibble [pair][row]."""
    w = i64(u32_at(a[r], w_at))
    for j in range(4):
        out[o_signs + 8 * (4 * s + j) + r] = SIGN_BYTES[(w >> (7 * j)) & 127]
    b = o_scales + 8 * (s >> 1) + r
    if s & 1:
        out[b] = u8(i64(out[b]) | ((w >> 28) << 4))
    else:
        out[b] = u8(w >> 28)


@njit(inline="always", cache=True)
def _iq2_xxs(a, out, o, out32, o32):
    for r in range(8):
        for s in range(8):
            for j in range(4):
                out[o + 8 * (4 * s + j) + r] = a[r, 2 + 8 * s + j]
            _signs_scales(a, r, 6 + 8 * s, s, out, o + 256, o + 512)
        _f16_as_f32(a, r, 0, out32, o32 + 136 + r)


@njit(inline="always", cache=True)
def _rows_last(a, r, src, n, width, out, o):
    """Row r's n fields of `width` bytes at a[r, src:] into [n][8 rows][width] at out[o:]
    (packed_iquants._rows_last)."""
    for k in range(n):
        for b in range(width):
            out[o + 8 * width * k + width * r + b] = a[r, src + width * k + b]


@njit(inline="always", cache=True)
def _iq2_xs(a, out, o, out32, o32):
    for r in range(8):
        _rows_last(a, r, 2, 32, 2, out, o)
        _rows_last(a, r, 66, 8, 1, out, o + 512)
        _f16_as_f32(a, r, 0, out32, o32 + 144 + r)


@njit(inline="always", cache=True)
def _iq2_s(a, out, o, out32, o32):
    for r in range(8):
        _rows_last(a, r, 2, 32, 1, out, o)
        _rows_last(a, r, 34, 32, 1, out, o + 256)
        _rows_last(a, r, 66, 8, 1, out, o + 512)
        _rows_last(a, r, 74, 8, 1, out, o + 576)
        _f16_as_f32(a, r, 0, out32, o32 + 160 + r)


@njit(inline="always", cache=True)
def _iq3_xxs(a, out, o, out32, o32):
    for r in range(8):
        _rows_last(a, r, 2, 32, 2, out, o)
        for s in range(8):
            _signs_scales(a, r, 66 + 4 * s, s, out, o + 512, o + 768)
        _f16_as_f32(a, r, 0, out32, o32 + 200 + r)


@njit(inline="always", cache=True)
def _iq3_s(a, out, o, out32, o32):
    for r in range(8):
        _rows_last(a, r, 2, 32, 2, out, o)
        _rows_last(a, r, 66, 8, 1, out, o + 512)
        _rows_last(a, r, 74, 32, 1, out, o + 576)
        _rows_last(a, r, 106, 4, 1, out, o + 832)
        _f16_as_f32(a, r, 0, out32, o32 + 216 + r)


@njit(inline="always", cache=True)
def _iq1_s(a, out, o, out32, o32):
    for r in range(8):
        _rows_last(a, r, 2, 32, 1, out, o)
        _rows_last(a, r, 34, 8, 2, out, o + 256)
        _f16_as_f32(a, r, 0, out32, o32 + 96 + r)


@njit(inline="always", cache=True)
def _iq1_m_scale(a, r, n):
    """IQ1_M's 3-bit scale of 16 columns n: bits 3 (n % 4) of the u16 at 48 + 2 (n // 4)."""
    word = i64(a[r, 48 + 2 * (n >> 2)]) | (i64(a[r, 49 + 2 * (n >> 2)]) << 8)
    return (word >> (3 * (n & 3))) & 7


@njit(inline="always", cache=True)
def _iq1_m(a, out, o, out32, o32):
    for r in range(8):
        _rows_last(a, r, 0, 32, 1, out, o)
        _rows_last(a, r, 32, 16, 1, out, o + 256)
        for s in range(8):
            out[o + 384 + 8 * s + r] = u8(_iq1_m_scale(a, r, 2 * s) | (_iq1_m_scale(a, r, 2 * s + 1)
                                                                      << 4))
        out32[o32 + 112 + r] = iq1_m_d(a[r], 0)


@njit(inline="always", cache=True)
def _iq4_xs(a, out, o, out32, o32):
    for r in range(8):
        high = i64(a[r, 2]) | (i64(a[r, 3]) << 8)
        for s in range(8):
            for k in range(16):
                out[o + 128 * s + 32 * (k >> 2) + 4 * r + (k & 3)] = a[r, 8 + 16 * s + k]
            low = (i64(a[r, 4 + (s >> 1)]) >> (4 * (s & 1))) & 15
            out[o + 1024 + 8 * s + r] = u8(((low | (((high >> (2 * s)) & 3) << 4)) - 32) & 0xFF)
        _f16_as_f32(a, r, 0, out32, o32 + 272 + r)


@njit(inline="always", cache=True)
def _iq4_nl(a, out, o, out32, o32):
    for r in range(8):
        for k in range(16):
            out[o + 32 * (k >> 2) + 4 * r + (k & 3)] = a[r, 2 + k]
        _f16_as_f32(a, r, 0, out32, o32 + 32 + r)


@njit(inline="always", cache=True)
def _mxfp4(a, out, o):
    for r in range(8):
        for k in range(16):
            out[o + 32 * (k >> 2) + 4 * r + (k & 3)] = a[r, 1 + k]
        out[o + 128 + r] = a[r, 0] - 1 if a[r, 0] > 0 else 0


Q4_K, Q6_K, Q8_0, Q5_0, Q2_K, Q3_K = qt.Q4_K, qt.Q6_K, qt.Q8_0, qt.Q5_0, qt.Q2_K, qt.Q3_K
IQ2_XXS, IQ1_S, IQ1_M, IQ2_XS, IQ2_S = qt.IQ2_XXS, qt.IQ1_S, qt.IQ1_M, qt.IQ2_XS, qt.IQ2_S
IQ3_XXS, IQ3_S, IQ4_XS, IQ4_NL = qt.IQ3_XXS, qt.IQ3_S, qt.IQ4_XS, qt.IQ4_NL
MXFP4 = qt.MXFP4


@functools.cache
def _kernel(qtype: int):
    """The parallel packer of one type, made on its first use with only that type's body
    compiled in (a kernel naming every body compiles them all). The closure variable is a plain
    int: numba's on-disk cache keys closures by their variables' pickled bytes, stable across
    processes for an int (not for a function object)."""
    def pack(blocks, r_lo, num_rows, b_lo, type_size, packed_bytes, out):
        num_experts, groups, group_bytes = out.shape
        num_blocks = group_bytes // packed_bytes
        for task in prange(num_experts * groups):
            e, g = task // groups, task % groups
            a = np.zeros((8, type_size), np.uint8)
            codes = np.empty(256, np.int64)  # Q6_K: a row's codes
            dst = out[e, g]
            dst32 = dst.view(np.float32)
            for b in range(num_blocks):
                for r in range(8):
                    row = 8 * g + r
                    if row < num_rows:
                        a[r] = blocks[e, r_lo + row,
                                      b_lo + b * type_size:b_lo + (b + 1) * type_size]
                    else:
                        a[r] = 0
                o = b * packed_bytes
                o32 = o // 4
                # qtype is a frozen closure variable: numba prunes the other branches
                # before typing them (a branch in an inlined callee is typed, then pruned)
                if qtype == Q4_K:
                    _q4_k(a, dst, o, dst32, o32)
                elif qtype == Q6_K:
                    _q6_k(a, dst, o, dst32, o32, codes)
                elif qtype == Q8_0:
                    _q8_0(a, dst, o, dst32, o32)
                elif qtype == Q5_0:
                    _q5_0(a, dst, o, dst32, o32)
                elif qtype == Q2_K:
                    _q2_k(a, dst, o, dst32, o32)
                elif qtype == Q3_K:
                    _q3_k(a, dst, o, dst32, o32)
                elif qtype == IQ2_XXS:
                    _iq2_xxs(a, dst, o, dst32, o32)
                elif qtype == IQ1_S:
                    _iq1_s(a, dst, o, dst32, o32)
                elif qtype == IQ1_M:
                    _iq1_m(a, dst, o, dst32, o32)
                elif qtype == IQ2_XS:
                    _iq2_xs(a, dst, o, dst32, o32)
                elif qtype == IQ2_S:
                    _iq2_s(a, dst, o, dst32, o32)
                elif qtype == IQ3_XXS:
                    _iq3_xxs(a, dst, o, dst32, o32)
                elif qtype == IQ3_S:
                    _iq3_s(a, dst, o, dst32, o32)
                elif qtype == IQ4_XS:
                    _iq4_xs(a, dst, o, dst32, o32)
                elif qtype == IQ4_NL:
                    _iq4_nl(a, dst, o, dst32, o32)
                elif qtype == MXFP4:
                    _mxfp4(a, dst, o)
    # a name of its own: see packed_dot._specialize (the packers differ only in `qtype`)
    pack.__qualname__ = f"pack_{qtype}"
    return njit(parallel=True, cache=True)(pack)


def pack_blocks(qtype: int, blocks: np.ndarray, r_lo: int, num_rows: int, b_lo: int,
                type_size: int, packed_bytes: int, out: np.ndarray) -> None:
    """out[e, g] = the packed blocks of rows r_lo + 8 g .. + 8 of blocks[e], bytes from b_lo."""
    _kernel(qtype)(blocks, r_lo, num_rows, b_lo, type_size, packed_bytes, out)
