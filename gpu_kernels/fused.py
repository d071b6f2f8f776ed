"""Small fused operators of a DeepSeek layer: one launch where torch would run several.

    add_rmsnorm    x += delta (+ delta2), in place; normed = x * rsqrt(mean(x^2) + eps) * w;
                   delta2 may be the CPU experts' answer in pinned memory, waited for here
    rope_cache     RoPE on the queries' rope dims, in place; the latent (RMS-normed) and the
                   rotated shared key written to the paged cache rows of their tokens
    silu_mul       silu(gate) * up; with a `limit` (DeepSeek-V4's clamped SwiGLU) gate clamped
                   from above and up on both sides first

add_rmsnorm and silu_mul also write their output quantized for the next product's integer
path when given `xq` (qdot_i8.quantize_x's result, in the same launch).

RoPE rotates adjacent pairs (x0, x1), (x2, x3), ... (the GGUF DeepSeek convention) by angle
pos * inv_freq[j], times `rope_scale` on cos and sin (YaRN's cos/sin factor). Each op has a
torch reference (`*_ref`) computing the same fp32 arithmetic.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gpu_kernels.device_function import device_function
from gpu_kernels.handshake import MAX_SPINS, Awaited, spin
from gpu_kernels.qdot_i8 import _QMAX, XQ, quant_store
from gpu_kernels.reference import add_rmsnorm_ref, rope_cache_ref, silu_mul_ref  # noqa: F401


@triton.jit
def _add_rmsnorm_kernel(x_ptr, d_ptr, d2_ptr, w_ptr, y_ptr, q_ptr, qd_ptr, qs_ptr, H, eps, sx,
                        fl_ptr, fl_index, seq_ptr, err_ptr, max_spins,
                        HAS_D: tl.constexpr, HAS_D2: tl.constexpr, AWAIT: tl.constexpr,
                        BH: tl.constexpr, QMAX: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BH)
    m = c < H
    x = tl.load(x_ptr + row * sx + c, mask=m, other=0.0)
    if HAS_D:
        x += tl.load(d_ptr + row * H + c, mask=m, other=0.0)
        if AWAIT:  # delta2 is the host's answer: in pinned memory once the flag is up
            spin(fl_ptr, fl_index, seq_ptr, err_ptr, max_spins)
            x += tl.load(d2_ptr + row * H + c, mask=m, other=0.0, volatile=True)
        elif HAS_D2:
            x += tl.load(d2_ptr + row * H + c, mask=m, other=0.0)
        tl.store(x_ptr + row * sx + c, x, mask=m)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
    w = tl.load(w_ptr + c, mask=m, other=0.0)
    y = w * (x * inv)
    tl.store(y_ptr + row * H + c, y, mask=m)
    if QMAX > 0:
        b = tl.arange(0, BH // 32)
        quant_store(tl.reshape(y, (BH // 32, 32)), b, b < H // 32, q_ptr + row * H,
                    qd_ptr + row * (H // 32), qs_ptr + row * (H // 32), QMAX, QMAX > 127)


def add_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float,
                delta: torch.Tensor | None = None, delta2: torch.Tensor | None = None,
                out: torch.Tensor | None = None, xq: XQ | None = None,
                awaited: Awaited | None = None) -> torch.Tensor:
    """x: [T, H] f32, rows may be strided (updated in place when deltas are given); deltas
    [T, H] dense -> normed [T, H] f32 (also into xq, [T, H] quantized, when given).
    `awaited` (with `delta`, not `delta2`): the second delta is the host's answer, waited for
    and read from pinned memory by this launch (handshake.py; its `resolve` is the same in
    two launches)."""
    t, h = x.shape
    if x.stride(-1) != 1:
        raise ValueError("add_rmsnorm needs x's rows dense")
    if awaited is not None and (delta is None or delta2 is not None
                                or awaited.src.shape[0] < t or awaited.src.shape[1] != h):
        raise ValueError(f"add_rmsnorm awaits host rows {tuple(awaited.src.shape)} as its "
                         f"second delta of [{t}, {h}], after a first one")
    out = out if out is not None else torch.empty(t, h, dtype=x.dtype, device=x.device)
    d = delta.contiguous() if delta is not None else x
    d2 = awaited.src if awaited is not None else \
        delta2.contiguous() if delta2 is not None else d
    q = xq or (out, out, out)
    flag = (awaited.flags, awaited.index, awaited.seq, awaited.error) if awaited is not None \
        else (x, 0, x, x)
    _add_rmsnorm_kernel[(t,)](x, d, d2, weight, out, *q, h, eps, x.stride(0), *flag,
                              MAX_SPINS, HAS_D=delta is not None,
                              HAS_D2=delta2 is not None or awaited is not None,
                              AWAIT=awaited is not None, BH=triton.next_power_of_2(h),
                              QMAX=_qmax(xq, h), num_warps=8 if h > 4096 else 4)
    return out


def _qmax(xq: XQ | None, width: int) -> float:
    """The quantized output's code range (0: none); its rows must hold `width` columns."""
    if xq is None:
        return 0.0
    if xq.q.shape[-1] != width or not xq.q.is_contiguous():
        raise ValueError(f"xq rows of {xq.q.shape[-1]} columns for an output of {width}")
    return _QMAX[xq.q.element_size() * 8]


