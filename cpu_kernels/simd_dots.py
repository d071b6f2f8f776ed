"""`fast` row dots on GGUF blocks with vpdpbusd, for a tile of up to 4 activation rows at once.

Each weight block is loaded and unpacked to unsigned byte codes once and multiplied with the
int8 activations of every row of the tile (decode once per token group). Per 32-group: one
dpbusd per row into 8 int32 lanes, one float multiply-add by (weight scale x activation scale);
code offsets (Q6_K -32, Q5_0 -16, Q4_0 -8, Q8_0 stored signed -> +128) are removed in int32
with the per-4 activation sums `xsum4`, Q4_K mins with the per-32 float sums `xqsum`. The result
is dot(exact weights, xq * dx) up to float32 rounding (see q8_activations).

row: [row_bytes] uint8  xq: [P * n, C] int8, lo_off its flat lo-plane offset (0: one plane)  dx, xqsum: [n, C/32] f32  xsum4: [n, C/4] int32
t0..t3: the activation rows of the tile (only the first `nt` are used); returns 4 dots.
NOTE: runtime branches on `nt` or the plane count inside the block loop cost 1.5-4x, and
inlining many copies of a tile into one numba function compiles for minutes; so each tile is
compiled once per (rows 1 or 4, planes 1 or 2) as its own function, the constants baked in
(`specialize`). Rows 2 and 3 run the 4-row tile on padded rows.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels.scalars import f16_at, k4_scale_min, u32_at
from cpu_kernels.simd import (
    b32_and,
    b32_or,
    b32_shl,
    b32_shr,
    b32_xor,
    bits_to_b32,
    dpbusd,
    f32x8_halves,
    f32x8_zero,
    fma_i32,
    hsum,
    i32x8_shl,
    i32x8_zero,
    load_b32,
    load_i32x8,
    load_nibbles16,
    sub_shl,
)

f32 = np.float32
i8 = np.int8
TILE = 4


@njit(inline="always", cache=True)
def _dp(q, xq, xo, lo_off):
    """Lane sums of q (u8 codes) times the activations at flat index xo (two planes if lo_off)."""
    s = dpbusd(i32x8_zero(), q, load_b32(xq, xo))
    if lo_off != 0:
        s = dpbusd(i32x8_shl(s, 8), q, load_b32(xq, xo + lo_off))
    return s


@njit(inline="always", cache=True)
def _q4k_row(lo, hi, xq, lo_off, xo, g, ds0, ds1, dm0, dm1, dx, xqsum, t, acc, mn):
    acc = fma_i32(_dp(lo, xq, xo, lo_off), ds0 * dx[t, g], acc)
    acc = fma_i32(_dp(hi, xq, xo + 32, lo_off), ds1 * dx[t, g + 1], acc)
    return acc, mn + dm0 * xqsum[t, g] + dm1 * xqsum[t, g + 1]


@njit(inline="always", cache=True)
def _q4_k_tile(row: np.ndarray, xq: np.ndarray, lo_off: int, dx: np.ndarray, xqsum: np.ndarray,
              t0: int, t1: int, t2: int, t3: int, nt: int) -> tuple[float, float, float, float]:
    # Q4_K block (144 B): f16 d, f16 dmin, 12 B 6-bit scales/mins, qs[128]; 64-element chunk c
    # is qs[32c:32c+32]: low nibbles elements 0..31 (sub-block 2c), high nibbles 32..63.
    cols = xq.shape[1]
    a0, a1, a2, a3 = f32x8_zero(), f32x8_zero(), f32x8_zero(), f32x8_zero()
    m0, m1, m2, m3 = f32(0.0), f32(0.0), f32(0.0), f32(0.0)
    for b in range(row.shape[0] // 144):
        o = b * 144
        d = f16_at(row, o)
        dmin = f16_at(row, o + 2)
        for c in range(4):
            sc0, mi0 = k4_scale_min(row, o + 4, 2 * c)
            sc1, mi1 = k4_scale_min(row, o + 4, 2 * c + 1)
            q = load_b32(row, o + 16 + 32 * c)
            lo = b32_and(q, 15)
            hi = b32_and(b32_shr(q, 4), 15)
            ds0, ds1 = d * f32(sc0), d * f32(sc1)
            dm0, dm1 = dmin * f32(mi0), dmin * f32(mi1)
            xb = b * 256 + 64 * c
            g = xb >> 5
            a0, m0 = _q4k_row(lo, hi, xq, lo_off, t0 * cols + xb, g, ds0, ds1, dm0, dm1, dx, xqsum, t0,
                              a0, m0)
            if nt > 1:
                a1, m1 = _q4k_row(lo, hi, xq, lo_off, t1 * cols + xb, g, ds0, ds1, dm0, dm1, dx, xqsum,
                                  t1, a1, m1)
            if nt > 2:
                a2, m2 = _q4k_row(lo, hi, xq, lo_off, t2 * cols + xb, g, ds0, ds1, dm0, dm1, dx, xqsum,
                                  t2, a2, m2)
            if nt > 3:
                a3, m3 = _q4k_row(lo, hi, xq, lo_off, t3 * cols + xb, g, ds0, ds1, dm0, dm1, dx, xqsum,
                                  t3, a3, m3)
    return hsum(a0) - m0, hsum(a1) - m1, hsum(a2) - m2, hsum(a3) - m3


@njit(inline="always", cache=True)
def _q6k_row(q0, q1, q2, q3, s, xq, lo_off, xsum4, xo, g, dx, t, acc):
    # s: the 8 scales (x d) of this half; group k uses s[2k] for lanes 0-3, s[2k+1] for 4-7
    qs = (q0, q1, q2, q3)
    for k in range(4):
        v = sub_shl(_dp(qs[k], xq, xo + 32 * k, lo_off),
                    load_i32x8(xsum4, (xo + 32 * k) >> 2), 5)
        acc = fma_i32(v, f32x8_halves(s[2 * k] * dx[t, g + k], s[2 * k + 1] * dx[t, g + k]), acc)
    return acc


@njit(inline="always", cache=True)
def _q6_k_tile(row: np.ndarray, xq: np.ndarray, lo_off: int, dx: np.ndarray, xsum4: np.ndarray,
              t0: int, t1: int, t2: int, t3: int, nt: int) -> tuple[float, float, float, float]:
    # Q6_K block (210 B): ql[128], qh[64], int8 scales[16], f16 d; half n of 128 elements uses
    # ql[64n:64n+64], qh[32n:32n+32], scales[8n:8n+8]; element l + 32k has scale 2k + l // 16.
    cols = xq.shape[1]
    a0, a1, a2, a3 = f32x8_zero(), f32x8_zero(), f32x8_zero(), f32x8_zero()
    for b in range(row.shape[0] // 210):
        o = b * 210
        d = f16_at(row, o + 208)
        for n in range(2):
            ql = o + 64 * n
            qa = load_b32(row, ql)
            qb = load_b32(row, ql + 32)
            qh = load_b32(row, o + 128 + 32 * n)
            q0 = b32_or(b32_and(qa, 15), b32_shl(b32_and(qh, 3), 4))
            q1 = b32_or(b32_and(qb, 15), b32_shl(b32_and(qh, 12), 2))
            q2 = b32_or(b32_shr(qa, 4), b32_and(qh, 48))
            q3 = b32_or(b32_shr(qb, 4), b32_and(b32_shr(qh, 2), 48))
            sc = o + 192 + 8 * n
            s = (d * f32(i8(row[sc])), d * f32(i8(row[sc + 1])), d * f32(i8(row[sc + 2])),
                 d * f32(i8(row[sc + 3])), d * f32(i8(row[sc + 4])), d * f32(i8(row[sc + 5])),
                 d * f32(i8(row[sc + 6])), d * f32(i8(row[sc + 7])))
            xb = b * 256 + 128 * n
            g = xb >> 5
            a0 = _q6k_row(q0, q1, q2, q3, s, xq, lo_off, xsum4, t0 * cols + xb, g, dx, t0, a0)
            if nt > 1:
                a1 = _q6k_row(q0, q1, q2, q3, s, xq, lo_off, xsum4, t1 * cols + xb, g, dx, t1, a1)
            if nt > 2:
                a2 = _q6k_row(q0, q1, q2, q3, s, xq, lo_off, xsum4, t2 * cols + xb, g, dx, t2, a2)
            if nt > 3:
                a3 = _q6k_row(q0, q1, q2, q3, s, xq, lo_off, xsum4, t3 * cols + xb, g, dx, t3, a3)
    return hsum(a0), hsum(a1), hsum(a2), hsum(a3)


@njit(inline="always", cache=True)
def _g32_row(q, shift, d, xq, lo_off, xsum4, xo, g, dx, t, acc):
    v = sub_shl(_dp(q, xq, xo, lo_off), load_i32x8(xsum4, xo >> 2), shift)
    return fma_i32(v, d * dx[t, g], acc)


@njit(inline="always", cache=True)
def _g32_tile(qtype_size: int, row: np.ndarray, xq: np.ndarray, lo_off: int, dx: np.ndarray,
             xsum4: np.ndarray, t0: int, t1: int, t2: int, t3: int, nt: int) -> tuple[float, float, float, float]:
    """Q8_0 (34 B), Q5_0 (22 B) or Q4_0 (18 B) blocks of 32, told apart by `qtype_size`."""
    cols = xq.shape[1]
    a0, a1, a2, a3 = f32x8_zero(), f32x8_zero(), f32x8_zero(), f32x8_zero()
    for g in range(row.shape[0] // qtype_size):
        o = g * qtype_size
        d = f16_at(row, o)
        if qtype_size == 34:  # int8 codes, stored signed: flip to code + 128
            q = b32_xor(load_b32(row, o + 2), 128)
            shift = 7
        elif qtype_size == 22:  # 4 low bits in nibbles, bit 4 of element j is bit j of qh
            q = b32_or(load_nibbles16(row, o + 6), bits_to_b32(u32_at(row, o + 2), 16))
            shift = 4
        else:
            q = load_nibbles16(row, o + 2)
            shift = 3
        xb = 32 * g
        a0 = _g32_row(q, shift, d, xq, lo_off, xsum4, t0 * cols + xb, g, dx, t0, a0)
        if nt > 1:
            a1 = _g32_row(q, shift, d, xq, lo_off, xsum4, t1 * cols + xb, g, dx, t1, a1)
        if nt > 2:
            a2 = _g32_row(q, shift, d, xq, lo_off, xsum4, t2 * cols + xb, g, dx, t2, a2)
        if nt > 3:
            a3 = _g32_row(q, shift, d, xq, lo_off, xsum4, t3 * cols + xb, g, dx, t3, a3)
    return hsum(a0), hsum(a1), hsum(a2), hsum(a3)


def specialize(body, nt: int, two_planes: bool, block_bytes: int = 0):
    """A compiled tile with `nt` and the plane count fixed: f(row, xq, lo_off, dx, sums, t0..t3).

    `sums` is xqsum for Q4_K, xsum4 for the others; `block_bytes` picks the g32 type.
    """
    if block_bytes:
        @njit(cache=True)
        def tile_g32(row, xq, lo_off, dx, sums, t0, t1, t2, t3):
            off = lo_off if two_planes else 0
            return body(block_bytes, row, xq, off, dx, sums, t0, t1, t2, t3, nt)
        return tile_g32

    @njit(cache=True)
    def tile(row, xq, lo_off, dx, sums, t0, t1, t2, t3):
        return body(row, xq, lo_off if two_planes else 0, dx, sums, t0, t1, t2, t3, nt)
    return tile


# name: [1 row 1 plane, 4 rows 1 plane, 1 row 2 planes, 4 rows 2 planes]
Q4_K_TILES = [specialize(_q4_k_tile, n, p) for p in (False, True) for n in (1, 4)]
Q6_K_TILES = [specialize(_q6_k_tile, n, p) for p in (False, True) for n in (1, 4)]
Q8_0_TILES = [specialize(_g32_tile, n, p, 34) for p in (False, True) for n in (1, 4)]
Q5_0_TILES = [specialize(_g32_tile, n, p, 22) for p in (False, True) for n in (1, 4)]
