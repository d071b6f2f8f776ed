"""i-quant rows decoded once into int8 weights and per-16 scales, then dotted with activations.

The per-element grid lookups of the generic dots (iquant_*_dots.py, the reference) cost far more
than the memory they read: an IQ1_S weight is 0.2 bytes. Here a run of 8 weights is decoded with
one 64-bit load from the grid table (8 int8 values), one from a sign-mask table and a SWAR
negate, into a scratch row `w8` that the MoE kernel reuses for every token of the expert; the
dots over w8 are plain loops the compiler vectorizes.

Every type becomes w = sc16[e // 16] * w8[e] exactly (the products equal gguf-py's fp32 ones):
    grid types      w8 = grid * sign (|w8| <= 62), sc16 = the block's sub-scale
    IQ1_S / IQ1_M   w8 = 8 * grid +- 1 (grid + delta times 8: -9..9), sc16 = dl / 8
    IQ4_NL / IQ4_XS w8 = level (-127..113), sc16 = d or d * (scale - 32)
    MXFP4           w8 = level (-12..12, E2M1 doubled), sc16 = 2^(e - 128)
Negation: grid bytes are never 0, so (g ^ m) + (m & 0x01..01) negates the bytes where the mask m
is 0xFF without a carry crossing bytes.

row: [row_bytes] uint8  w64: [C/8] uint64 (scratch; its bytes are w8 [C] int8)  sc16: [C/16] f32
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels.exact.iquant1_dots import iq1_m_d
from cpu_kernels.formats import iquant_tables as tables
from cpu_kernels.formats import qtypes as qt
from cpu_kernels.formats.scalars import e8m0_at, f16_at, u32_at
from cpu_kernels.simd.simd import HAS_AVX2, f32x8_zero
from cpu_kernels.simd.simd_i8 import dot16_f32, fma_halves, hsum8, levels_intrinsic, sdot32

f32 = np.float32
i32 = np.int32
i64 = np.int64
u64 = np.uint64
ONES = u64(0x0101010101010101)


def _rows64(grid: np.ndarray) -> np.ndarray:
    """int8 [N, 8] -> uint64 [N], byte j = value j."""
    return np.ascontiguousarray(grid.astype(np.int8)).view(np.uint64).reshape(-1)


def _rows32(grid: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(grid.astype(np.int8)).view(np.uint32).reshape(-1).astype(np.uint64)


def _masks(byte_values: np.ndarray) -> np.ndarray:
    """Sign bytes [N] -> uint64 [N] with byte j 0xFF where bit j is set."""
    bits = (byte_values.astype(np.uint8)[:, None] >> np.arange(8, dtype=np.uint8)) & 1
    return (bits * np.uint8(0xFF)).astype(np.uint8).view(np.uint64).reshape(-1)


G_IQ2_XXS = _rows64(tables.GRID_IQ2_XXS)
G_IQ2_XS = _rows64(tables.GRID_IQ2_XS)
G_IQ2_S = _rows64(tables.GRID_IQ2_S)
G_IQ3_XXS = _rows32(tables.GRID_IQ3_XXS)
G_IQ3_S = _rows32(tables.GRID_IQ3_S)
G_IQ1_PLUS = _rows64(8 * tables.GRID_IQ1_S.astype(np.int16) + 1)
G_IQ1_MINUS = _rows64(8 * tables.GRID_IQ1_S.astype(np.int16) - 1)
MASK7 = _masks(np.where(tables.SIGNS < 0, 1, 0).astype(np.uint8).dot(1 << np.arange(8)))
MASK8 = _masks(np.arange(256))
# a byte of two IQ4 nibbles -> its two levels as int8 (low nibble first)
LEVEL_PAIRS = np.stack([tables.IQ4_LEVELS[np.arange(256) & 15],
                        tables.IQ4_LEVELS[np.arange(256) >> 4]], -1).astype(np.int8)
MX_LEVEL_PAIRS = np.stack([tables.MXFP4_LEVELS[np.arange(256) & 15],
                           tables.MXFP4_LEVELS[np.arange(256) >> 4]], -1).astype(np.int8)
_levels32 = levels_intrinsic([int(v) for v in tables.IQ4_LEVELS])
_mx_levels32 = levels_intrinsic([int(v) for v in tables.MXFP4_LEVELS])


@njit(inline="always", cache=True)
def _signed(g: np.uint64, m: np.uint64) -> np.uint64:
    return (g ^ m) + (m & ONES)


@njit(cache=True)
def _iq2_xxs(row, w64, sc16):
    for b in range(row.shape[0] // 66):
        o = b * 66
        d = f16_at(row, o)
        for s in range(8):
            w = u32_at(row, o + 6 + 8 * s)
            for k in range(4):
                w64[32 * b + 4 * s + k] = _signed(G_IQ2_XXS[row[o + 2 + 8 * s + k]],
                                                  MASK7[(w >> (7 * k)) & 127])
            db = d * (f32(0.5) + f32(w >> 28)) * f32(0.25)
            sc16[16 * b + 2 * s] = db
            sc16[16 * b + 2 * s + 1] = db


@njit(cache=True)
def _iq2_xs(row, w64, sc16):
    for b in range(row.shape[0] // 74):
        o = b * 74
        d = f16_at(row, o)
        for k in range(32):
            q = i64(row[o + 2 + 2 * k]) | (i64(row[o + 3 + 2 * k]) << 8)
            w64[32 * b + k] = _signed(G_IQ2_XS[q & 511], MASK7[q >> 9])
        for s in range(8):
            sc = row[o + 66 + s]
            sc16[16 * b + 2 * s] = d * (f32(0.5) + f32(sc & 15)) * f32(0.25)
            sc16[16 * b + 2 * s + 1] = d * (f32(0.5) + f32(sc >> 4)) * f32(0.25)


@njit(cache=True)
def _iq2_s(row, w64, sc16):
    for b in range(row.shape[0] // 82):
        o = b * 82
        d = f16_at(row, o)
        for s in range(8):
            qh = i64(row[o + 66 + s])
            for k in range(4):
                code = i64(row[o + 2 + 4 * s + k]) | (((qh >> (2 * k)) & 3) << 8)
                w64[32 * b + 4 * s + k] = _signed(G_IQ2_S[code], MASK8[row[o + 34 + 4 * s + k]])
            sc = row[o + 74 + s]
            sc16[16 * b + 2 * s] = d * (f32(0.5) + f32(sc & 15)) * f32(0.25)
            sc16[16 * b + 2 * s + 1] = d * (f32(0.5) + f32(sc >> 4)) * f32(0.25)


@njit(cache=True)
def _iq3_xxs(row, w64, sc16):
    for b in range(row.shape[0] // 98):
        o = b * 98
        d = f16_at(row, o)
        for s in range(8):
            w = u32_at(row, o + 66 + 4 * s)
            for k in range(4):
                c = o + 2 + 8 * s + 2 * k
                g = G_IQ3_XXS[row[c]] | (G_IQ3_XXS[row[c + 1]] << u64(32))
                w64[32 * b + 4 * s + k] = _signed(g, MASK7[(w >> (7 * k)) & 127])
            db = d * (f32(0.5) + f32(w >> 28)) * f32(0.5)
            sc16[16 * b + 2 * s] = db
            sc16[16 * b + 2 * s + 1] = db


@njit(cache=True)
def _iq3_s(row, w64, sc16):
    for b in range(row.shape[0] // 110):
        o = b * 110
        d = f16_at(row, o)
        for s in range(8):
            qh = i64(row[o + 66 + s])
            for k in range(4):
                c = o + 2 + 8 * s + 2 * k
                lo = G_IQ3_S[i64(row[c]) | (((qh >> (2 * k)) & 1) << 8)]
                hi = G_IQ3_S[i64(row[c + 1]) | (((qh >> (2 * k + 1)) & 1) << 8)]
                w64[32 * b + 4 * s + k] = _signed(lo | (hi << u64(32)),
                                                  MASK8[row[o + 74 + 4 * s + k]])
            db = d * f32(1 + 2 * i64((row[o + 106 + (s >> 1)] >> (4 * (s & 1))) & 15))
            sc16[16 * b + 2 * s] = db
            sc16[16 * b + 2 * s + 1] = db


@njit(cache=True)
def _iq1_s(row, w64, sc16):
    for b in range(row.shape[0] // 50):
        o = b * 50
        d = f16_at(row, o)
        for s in range(8):
            qh = i64(row[o + 34 + 2 * s]) | (i64(row[o + 35 + 2 * s]) << 8)
            table = G_IQ1_MINUS if qh & 0x8000 else G_IQ1_PLUS
            for k in range(4):
                w64[32 * b + 4 * s + k] = table[i64(row[o + 2 + 4 * s + k])
                                                | (((qh >> (3 * k)) & 7) << 8)]
            dl = d * f32(2 * ((qh >> 12) & 7) + 1) * f32(0.125)
            sc16[16 * b + 2 * s] = dl
            sc16[16 * b + 2 * s + 1] = dl


@njit(cache=True)
def _iq1_m(row, w64, sc16):
    for b in range(row.shape[0] // 56):
        o = b * 56
        d = iq1_m_d(row, o)
        for k in range(32):
            nib = (i64(row[o + 32 + (k >> 1)]) >> (4 * (k & 1))) & 15
            table = G_IQ1_MINUS if nib & 8 else G_IQ1_PLUS
            w64[32 * b + k] = table[i64(row[o + k]) | ((nib & 7) << 8)]
        for n in range(16):
            word = i64(row[o + 48 + 2 * (n >> 2)]) | (i64(row[o + 49 + 2 * (n >> 2)]) << 8)
            sc16[16 * b + n] = d * f32(2 * ((word >> (3 * (n & 3))) & 7) + 1) * f32(0.125)


@njit(inline="always", cache=True)
def _levels(row, qo, w8, e0, mx):
    """32 levels from the 16 nibble bytes at row[qo] into w8[e0:e0+32]: IQ4's table, or
    MXFP4's where `mx`."""
    if HAS_AVX2:  # a compile-time constant: one vpshufb for the 32
        if mx:
            _mx_levels32(row, qo, w8, e0)
        else:
            _levels32(row, qo, w8, e0)
        return
    pairs = MX_LEVEL_PAIRS if mx else LEVEL_PAIRS
    for j in range(16):
        q = row[qo + j]
        w8[e0 + j] = pairs[q, 0]
        w8[e0 + 16 + j] = pairs[q, 1]


