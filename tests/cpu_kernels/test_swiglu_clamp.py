"""DeepSeek-V4's clamped SwiGLU in every CPU experts kernel: exact, fast (VNNI), AMX where the
CPU has it, and the one-call layer driver, against the float64 reference and against
transformers' DeepseekV4Experts on the same weights; limit inf changes no bit."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from cpu_kernels.formats import qtypes as qt
from cpu_kernels.formats.random_blocks import random_experts
from cpu_kernels.formats.reference import dequantize, moe_forward_ref, rel_error, swiglu_ref
from cpu_kernels.moe import moe_forward
from cpu_kernels.simd.amx import HAS_AMX

FAST_TOL = 1e-2  # test_moe's
# with a clamp, fast mode's error grows against the smaller output: x's int8 rounding errs as
# much in sums the clamp cuts down (docs/model-files.md)
CLAMPED_FAST_TOL = 2 * FAST_TOL
H, I, E, K = 256, 256, 8, 2


def _experts(limit: float):
    rng = np.random.default_rng(3)
    experts = random_experts(rng, E, H, I, qt.Q4_K, qt.Q4_K, qt.Q8_0)
    return dataclasses.replace(experts, swiglu_limit=limit)


def _inputs(tokens: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, H)).astype(np.float32)  # [T, H]: many sums past 1.5
    ids = np.stack([rng.choice(E, K, replace=False) for _ in range(tokens)]).astype(np.int64)
    return x, ids, rng.random((tokens, K)).astype(np.float32)


def test_reference_clamps_gate_above_and_up_both_ways() -> None:
    g = np.array([-9.0, 0.5, 9.0])
    u = np.array([-9.0, 0.5, 9.0])
    want = np.minimum(g, 2) / (1 + np.exp(-np.minimum(g, 2))) * np.clip(u, -2, 2)
    np.testing.assert_allclose(swiglu_ref(g, u, 2.0), want)
    np.testing.assert_allclose(swiglu_ref(g, u, math.inf), g / (1 + np.exp(-g)) * u)


@pytest.mark.parametrize("mode,tokens,use_amx", [("exact", 5, False), ("fast", 5, False),
                                                 ("fast", 40, False), ("fast", 40, True)])
def test_kernels_clamp_as_the_reference(mode: str, tokens: int, use_amx: bool) -> None:
    if use_amx and not HAS_AMX:
        pytest.skip("this CPU has no AMX")
    limit = 1.5
    experts, plain = _experts(limit), _experts(math.inf)
    x, ids, w = _inputs(tokens)
    out = np.empty_like(x)
    moe_forward(x, ids, w, experts, out, mode=mode, use_amx=use_amx)
    ref = moe_forward_ref(x, ids, w, experts)
    assert rel_error(out, ref) <= (1e-5 if mode == "exact" else CLAMPED_FAST_TOL)
    # the clamp matters here: the unclamped MoE lies far from it
    assert rel_error(moe_forward_ref(x, ids, w, plain), ref) > 0.1


def test_no_limit_changes_no_bit() -> None:
    x, ids, w = _inputs(7, seed=1)
    a, b = np.empty_like(x), np.empty_like(x)
    moe_forward(x, ids, w, _experts(math.inf), a, mode="fast")
    moe_forward(x, ids, w, _experts(1e30), b, mode="fast")
    assert np.array_equal(a, b)


def test_equals_transformers_deepseek_v4_experts() -> None:
    """transformers' DeepseekV4Experts (gate and up fused, each expert's gate rows first) on the
    dequantized weights gives our exact MoE's result."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Experts

    limit = 1.5
    experts = _experts(limit)
    from transformers import DeepseekV4Config

    config = DeepseekV4Config(num_local_experts=E, hidden_size=H, intermediate_size=I,
                              hidden_act="silu", swiglu_limit=limit)
    module = DeepseekV4Experts(config).double()
    with torch.no_grad():
        for e in range(E):
            module.gate_up_proj[e] = torch.from_numpy(np.concatenate(
                [dequantize(experts.gate, e), dequantize(experts.up, e)]))
            module.down_proj[e] = torch.from_numpy(dequantize(experts.down, e))
        x, ids, w = _inputs(6, seed=2)
        want = module(torch.from_numpy(x).double(), torch.from_numpy(ids),
                      torch.from_numpy(w).double()).numpy()
    out = np.empty_like(x)
    moe_forward(x, ids, w, experts, out, mode="exact")
    assert rel_error(out, want) <= 1e-5