@device_function
def _rotate(v_ptr, pos, inv_ptr, rope_scale, R: tl.constexpr):
    """Rotate R values at v_ptr (adjacent pairs) in place by angle pos * inv_freq."""
    j = tl.arange(0, R // 2)
    ang = pos * tl.load(inv_ptr + j)
    cos = tl.cos(ang) * rope_scale
    sin = tl.sin(ang) * rope_scale
    x0 = tl.load(v_ptr + 2 * j)
    x1 = tl.load(v_ptr + 2 * j + 1)
    return x0 * cos - x1 * sin, x1 * cos + x0 * sin, j


@triton.jit
def _rope_cache_kernel(q_ptr, kv_ptr, pos_ptr, slot_ptr, nw_ptr, inv_ptr, cache_ptr,
                       NH, q_stride, NOPE, eps, rope_scale, sq, skv,
                       C: tl.constexpr, R: tl.constexpr, BHEADS: tl.constexpr):
    # programs (token, block of BHEADS heads), and one more per token for its cache row: at
    # one token a chain of blocks in one program would run serially
    t = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    pos = tl.load(pos_ptr + t).to(tl.float32)
    if hb * BHEADS < NH:  # queries: this block's heads, their rope dims in place
        hh = hb * BHEADS + tl.arange(0, BHEADS)
        hm = hh < NH
        base = q_ptr + t * sq + hh[:, None] * q_stride + NOPE  # [BHEADS, 1]
        j = tl.arange(0, R // 2)[None, :]
        ang = pos * tl.load(inv_ptr + j)
        cos = tl.cos(ang) * rope_scale
        sin = tl.sin(ang) * rope_scale
        x0 = tl.load(base + 2 * j, mask=hm[:, None], other=0.0)
        x1 = tl.load(base + 2 * j + 1, mask=hm[:, None], other=0.0)
        tl.store(base + 2 * j, x0 * cos - x1 * sin, mask=hm[:, None])
        tl.store(base + 2 * j + 1, x1 * cos + x0 * sin, mask=hm[:, None])
    else:  # the latent, RMS-normed, and the shared rope key, into the token's cache row
        slot = tl.load(slot_ptr + t).to(tl.int64)
        row = cache_ptr + slot * (C + R)
        c = tl.arange(0, C)
        lat = tl.load(kv_ptr + t * skv + c)
        inv = 1.0 / tl.sqrt(tl.sum(lat * lat, axis=0) / C + eps)
        lat = tl.load(nw_ptr + c) * (lat * inv)
        tl.store(row + c, lat.to(cache_ptr.dtype.element_ty))
        k0, k1, jj = _rotate(kv_ptr + t * skv + C, pos, inv_ptr, rope_scale, R)
        tl.store(row + C + 2 * jj, k0.to(cache_ptr.dtype.element_ty))
        tl.store(row + C + 2 * jj + 1, k1.to(cache_ptr.dtype.element_ty))


def rope_cache(q: torch.Tensor, kv: torch.Tensor, positions: torch.Tensor,
               slots: torch.Tensor, norm_weight: torch.Tensor, inv_freq: torch.Tensor,
               rope_scale: float, eps: float, cache: torch.Tensor, nope: int) -> None:
    """q: [T, NH, nope + R] f32 (rope dims rotated in place); kv: [T, C + R] f32 (kv_a's
    output); positions, slots: [T] int; cache: [slots, C + R]. q's tokens and kv's rows may
    be strided (both columns of one product's output); within a token q's heads are dense."""
    t, nh, qd = q.shape
    c = norm_weight.shape[0]
    r = kv.shape[1] - c
    if q.stride(2) != 1 or q.stride(1) != qd or kv.stride(1) != 1:
        raise ValueError("rope_cache needs each token's q heads and kv row dense")
    bheads = 16
    _rope_cache_kernel[(t, triton.cdiv(nh, bheads) + 1)](
        q, kv, positions, slots, norm_weight, inv_freq, cache, nh, qd, nope, eps, rope_scale,
        q.stride(0), kv.stride(0), C=c, R=r, BHEADS=bheads, num_warps=4)


@triton.jit
def _silu_mul_kernel(gu_ptr, y_ptr, q_ptr, qd_ptr, qs_ptr, I, limit, BI: tl.constexpr,
                     QMAX: tl.constexpr, CLAMP: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BI + tl.arange(0, BI)
    m = i < I
    g = tl.load(gu_ptr + t * 2 * I + i, mask=m, other=0.0)
    u = tl.load(gu_ptr + t * 2 * I + I + i, mask=m, other=0.0)
    if CLAMP:  # a compiled variant of its own: the unclamped one is unchanged
        g = tl.minimum(g, limit)
        u = tl.minimum(tl.maximum(u, -limit), limit)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(y_ptr + t * I + i, y, mask=m)
    if QMAX > 0:
        b = tl.program_id(1) * (BI // 32) + tl.arange(0, BI // 32)
        quant_store(tl.reshape(y, (BI // 32, 32)), b, b < I // 32, q_ptr + t * I,
                    qd_ptr + t * (I // 32), qs_ptr + t * (I // 32), QMAX, QMAX > 127)


def silu_mul(gate_up: torch.Tensor, out: torch.Tensor | None = None,
             xq: XQ | None = None, limit: float = math.inf) -> torch.Tensor:
    """gate_up: [T, 2I] f32 (gate first) -> [T, I] f32 (also into xq, [T, I] quantized,
    when given). `limit`: the SwiGLU's clamp (inf: none)."""
    t, two_i = gate_up.shape
    i = two_i // 2
    out = out if out is not None else torch.empty(t, i, dtype=torch.float32,
                                                  device=gate_up.device)
    q = xq or (out, out, out)
    clamp = limit != math.inf
    _silu_mul_kernel[(t, triton.cdiv(i, 1024))](gate_up, out, *q, i, float(limit) if clamp
                                                else 0.0, CLAMP=clamp, BI=1024,
                                                QMAX=_qmax(xq, i), num_warps=4)
    return out
