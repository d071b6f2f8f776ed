"""Reference dequantization of `GpuQuant` planes in plain torch (any device).

`element_values(q, rows, cols)` computes weight (row, col) for index vectors with the same
per-element formulas as the Triton tile (dequant_tile.py), in the same fp32 operation order as
ggml's reference dequantizers, so the two can be compared element for element and both against
gguf-py's `dequantize` (tests/gpu_kernels).
"""

from __future__ import annotations

import torch

from gpu_kernels import qtypes as qt
from gpu_kernels.qformat import GpuQuant

f32 = torch.float32


def _at(plane: torch.Tensor, rows: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """plane[rows, idx] for rows [R, 1] and idx [1, C] (broadcast) -> [R, C]."""
    return plane[rows, idx]


def e8m0_half(e: torch.Tensor) -> torch.Tensor:
    """MXFP4's scale 2^(e - 128) as float32 for exponents e (any integer dtype, values 0..255),
    written as its bits (ggml's GGML_E8M0_TO_FP32_HALF): exact for every e, 2^-128 and 2^-127
    (denormal) for e = 0, 1."""
    e = e.to(torch.int32)
    return torch.where(e < 2, (e + 1) * 0x00200000, (e - 1) << 23).view(f32)


def element_values(q: GpuQuant, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Weights at rows [R] x cols [C] (int64 index vectors) -> [R, C] float32."""
    r = rows.reshape(-1, 1).to(q.device)
    e = cols.reshape(1, -1).to(q.device)
    p = q.planes
    t = q.qtype
    if t in qt.FLOAT_DTYPES:
        return _at(p[0], r, e).to(f32)
    if t == qt.Q8_0:
        return _at(p[1], r, e // 32).to(f32) * _at(p[0], r, e).to(f32)
    if t in (qt.Q4_0, qt.Q4_1, qt.Q5_0, qt.Q5_1):
        b = _at(p[0], r, (e // 32) * 16 + e % 16).to(torch.int32)
        nib = (b >> (((e // 16) % 2) * 4)) & 15
        if t in (qt.Q5_0, qt.Q5_1):
            qh = _at(p[1], r, e // 32)
            nib = nib | (((qh >> (e % 32)) & 1) << 4)
        d = _at(p[2 if t in (qt.Q5_0, qt.Q5_1) else 1], r, e // 32).to(f32)
        if t == qt.Q4_0:
            return d * (nib - 8).to(f32)
        if t == qt.Q5_0:
            return d * (nib - 16).to(f32)
        m = _at(p[-1], r, e // 32).to(f32)
        return d * nib.to(f32) + m
    if t in (qt.IQ4_NL, qt.IQ4_XS, qt.MXFP4):
        b = _at(p[0], r, (e // 32) * 16 + e % 16).to(torch.int32)
        nib = (b >> (((e // 16) % 2) * 4)) & 15
        levels = qt.MXFP4_LEVELS if t == qt.MXFP4 else qt.IQ4_LEVELS
        level = torch.tensor(levels, dtype=f32, device=b.device)[nib]
        if t == qt.MXFP4:
            return e8m0_half(_at(p[1], r, e // 32)) * level
        if t == qt.IQ4_NL:
            return _at(p[1], r, e // 32).to(f32) * level
        return (_at(p[2], r, e // 256).to(f32) * _at(p[1], r, e // 32).to(f32)) * level
    sb, i = e // 256, e % 256
    half, run, lane = i // 128, (i % 128) // 32, i % 32
    if t in (qt.Q4_K, qt.Q5_K):
        b = _at(p[0], r, sb * 128 + (i // 64) * 32 + lane).to(torch.int32)
        v = (b >> (((i // 32) % 2) * 4)) & 15
        if t == qt.Q5_K:
            qh = _at(p[1], r, sb * 32 + lane).to(torch.int32)
            v = v | (((qh >> (i // 32)) & 1) << 4)
        o = 2 if t == qt.Q5_K else 1
        sc, mn = _at(p[o], r, e // 32).to(f32), _at(p[o + 1], r, e // 32).to(f32)
        d, dmin = _at(p[o + 2], r, sb).to(f32), _at(p[o + 3], r, sb).to(f32)
        return (d * sc) * v.to(f32) - dmin * mn
    if t == qt.Q6_K:
        ql = _at(p[0], r, sb * 128 + half * 64 + (run % 2) * 32 + lane).to(torch.int32)
        qh = _at(p[1], r, sb * 64 + half * 32 + lane).to(torch.int32)
        v = ((ql >> ((run // 2) * 4)) & 15) | (((qh >> (2 * run)) & 3) << 4)
        d, sc = _at(p[3], r, sb).to(f32), _at(p[2], r, e // 16).to(f32)
        return (d * sc) * (v - 32).to(f32)
    if t == qt.Q2_K:
        b = _at(p[0], r, sb * 64 + half * 32 + lane).to(torch.int32)
        v = (b >> (2 * run)) & 3
        s = _at(p[1], r, e // 16).to(torch.int32)
        d, dmin = _at(p[2], r, sb).to(f32), _at(p[3], r, sb).to(f32)
        return (d * (s & 15).to(f32)) * v.to(f32) - dmin * (s >> 4).to(f32)
    if t == qt.Q3_K:
        b = _at(p[1], r, sb * 64 + half * 32 + lane).to(torch.int32)
        hm = _at(p[0], r, sb * 32 + lane).to(torch.int32)
        v = ((b >> (2 * run)) & 3) - 4 + 4 * ((hm >> (4 * half + run)) & 1)
        d, sc = _at(p[3], r, sb).to(f32), _at(p[2], r, e // 16).to(f32)
        return (d * sc) * v.to(f32)
    raise ValueError(f"no reference for {qt.name(t)}")


def dequantize(q: GpuQuant) -> torch.Tensor:
    """The whole matrix [rows, cols] float32, on q's device (in row chunks, bounded memory)."""
    out = torch.empty(q.rows, q.cols, dtype=f32, device=q.device)
    cols = torch.arange(q.cols, device=q.device)
    step = max(1, (1 << 22) // max(q.cols, 1))
    for r0 in range(0, q.rows, step):
        rows = torch.arange(r0, min(q.rows, r0 + step), device=q.device)
        out[r0:r0 + rows.numel()] = element_values(q, rows, cols)
    return out
