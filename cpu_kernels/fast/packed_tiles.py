"""`fast` tiles on packed weights (see packed.py): 16 rows x up to 4 activation rows per call.

A tile reads two row groups at the same offsets, `pa` (rows 0-7) and `pb` (rows 8-15), joined
into 512-bit vectors (simd_pairs). Per 4-column step: one load of 16 rows' codes, one vpdpbusd
per activation row (and plane) with the 4 activations broadcast; per scale group: offset removal
in int32 (activation sums), one convert and one multiply-add by (row scales x activation
scale). The result is dot(exact weights, xq * dx) up to float32 rounding.
Why 16 rows: on Sapphire Rapids a zmm vpdpbusd issues as fast as a ymm one, so each unpack,
product and epilogue instruction serves twice the weights. One core, tiles over L2-resident
rows: Q4_K 0.70-0.77x the time of two 8-row (ymm) tiles, Q6_K with two planes 0.59-0.65x;
bit-identical results (the same integer sums and float32 operations per lane).

pa, pb: [row_group_bytes] uint8 (two row groups of one expert; an odd last group runs with
pb = pa, its upper 8 lanes then duplicate the lower ones)  xq: [P * n, C] int8 (plane lo at
flat offset lo_off)  dx, xqsum: [n, C/32] f32  xsum16: [n * C/16] int32 (flat)  t0..t3: activation
rows  res: [64] f32, res[16 i : 16 i + 16] = the 16 row dots of activation row t_i (i < nt).
`nt` is 1 to 4, each its own specialization: a 4-token tile given fewer tokens would spend its
spare products on padding, and decode batches give most experts 1 to 3 tokens.
NOTE: `nt` and the plane count are compile-time constants of each specialization: the tile
bodies are inlined into them by numba (inline="always"). The small helpers are plain functions
that LLVM inlines: numba-level inlining copies the IR per call site, which made these
specializations compile several times slower (the cold test suite took ~5 min, now ~2.5) for
the same speed.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from cpu_kernels.simd.simd import prefetch
from cpu_kernels.simd.simd_pairs import (
    U7_DOT_DIFFERS,
    b64_and,
    b64_or,
    b64_shl,
    b64_shr,
    bcast4x16,
    dpbusd16,
    dpbusd16_u7,
    f32x16_fnma,
    f32x16_mul,
    f32x16_zero,
    fma_i32x16,
    i32x16_combine,
    i32x16_sub_s,
    i32x16_zero,
    load_b64,
    load_f32x16_at,
    load_i8x16_f32,
    load_u8x16_f32,
    store_f32x16,
)

i32 = np.int32
# Software prefetch: every block first hints the lines PREFETCH bytes ahead of it into L1, in
# both row groups' streams. The hardware streamers stop at 4 KiB pages and ramp up slowly on 16
# cores' streams; the distance, and L1 rather than L2, measured best (docs/kernel-tuning.md).
PREFETCH = 2432


@njit(cache=True)
def _prefetch_block(pa, pb, o, size):
    for line in range(0, size, 64):
        prefetch(pa, o + PREFETCH + line)
        prefetch(pb, o + PREFETCH + line)


@njit(cache=True)
def prefetch_start(pa, pb):
    """Hint the first PREFETCH bytes of two row groups: a loop about to move to another
    expert's rows calls it on them first, since a tile's own hints run ahead only inside its
    rows (the phase-2 loops read each expert's 16 down rows, 13-27 KB, one expert after another:
    without it each began with ~2x2.4 KB of demand misses)."""
    for line in range(0, min(PREFETCH, pa.shape[0]), 64):
        prefetch(pa, line)
        prefetch(pb, line)


@njit(cache=True)
def dp_planes(hi, lo, q, xq, xo, lo_off, two, u7=True):
    """Accumulate codes q times the 4 activations at flat xq index xo (and its lo plane).
    u7: every code is below 128 (all types but Q8_0), the cheaper dot on CPUs without VNNI."""
    if U7_DOT_DIFFERS and u7:
        hi = dpbusd16_u7(hi, q, bcast4x16(xq, xo))
        if two:
            lo = dpbusd16_u7(lo, q, bcast4x16(xq, xo + lo_off))
    else:
        hi = dpbusd16(hi, q, bcast4x16(xq, xo))
        if two:
            lo = dpbusd16(lo, q, bcast4x16(xq, xo + lo_off))
    return hi, lo


@njit(cache=True)
def plane_sum(hi, lo, two):
    return i32x16_combine(hi, lo, 8) if two else hi


@njit(cache=True)
def store_tiles(res, f0, f1, f2, f3, nt):
    store_f32x16(res, 0, f0)
    if nt > 1:
        store_f32x16(res, 16, f1)
    if nt > 2:
        store_f32x16(res, 32, f2)
    if nt > 3:
        store_f32x16(res, 48, f3)


@njit(cache=True)
def _q4k_chunk(lo, hi, xq, xo, lo_off, two, ah, al, bh, bl):
    ah, al = dp_planes(ah, al, lo, xq, xo, lo_off, two)
    bh, bl = dp_planes(bh, bl, hi, xq, xo + 32, lo_off, two)
    return ah, al, bh, bl


@njit(cache=True)
def _q4k_fin(ah, al, bh, bl, two, s0, s1, m0, m1, dx, xqsum, t, g, acc):
    acc = fma_i32x16(plane_sum(ah, al, two), f32x16_mul(s0, dx[t, g]), acc)
    acc = fma_i32x16(plane_sum(bh, bl, two), f32x16_mul(s1, dx[t, g + 1]), acc)
    acc = f32x16_fnma(acc, m0, xqsum[t, g])
    return f32x16_fnma(acc, m1, xqsum[t, g + 1])


@njit(inline="always", cache=True)
def q4_k_tile(pa, pb, xq, lo_off, dx, xqsum, t0, t1, t2, t3, res, nt, two):
    cols = xq.shape[1]
    f0, f1, f2, f3 = f32x16_zero(), f32x16_zero(), f32x16_zero(), f32x16_zero()
    for b in range(pa.shape[0] // 1216):
        o = b * 1216
        _prefetch_block(pa, pb, o, 1216)
        dv = load_f32x16_at(pa, pb, o + 1152)
        mv = load_f32x16_at(pa, pb, o + 1184)
        for c in range(4):
            s0 = f32x16_mul(load_u8x16_f32(pa, pb, o + 1024 + 16 * c), dv)
            s1 = f32x16_mul(load_u8x16_f32(pa, pb, o + 1032 + 16 * c), dv)
            m0 = f32x16_mul(load_u8x16_f32(pa, pb, o + 1088 + 16 * c), mv)
            m1 = f32x16_mul(load_u8x16_f32(pa, pb, o + 1096 + 16 * c), mv)
            z = i32x16_zero()
            a0h, a0l, b0h, b0l = z, z, z, z
            a1h, a1l, b1h, b1l = z, z, z, z
            a2h, a2l, b2h, b2l = z, z, z, z
            a3h, a3l, b3h, b3l = z, z, z, z
            xb = b * 256 + 64 * c
            for k4 in range(8):
                v = load_b64(pa, pb, o + 256 * c + 32 * k4)
                lo = b64_and(v, 15)
                hi = b64_and(b64_shr(v, 4), 15)
                x4 = xb + 4 * k4
                a0h, a0l, b0h, b0l = _q4k_chunk(lo, hi, xq, t0 * cols + x4, lo_off, two,
                                                a0h, a0l, b0h, b0l)
                if nt > 1:
                    a1h, a1l, b1h, b1l = _q4k_chunk(lo, hi, xq, t1 * cols + x4, lo_off, two,
                                                    a1h, a1l, b1h, b1l)
                    if nt > 2:
                        a2h, a2l, b2h, b2l = _q4k_chunk(lo, hi, xq, t2 * cols + x4, lo_off, two,
                                                        a2h, a2l, b2h, b2l)
                        if nt > 3:
                            a3h, a3l, b3h, b3l = _q4k_chunk(lo, hi, xq, t3 * cols + x4, lo_off,
                                                            two, a3h, a3l, b3h, b3l)
            g = xb >> 5
            f0 = _q4k_fin(a0h, a0l, b0h, b0l, two, s0, s1, m0, m1, dx, xqsum, t0, g, f0)
            if nt > 1:
                f1 = _q4k_fin(a1h, a1l, b1h, b1l, two, s0, s1, m0, m1, dx, xqsum, t1, g, f1)
                if nt > 2:
                    f2 = _q4k_fin(a2h, a2l, b2h, b2l, two, s0, s1, m0, m1, dx, xqsum, t2, g, f2)
                    if nt > 3:
                        f3 = _q4k_fin(a3h, a3l, b3h, b3l, two, s0, s1, m0, m1, dx, xqsum, t3, g,
                                      f3)
    store_tiles(res, f0, f1, f2, f3, nt)


@njit(cache=True)
def _q6k_sub(q0, q1, q2, q3, xq, xo, lo_off, two, sv, dx, xsum16, t, g, acc):
    z = i32x16_zero()
    h, lo = dp_planes(z, z, q0, xq, xo, lo_off, two)
    h, lo = dp_planes(h, lo, q1, xq, xo + 4, lo_off, two)
    h, lo = dp_planes(h, lo, q2, xq, xo + 8, lo_off, two)
    h, lo = dp_planes(h, lo, q3, xq, xo + 12, lo_off, two)
    s = i32x16_sub_s(plane_sum(h, lo, two), xsum16[xo >> 4] << 5)
    return fma_i32x16(s, f32x16_mul(sv, dx[t, g]), acc)


@njit(inline="always", cache=True)
def q6_k_tile(pa, pb, xq, lo_off, dx, xsum16, t0, t1, t2, t3, res, nt, two):
    cols = xq.shape[1]
    f0, f1, f2, f3 = f32x16_zero(), f32x16_zero(), f32x16_zero(), f32x16_zero()
    for b in range(pa.shape[0] // 1696):
        o = b * 1696
        _prefetch_block(pa, pb, o, 1696)
        dv = load_f32x16_at(pa, pb, o + 1664)
        for p in range(16):
            qo = o + 96 * p
            n01 = load_b64(pa, pb, qo)
            n23 = load_b64(pa, pb, qo + 32)
            hb = load_b64(pa, pb, qo + 64)
            q0 = b64_or(b64_and(n01, 15), b64_shl(b64_and(hb, 3), 4))
            q1 = b64_or(b64_shr(n01, 4), b64_shl(b64_and(hb, 12), 2))
            q2 = b64_or(b64_and(n23, 15), b64_and(hb, 48))
            q3 = b64_or(b64_shr(n23, 4), b64_and(b64_shr(hb, 2), 48))
            sv = f32x16_mul(load_i8x16_f32(pa, pb, o + 1536 + 8 * p), dv)
            xb = b * 256 + 16 * p
            g = xb >> 5
            f0 = _q6k_sub(q0, q1, q2, q3, xq, t0 * cols + xb, lo_off, two, sv, dx, xsum16, t0, g,
                          f0)
            if nt > 1:
                f1 = _q6k_sub(q0, q1, q2, q3, xq, t1 * cols + xb, lo_off, two, sv, dx, xsum16,
                              t1, g, f1)
                if nt > 2:
                    f2 = _q6k_sub(q0, q1, q2, q3, xq, t2 * cols + xb, lo_off, two, sv, dx, xsum16,
                                  t2, g, f2)
                    if nt > 3:
                        f3 = _q6k_sub(q0, q1, q2, q3, xq, t3 * cols + xb, lo_off, two, sv, dx,
                                      xsum16, t3, g, f3)
    store_tiles(res, f0, f1, f2, f3, nt)


@njit(cache=True)
def _g32_group(q0, q1, q2, q3, q4, q5, q6, q7, shift, xq, xo, lo_off, two, dv, dx, xsum16, t,
               g, acc):
    z = i32x16_zero()
    u7 = shift != 7  # Q8_0's codes (+ 128) reach 255
    h, lo = dp_planes(z, z, q0, xq, xo, lo_off, two, u7)
    h, lo = dp_planes(h, lo, q1, xq, xo + 4, lo_off, two, u7)
    h, lo = dp_planes(h, lo, q2, xq, xo + 8, lo_off, two, u7)
    h, lo = dp_planes(h, lo, q3, xq, xo + 12, lo_off, two, u7)
    h, lo = dp_planes(h, lo, q4, xq, xo + 16, lo_off, two, u7)
    h, lo = dp_planes(h, lo, q5, xq, xo + 20, lo_off, two, u7)
    h, lo = dp_planes(h, lo, q6, xq, xo + 24, lo_off, two, u7)
    h, lo = dp_planes(h, lo, q7, xq, xo + 28, lo_off, two, u7)
    offset = i32(xsum16[xo >> 4] + xsum16[(xo >> 4) + 1]) << shift  # the 32-group's code offset
    s = i32x16_sub_s(plane_sum(h, lo, two), offset)
    return fma_i32x16(s, f32x16_mul(dv, dx[t, g]), acc)


@njit(cache=True)
def _q5_bit(hb, i):
    """Bit i of each byte of hb, moved to bit 4."""
    if i < 4:
        return b64_and(b64_shl(hb, 4 - i), 16)
    return b64_and(b64_shr(hb, i - 4), 16)


@njit(inline="always", cache=True)
def g32_tile(block_bytes, pa, pb, xq, lo_off, dx, xsum16, t0, t1, t2, t3, res, nt, two):
    """Q8_0 (288 B per 8 rows x 32) or Q5_0 (192 B), told apart by `block_bytes`."""
    cols = xq.shape[1]
    f0, f1, f2, f3 = f32x16_zero(), f32x16_zero(), f32x16_zero(), f32x16_zero()
    for g in range(pa.shape[0] // block_bytes):
        o = g * block_bytes
        _prefetch_block(pa, pb, o, block_bytes)
        if block_bytes == 288:
            dv = load_f32x16_at(pa, pb, o + 256)
            shift = 7
            q0, q1 = load_b64(pa, pb, o), load_b64(pa, pb, o + 32)
            q2, q3 = load_b64(pa, pb, o + 64), load_b64(pa, pb, o + 96)
            q4, q5 = load_b64(pa, pb, o + 128), load_b64(pa, pb, o + 160)
            q6, q7 = load_b64(pa, pb, o + 192), load_b64(pa, pb, o + 224)
        else:
            dv = load_f32x16_at(pa, pb, o + 160)
            shift = 4
            hb = load_b64(pa, pb, o + 128)
            n0, n1 = load_b64(pa, pb, o), load_b64(pa, pb, o + 32)
            n2, n3 = load_b64(pa, pb, o + 64), load_b64(pa, pb, o + 96)
            q0 = b64_or(b64_and(n0, 15), _q5_bit(hb, 0))
            q1 = b64_or(b64_shr(n0, 4), _q5_bit(hb, 1))
            q2 = b64_or(b64_and(n1, 15), _q5_bit(hb, 2))
            q3 = b64_or(b64_shr(n1, 4), _q5_bit(hb, 3))
            q4 = b64_or(b64_and(n2, 15), _q5_bit(hb, 4))
            q5 = b64_or(b64_shr(n2, 4), _q5_bit(hb, 5))
            q6 = b64_or(b64_and(n3, 15), _q5_bit(hb, 6))
            q7 = b64_or(b64_shr(n3, 4), _q5_bit(hb, 7))
        xb = 32 * g
        f0 = _g32_group(q0, q1, q2, q3, q4, q5, q6, q7, shift, xq, t0 * cols + xb, lo_off, two,
                        dv, dx, xsum16, t0, g, f0)
        if nt > 1:
            f1 = _g32_group(q0, q1, q2, q3, q4, q5, q6, q7, shift, xq, t1 * cols + xb, lo_off,
                            two, dv, dx, xsum16, t1, g, f1)
            if nt > 2:
                f2 = _g32_group(q0, q1, q2, q3, q4, q5, q6, q7, shift, xq, t2 * cols + xb, lo_off,
                                two, dv, dx, xsum16, t2, g, f2)
                if nt > 3:
                    f3 = _g32_group(q0, q1, q2, q3, q4, q5, q6, q7, shift, xq, t3 * cols + xb,
                                    lo_off, two, dv, dx, xsum16, t3, g, f3)
    store_tiles(res, f0, f1, f2, f3, nt)
