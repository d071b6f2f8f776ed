"""The operators' two kernel sets (hybrid/ops/kernel_sets/) against one float64 reference each,
over several shapes: torch's, and gpu_kernels' (on CUDA, else in Triton's interpreter)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from cpu_kernels.formats.random_blocks import random_rows
from gpu_kernels.dequant_ref import dequantize as dequantize_planes
from gpu_kernels.qformat import GpuQuant, to_planes
from hybrid.ops.kernel_sets import MLADims, TorchKernels
from hybrid.ops.kernel_sets.gpu_set import GpuKernels
from hybrid.ops.mla_torch import attend, causal_mask
from tests.gpu_kernels.conftest import rel_err

SETS = {"torch": TorchKernels(), "gpu_kernels": GpuKernels()}
TOL = 2e-5  # f32 arithmetic (tf32x3 tensor cores) against float64


class Held:
    """A weight as operators hold it (hybrid.ops.weights.Weight's interface): GGUF blocks as
    gpu_kernels planes (`quant`, one per source matrix) for gpu_kernels, dense for torch.
    `get()` is the combined matrix (an MLA-layout kv_b comes back in the legacy layout)."""

    def __init__(self, planes: list[GpuQuant], kernels: str, combined: torch.Tensor) -> None:
        self.fmt, self.device, self._raw = "gguf", combined.device, []
        self.quant = tuple(planes) if kernels == "gpu_kernels" else None
        self._dense = combined.float()

    def get(self) -> torch.Tensor:
        return self._dense


def planes(qtype: Q, rows: int, cols: int, seed: int, device) -> GpuQuant:
    raw = random_rows(np.random.default_rng(seed), int(qtype), rows, cols, 0.05)
    return to_planes(torch.from_numpy(raw.copy()), int(qtype), rows, cols).to(device)


def held(kernels: str, qtype: Q, rows: int, cols: int, seed: int, device) -> Held:
    p = planes(qtype, rows, cols, seed, device)
    return Held([p], kernels, dequantize_planes(p))


def randn(*shape: int, seed: int, device) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device)


@pytest.mark.parametrize("kernels", SETS)
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q8_0, Q.Q6_K, Q.BF16], ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 5])
def test_linear(kernels, qtype, m, device, wide_tiles) -> None:
    w = held(kernels, qtype, 24, 256, seed=m, device=device)
    x = randn(2, m, 256, seed=m, device=device)
    y = SETS[kernels].linear(x, w)
    assert y.shape == (2, m, 24)
    assert rel_err(y, x.double() @ w.get().double().T) < TOL


@pytest.mark.parametrize("kernels", SETS)
@pytest.mark.parametrize("deltas", [0, 1, 2, 3])
@pytest.mark.parametrize("h", [64, 200])
def test_add_rmsnorm(kernels, deltas, h, device) -> None:
    x, w = randn(3, h, seed=h, device=device), randn(h, seed=1, device=device)
    ds = tuple(randn(3, h, seed=10 + i, device=device) for i in range(deltas))
    summed = x.double() + sum((d.double() for d in ds), torch.zeros(3, h, dtype=torch.float64,
                                                                      device=device))
    normed, _ = SETS[kernels].add_rmsnorm(x, w, 1e-6, ds)
    expected = w.double() * summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert rel_err(x, summed) < 1e-6  # in place
    assert rel_err(normed, expected) < 1e-5
    assert rel_err(SETS[kernels].rmsnorm(x, w, 1e-6), expected) < 1e-5


@pytest.mark.parametrize("kernels", SETS)
@pytest.mark.parametrize("m", [1, 4])
def test_mlp(kernels, m, device, wide_tiles) -> None:
    h, inter = 256, 64
    gate, up = (planes(Q.Q4_K, inter, h, seed=s, device=device) for s in (1, 2))
    down = planes(Q.Q8_0, h, inter, seed=3, device=device)
    g, u, d = (dequantize_planes(p).double() for p in (gate, up, down))
    gate_up = GpuQuant(gate.qtype, 2 * inter, h, tuple(torch.cat([a, b]) for a, b in
                                                        zip(gate.planes, up.planes)))
    x = randn(m, h, seed=m, device=device)
    out = SETS[kernels].mlp(x, Held([gate], kernels, g), Held([up], kernels, u),
                            Held([down], kernels, d),
                            gate_up if kernels == "gpu_kernels" else None)
    xd = x.double()
    expected = (torch.nn.functional.silu(xd @ g.T) * (xd @ u.T)) @ d.T
    assert rel_err(out, expected) < TOL


@pytest.mark.parametrize("kernels", SETS)
@pytest.mark.parametrize("spec", [
    SimpleNamespace(num_experts_per_tok=6, scoring_func="softmax", n_group=1, topk_group=1,
                    norm_topk_prob=False, routed_scaling_factor=1.0),  # V2-Lite
    SimpleNamespace(num_experts_per_tok=8, scoring_func="sigmoid", n_group=8, topk_group=4,
                    norm_topk_prob=True, routed_scaling_factor=2.5)], ids=["v2", "v3"])
def test_route(kernels, spec, device) -> None:
    from gpu_kernels.reference import route_ref

    k = SETS[kernels]
    weight, x = randn(64, 128, seed=5, device=device), randn(7, 128, seed=6, device=device)
    bias = randn(64, seed=7, device=device) * 0.1 if spec.scoring_func == "sigmoid" else None
    logits, weights, ids = k.route(x, weight, k.router_matrix(weight), bias, spec)
    exact = x.double() @ weight.double().T
    w64, ids64 = route_ref(exact, None if bias is None else bias.double(),
                           spec.num_experts_per_tok, spec.scoring_func == "sigmoid",
                           spec.n_group, spec.topk_group, spec.norm_topk_prob,
                           spec.routed_scaling_factor)
    assert rel_err(logits, exact) < TOL
    order, order64 = ids.sort(-1), ids64.sort(-1)
    assert torch.equal(order.values.cpu(), order64.values.cpu())
    assert rel_err(weights.gather(1, order.indices), w64.gather(1, order64.indices)) < 1e-5


@pytest.mark.parametrize("kernels", SETS)
@pytest.mark.parametrize("heads, nope, r, c", [(2, 16, 8, 32), (5, 32, 16, 64)])
def test_rope_cache(kernels, heads, nope, r, c, device) -> None:
    from gpu_kernels.reference import rope_cache_ref

    t = 4
    q, kv = randn(t, heads, nope + r, seed=1, device=device), randn(t, c + r, seed=2,
                                                                    device=device)
    positions = torch.tensor([0, 3, 9, 100], device=device)
    slots = torch.tensor([5, 1, 7, 2], device=device)
    norm_w, inv_freq = randn(c, seed=3, device=device), 1.0 / (1e4 ** (
        torch.arange(0, r, 2, device=device).float() / r))
    cache = torch.zeros(8, c + r, device=device)
    q64, cache64 = q.double().clone(), cache.double().clone()
    SETS[kernels].rope_cache(q, kv, positions, slots, norm_w, inv_freq, 1.0, 1e-6, cache, nope)
    rope_cache_ref(q64, kv.double(), positions, slots, norm_w.double(), inv_freq.double(), 1.0,
                   1e-6, cache64, nope)
    assert rel_err(q, q64) < 1e-5 and rel_err(cache, cache64) < 1e-5


def kv_b_weight(kernels: str, split: bool, d: MLADims, device) -> tuple[Held, torch.Tensor]:
    """A kv_b in the legacy layout (one [h * (nope + v), c] matrix) or the MLA layout's two
    (k_b [h * c, nope], v_b [h * v, c]) -> (the weight, its [h, nope + v, c] float64)."""
    if not split:
        p = planes(Q.Q8_0, d.heads * (d.nope + d.v), d.kv_lora, seed=4, device=device)
        w = dequantize_planes(p)
        return Held([p], kernels, w), w.double().view(d.heads, d.nope + d.v, d.kv_lora)
    k_b = planes(Q.Q8_0, d.heads * d.kv_lora, d.nope, seed=5, device=device)
    v_b = planes(Q.Q8_0, d.heads * d.v, d.kv_lora, seed=6, device=device)
    w_uk = dequantize_planes(k_b).view(d.heads, d.kv_lora, d.nope).transpose(1, 2)
    w_uv = dequantize_planes(v_b).view(d.heads, d.v, d.kv_lora)
    legacy = torch.cat([w_uk, w_uv], dim=1)  # [h, nope + v, c]
    return Held([k_b, v_b], kernels, legacy.reshape(-1, d.kv_lora)), legacy.double()


@pytest.mark.parametrize("kernels", SETS)
@pytest.mark.parametrize("split", [False, True], ids=["legacy", "mla-layout"])
def test_absorb_and_values(kernels, split, device, wide_tiles) -> None:
    d = MLADims(heads=3, nope=32, rope=16, v=32, kv_lora=64)
    kv_b, w = kv_b_weight(kernels, split, d, device)
    q_nope, o_lat = randn(2, 3, 32, seed=8, device=device), randn(2, 3, 64, seed=9,
                                                                  device=device)
    q_lat = SETS[kernels].absorb(q_nope, kv_b, d)
    assert rel_err(q_lat, torch.einsum("nhk,hkc->nhc", q_nope.double(), w[:, :d.nope])) < TOL
    o = SETS[kernels].values(o_lat, kv_b, d)
    assert rel_err(o, torch.einsum("nhc,hvc->nhv", o_lat.double(), w[:, d.nope:])) < TOL


@pytest.mark.parametrize("kernels", SETS)
@pytest.mark.parametrize("split", [False, True], ids=["legacy", "mla-layout"])
def test_prefill_attention(kernels, split, device, wide_tiles) -> None:
    """Two prompt chunks, one after a cached prefix, causal over their keys."""
    d = MLADims(heads=2, nope=32, rope=16, v=32, kv_lora=64)
    kv_b, w = kv_b_weight(kernels, split, d, device)
    cache = randn(24, d.kv_lora + d.rope, seed=10, device=device)
    spans = [(0, 3, 5, torch.tensor([7, 8, 9, 10, 11])), (3, 4, 4, torch.tensor([1, 2, 3, 4]))]
    slots = torch.cat([s[3] for s in spans]).to(device)
    meta = torch.tensor([[0, 3, 5, 0], [3, 4, 4, 5]], device=device)
    fb = SimpleNamespace(
        prefill_spans=[SimpleNamespace(q_start=a, q_len=n, kv_len=kv, kv_slots=s.to(device))
                       for a, n, kv, s in spans],
        prefill_index=lambda: (meta, slots, 4))
    q = randn(7, d.heads, d.nope + d.rope, seed=11, device=device)
    out = torch.zeros(7, d.heads, d.v, device=device)
    SETS[kernels].prefill_attention(q, cache, fb, kv_b, d, 0.1, out)
    for a, n, kv, s in spans:
        rows = slice(a, a + n)
        keys = cache[s.to(device)].double()
        q_lat = torch.einsum("thk,hkc->thc", q[rows, :, :d.nope].double(), w[:, :d.nope])
        o_lat = attend(q_lat, q[rows, :, d.nope:].double(), keys,
                       causal_mask(n, kv, device), 0.1)
        expected = torch.einsum("thc,hvc->thv", o_lat, w[:, d.nope:])
        assert rel_err(out[rows], expected) < 1e-3  # fp16 operands in the flash kernel


@pytest.mark.parametrize("kernels", SETS)
def test_embedding(kernels, device) -> None:
    table = held(kernels, Q.Q8_0, 50, 64, seed=12, device=device)
    ids = torch.tensor([3, 0, 49, 3], device=device)
    out = SETS[kernels].embedding(ids, table, 64)
    assert rel_err(out, table.get().double()[ids]) < 1e-6