@njit(inline="always", cache=True)
def _scaled_blocks(row, w64, sc16, mx):
    """Blocks of one scale and 16 nibble bytes: IQ4_NL's (f16 d, 18 B) or MXFP4's (E8M0, 17 B)."""
    w8 = w64.view(np.int8)
    size = 17 if mx else 18
    for g in range(row.shape[0] // size):
        if mx:
            _levels(row, size * g + 1, w8, 32 * g, True)
            d = e8m0_at(row, size * g)
        else:
            _levels(row, size * g + 2, w8, 32 * g, False)
            d = f16_at(row, size * g)
        sc16[2 * g] = d
        sc16[2 * g + 1] = d


@njit(cache=True)
def _mxfp4(row, w64, sc16):
    _scaled_blocks(row, w64, sc16, True)


@njit(cache=True)
def _iq4_nl(row, w64, sc16):
    _scaled_blocks(row, w64, sc16, False)


@njit(cache=True)
def _iq4_xs(row, w64, sc16):
    w8 = w64.view(np.int8)
    for b in range(row.shape[0] // 136):
        o = b * 136
        d = f16_at(row, o)
        high = i64(row[o + 2]) | (i64(row[o + 3]) << 8)
        for s in range(8):
            low = (i64(row[o + 4 + (s >> 1)]) >> (4 * (s & 1))) & 15
            ds = d * f32((low | (((high >> (2 * s)) & 3) << 4)) - 32)
            _levels(row, o + 8 + 16 * s, w8, 256 * b + 32 * s, False)
            sc16[16 * b + 2 * s] = ds
            sc16[16 * b + 2 * s + 1] = ds


@njit(cache=True)
def decode_row(qtype: int, row: np.ndarray, w64: np.ndarray, sc16: np.ndarray) -> None:
    """Decode one table-coded row (qtypes.TABLE_CODED) into w64 (as int8 weights) and sc16; no-op
    for other types."""
    if qtype == qt.IQ1_S:
        _iq1_s(row, w64, sc16)
    elif qtype == qt.IQ2_XXS:
        _iq2_xxs(row, w64, sc16)
    elif qtype == qt.IQ4_XS:
        _iq4_xs(row, w64, sc16)
    elif qtype == qt.IQ1_M:
        _iq1_m(row, w64, sc16)
    elif qtype == qt.IQ2_XS:
        _iq2_xs(row, w64, sc16)
    elif qtype == qt.IQ2_S:
        _iq2_s(row, w64, sc16)
    elif qtype == qt.IQ3_XXS:
        _iq3_xxs(row, w64, sc16)
    elif qtype == qt.IQ3_S:
        _iq3_s(row, w64, sc16)
    elif qtype == qt.IQ4_NL:
        _iq4_nl(row, w64, sc16)
    elif qtype == qt.MXFP4:
        _mxfp4(row, w64, sc16)


@njit(cache=True)
def dot_decoded(w64: np.ndarray, sc16: np.ndarray, x: np.ndarray, cols: int) -> float:
    """sum_e sc16[e // 16] * w8[e] * x[e] over the first `cols` elements (float32 x)."""
    w8 = w64.view(np.int8)
    acc = f32x8_zero()
    for s in range(cols // 16):
        acc = dot16_f32(acc, w8, 16 * s, x, 16 * s, sc16[s])
    return hsum8(acc)


@njit(cache=True)
def dot_decoded_q8(w64: np.ndarray, sc16: np.ndarray, xq: np.ndarray, dx: np.ndarray,
                   cols: int) -> float:
    """The same with x as int8 per 32-group (xq, scale dx): integer dots per 16 (sdot32)."""
    w8 = w64.view(np.int8)
    acc = f32x8_zero()
    for g in range(cols // 32):
        acc = fma_halves(acc, sdot32(w8, 32 * g, xq, 32 * g), dx[g] * sc16[2 * g],
                         dx[g] * sc16[2 * g + 1])
    return hsum8(acc)


@njit(inline="always", cache=True)
def is_table_coded(qtype: int) -> bool:
    return (qtype == qt.IQ1_S or qtype == qt.IQ1_M or qtype == qt.IQ2_XXS or qtype == qt.IQ2_XS
            or qtype == qt.IQ2_S or qtype == qt.IQ3_XXS or qtype == qt.IQ3_S
            or qtype == qt.IQ4_NL or qtype == qt.IQ4_XS or qtype == qt.MXFP4)


@njit(inline="always", cache=True)
def scratch(qtype: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """A decoded row's buffers (w64 [cols/8], sc16 [cols/16]); empty for other types."""
    n = cols if is_table_coded(qtype) else 0
    return np.empty(n // 8, np.uint64), np.empty(n // 16, np.float32)
