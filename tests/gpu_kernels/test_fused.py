"""Fused small operators and the router against their torch references."""

from __future__ import annotations

import pytest
import torch

from gpu_kernels.fused import (
    add_rmsnorm,
    add_rmsnorm_ref,
    rope_cache,
    rope_cache_ref,
    silu_mul,
    silu_mul_ref,
)
from gpu_kernels.qdot_i8 import empty_xq, quantize_x_ref
from gpu_kernels.router import route, route_ref
from tests.gpu_kernels.conftest import rel_err


@pytest.mark.parametrize("h", [64, 2048, 7168])
@pytest.mark.parametrize("deltas", [0, 1, 2])
def test_add_rmsnorm(h: int, deltas: int, device) -> None:
    g = torch.Generator().manual_seed(h + deltas)
    x, d, d2 = (torch.randn(3, h, generator=g).to(device) for _ in range(3))
    w = torch.rand(h, generator=g).to(device)
    args = [d, d2][:deltas]
    x1, x2 = x.clone(), x.clone()
    y = add_rmsnorm(x1, w, 1e-6, *args)
    y_ref = add_rmsnorm_ref(x2, w, 1e-6, *args)
    assert rel_err(y, y_ref) < 1e-6 and rel_err(x1, x2) < 1e-7


def _same_codes(xq, y: torch.Tensor, bits: int) -> None:
    """xq (written by a fused kernel) is quantize_x of its output y."""
    ref = quantize_x_ref(y.cpu(), bits)
    assert (xq.q.cpu().int() - ref.q.int()).abs().max() <= 1  # rounding at exact halves
    assert torch.allclose(xq.d.cpu(), ref.d) and torch.allclose(xq.s.cpu(), ref.s, atol=1e-4)


@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("h", [64, 2048, 7168])
def test_add_rmsnorm_writes_quantized_rows(h: int, bits: int, device) -> None:
    g = torch.Generator().manual_seed(h)
    x, d = (torch.randn(2, h, generator=g).to(device) for _ in range(2))
    w = torch.rand(h, generator=g).to(device)
    xq = empty_xq(2, h, bits, device)
    y = add_rmsnorm(x, w, 1e-6, d, xq=xq)
    _same_codes(xq, y, bits)
    with pytest.raises(ValueError, match="columns"):
        add_rmsnorm(x, w, 1e-6, xq=empty_xq(2, h + 32, bits, device))


@pytest.mark.parametrize("i", [96, 2816])
def test_silu_mul_writes_quantized_rows(i: int, device) -> None:
    gu = torch.randn(3, 2 * i, generator=torch.Generator().manual_seed(i)).to(device)
    xq = empty_xq(3, i, 16, device)
    _same_codes(xq, silu_mul(gu, xq=xq), 16)


@pytest.mark.parametrize("heads,nope,r,c", [(5, 16, 8, 32), (16, 128, 64, 512)])
def test_rope_cache(heads, nope, r, c, device) -> None:
    g = torch.Generator().manual_seed(heads)
    t = 4
    q = torch.randn(t, heads, nope + r, generator=g).to(device)
    kv = torch.randn(t, c + r, generator=g).to(device)
    pos = torch.tensor([0, 7, 100, 4095], device=device)
    slots = torch.tensor([5, 1, 9, 2], device=device)
    nw = torch.rand(c, generator=g).to(device)
    inv = (1.0 / (10000 ** (torch.arange(0, r, 2).float() / r))).to(device)
    c1 = torch.zeros(12, c + r, dtype=torch.bfloat16, device=device)
    c2 = torch.zeros(12, c + r, dtype=torch.float32, device=device)
    q1, q2 = q.clone(), q.clone()
    rope_cache(q1, kv, pos, slots, nw, inv, 1.1, 1e-6, c1, nope)
    rope_cache_ref(q2, kv, pos, slots, nw, inv, 1.1, 1e-6, c2, nope)
    assert rel_err(q1, q2) < 1e-5
    # one bf16 rounding of the fp32 reference (the interpreter truncates, GPUs round)
    assert ((c1.float() - c2).abs() <= c2.abs() * 2**-7 + 1e-30).all()
    assert (c1[[0, 3, 4, 6, 7, 8, 10, 11]] == 0).all()


def test_silu_mul(device) -> None:
    gu = torch.randn(3, 2 * 1500).to(device)
    assert rel_err(silu_mul(gu), silu_mul_ref(gu)) < 1e-6


@pytest.mark.parametrize("limit", [0.5, 1.0, 7.0])
def test_silu_mul_clamps_gate_and_up(limit: float, device) -> None:
    """DeepSeek-V4's clamped SwiGLU: gate clamped from above, up on both sides, before the
    activation; many entries (x3 scale) pass the limit."""
    gu = (3 * torch.randn(4, 2 * 1100)).to(device)
    assert rel_err(silu_mul(gu, limit=limit), silu_mul_ref(gu, limit)) < 1e-6
    assert rel_err(silu_mul(gu, limit=limit), silu_mul_ref(gu)) > 1e-2  # the clamp acted


ROUTERS = [  # experts, top-k, sigmoid, groups, groups kept, normalize
    (64, 6, False, 1, 1, False),  # V2-Lite
    (256, 8, True, 8, 4, True),  # V3
    (160, 6, False, 1, 1, False),  # V2
    (384, 8, True, 1, 1, True),  # Kimi-K2
    (32, 4, True, 4, 2, True),
]


@pytest.mark.parametrize("e,k,sigmoid,groups,kept,norm", ROUTERS)
def test_route(e, k, sigmoid, groups, kept, norm, device) -> None:
    g = torch.Generator().manual_seed(e)
    logits = torch.randn(9, e, generator=g).to(device)
    bias = (torch.randn(e, generator=g) * 0.1).to(device) if sigmoid else None
    w, ids = route(logits, bias, k, sigmoid, groups, kept, norm, 2.5)
    w_ref, ids_ref = route_ref(logits, bias, k, sigmoid, groups, kept, norm, 2.5)
    assert torch.equal(ids.cpu(), ids_ref.cpu())
    assert rel_err(w, w_ref) < 1e-6
