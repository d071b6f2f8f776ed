"""Fused small operators and the router against their torch references; the norm that waits for
the CPU experts' answer and reads it itself, and the router that writes the hand-over and
raises its flag, against the same launches without them."""

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
from gpu_kernels.handshake import Awaited, Handover
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


def _pinned(t: torch.Tensor) -> torch.Tensor:
    return t.pin_memory() if torch.cuda.is_available() else t


def _awaited(src: torch.Tensor, flag: int, seq: int, device) -> Awaited:
    flags = _pinned(torch.tensor([0, flag, 0], dtype=torch.int64))
    error = _pinned(torch.zeros(1, dtype=torch.int32))
    return Awaited(src, torch.empty(src.shape, device=device), flags, 1,
                   torch.tensor([seq], device=device), error)


@pytest.mark.parametrize("h,rows", [(64, 1), (2048, 1), (2048, 3), (7168, 2)])
def test_add_rmsnorm_awaiting_the_host(h: int, rows: int, device) -> None:
    """The host's rows (pinned, more than the step's) waited for and read by the norm's own
    launch: the same x, normed rows and codes as the delta on the device; bit-equal."""
    g = torch.Generator().manual_seed(h + rows)
    x, d = (torch.randn(rows, h, generator=g).to(device) for _ in range(2))
    host = _pinned(torch.randn(rows + 2, h, generator=g))
    w = torch.rand(h, generator=g).to(device)
    xq, xq_ref = empty_xq(rows, h, 16, device), empty_xq(rows, h, 16, device)
    awaited = _awaited(host, 5, 5, device)
    x1, x2 = x.clone(), x.clone()
    y = add_rmsnorm(x1, w, 1e-6, d, out=None, xq=xq, awaited=awaited)
    y_ref = add_rmsnorm(x2, w, 1e-6, d, host[:rows].to(device), xq=xq_ref)
    assert torch.equal(y, y_ref) and torch.equal(x1, x2) and torch.equal(xq.q, xq_ref.q)
    assert int(awaited.error[0]) == 0
    got = awaited.resolve()  # the two-launch form: wait, then fetch
    assert torch.equal(got.cpu(), host) and int(awaited.error[0]) == 0


def test_add_rmsnorm_names_a_flag_that_never_came(device, monkeypatch) -> None:
    from gpu_kernels import fused

    monkeypatch.setattr(fused, "MAX_SPINS", 20)
    x, d = torch.ones(1, 64, device=device), torch.ones(1, 64, device=device)
    awaited = _awaited(_pinned(torch.ones(1, 64)), 4, 5, device)
    add_rmsnorm(x, torch.ones(64, device=device), 1e-6, d, awaited=awaited)
    assert int(awaited.error[0]) == 2  # index 1 + 1
    with pytest.raises(ValueError, match="awaits host rows"):
        add_rmsnorm(x, torch.ones(64, device=device), 1e-6, d, d, awaited=awaited)


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


@pytest.mark.parametrize("heads,nope,r,c", [(5, 16, 8, 32), (16, 128, 64, 512),
                                           (40, 16, 8, 32), (128, 128, 64, 512)])
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


# the last: groups the kernel cannot take (route_ref's choice, then the copies and the flag)
@pytest.mark.parametrize("e,k,sigmoid,groups,kept,norm",
                         [ROUTERS[0], ROUTERS[1], ROUTERS[4], (40, 4, True, 5, 2, True)])
@pytest.mark.parametrize("rows", [1, 3, 0])
def test_route_sends_to_the_host(e, k, sigmoid, groups, kept, norm, rows, device) -> None:
    """With a Handover the router's launch also writes the rows, ids and weights into pinned
    memory and raises the flag once every program wrote (its counter back at 0), twice in a
    row; the choices equal the launch without it."""
    g = torch.Generator().manual_seed(e + rows)
    logits = torch.randn(rows, e, generator=g).to(device)
    bias = (torch.randn(e, generator=g) * 0.1).to(device) if sigmoid else None
    h = 2100  # not a multiple of the copy's block
    to = Handover(_pinned(torch.zeros(4, h)), _pinned(torch.zeros(4, k, dtype=torch.int64)),
                  _pinned(torch.zeros(4, k)), _pinned(torch.zeros(2, dtype=torch.int64)), 1,
                  torch.tensor([0], device=device),
                  torch.zeros(1, dtype=torch.int32, device=device))
    for seq in (7, 8):
        to.seq.fill_(seq)
        x = torch.randn(rows, h, generator=g).to(device)
        w, ids = route(logits, bias, k, sigmoid, groups, kept, norm, 2.5, send=(x, to))
        w_ref, ids_ref = route(logits, bias, k, sigmoid, groups, kept, norm, 2.5)
        if device.type == "cuda":
            torch.cuda.synchronize()
        assert torch.equal(ids, ids_ref) and torch.equal(w, w_ref)
        assert torch.equal(to.ids[:rows], ids.cpu()) and torch.equal(to.weights[:rows], w.cpu())
        assert torch.equal(to.x[:rows], x.cpu())
        assert to.flags.tolist() == [0, seq] and int(to.counter[0]) == 0
    with pytest.raises(ValueError, match="host buffers"):
        route(torch.zeros(5, e, device=device), bias, k, sigmoid, groups, kept, norm, 2.5,
              send=(torch.zeros(5, h, device=device), to))
