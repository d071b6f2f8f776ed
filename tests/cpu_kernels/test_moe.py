"""Fused MoE forward against the float64 reference, over shapes, type mixes, T, K and threads."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from cpu_kernels.exact.routing import group_by_expert, route
from cpu_kernels.formats import qtypes as qt
from cpu_kernels.formats.random_blocks import random_experts
from cpu_kernels.formats.reference import moe_forward_ref, rel_error
from cpu_kernels.moe import busiest_expert, moe_forward

EXACT_TOL = 1e-5
# int8 x for gate/up: measured 0.5-0.8% per layer on random (centred) blocks
FAST_TOL = 1e-2

MIXES = {
    "q4_k_m": (qt.Q4_K, qt.Q4_K, qt.Q6_K),
    "q4_k": (qt.Q4_K, qt.Q4_K, qt.Q4_K),
    "lite_fallback": (qt.Q5_0, qt.Q5_0, qt.Q8_0),
    "q5_k_m": (qt.Q5_K, qt.Q5_K, qt.Q6_K),
    "legacy": (qt.Q4_0, qt.Q8_0, qt.BF16),
    "halves": (qt.F16, qt.BF16, qt.Q5_0),
    "q2_k": (qt.Q2_K, qt.Q2_K, qt.Q3_K),  # llama.cpp's Q2_K experts; packed in `fast` mode
    "low_unpacked": (qt.Q3_K, qt.Q2_K, qt.Q5_K),  # Q5_K has no packed layout: scalar `fast`
    # the i-quants: exact mode decodes rows (iquant_decode), fast mode packs every one
    # (packed_tiles_grid / packed_tiles_iq4; a layer mixed with an unpackable type decodes):
    # unsloth's UD-IQ1_S / UD-IQ1_M experts, and the other seven, each in one slot beside a
    # K-quant
    "ud_iq1_s": (qt.IQ1_S, qt.IQ1_S, qt.IQ2_XXS),
    "ud_iq1_m": (qt.IQ1_M, qt.IQ1_M, qt.IQ2_XXS),
    "iq2_iq3": (qt.IQ2_XS, qt.IQ2_S, qt.IQ3_XXS),
    "iq3_iq4": (qt.IQ3_S, qt.IQ4_XS, qt.Q4_K),
    "iq4_nl": (qt.Q8_0, qt.IQ4_NL, qt.IQ4_NL),
    "mxfp4": (qt.MXFP4, qt.MXFP4, qt.MXFP4),  # llama.cpp's MXFP4_MOE experts (DeepSeek-V4's)
}
# (T, K, E): T spread over 1..300, K over 1..8
CASES = [(1, 8, 12), (2, 6, 9), (5, 1, 4), (16, 8, 16), (33, 3, 5), (300, 4, 7)]


def _inputs(rng: np.random.Generator, num_tokens: int, top_k: int, num_experts: int,
            hidden: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = rng.standard_normal((num_tokens, hidden)).astype(np.float32)
    ids = np.stack([rng.choice(num_experts, top_k, replace=False) for _ in range(num_tokens)])
    weights = rng.random((num_tokens, top_k)).astype(np.float32)
    return x, ids, weights


@pytest.mark.parametrize("mode", ["exact", "fast"])
@pytest.mark.parametrize("mix", list(MIXES))
def test_moe_matches_reference(mix: str, mode: str) -> None:
    gate_t, up_t, down_t = MIXES[mix]
    k_block = 256 if qt.BLOCK_GEOMETRY[gate_t][0] == 256 else 32
    d_block = 256 if qt.BLOCK_GEOMETRY[down_t][0] == 256 else 32
    for i, (num_tokens, top_k, num_experts) in enumerate(CASES):
        rng = np.random.default_rng(1000 * i + len(mix))
        hidden = d_block * int(rng.choice([1, 3])) * (k_block // d_block if k_block > d_block else 1)
        inter = k_block * int(rng.choice([1, 2, 3])) if d_block == 256 else 32 * int(
            rng.choice([3, 5, 44]))
        if num_tokens == 300:  # keep the reference cheap at large T
            hidden, inter = max(hidden, 256) if k_block == 256 else 64, d_block
        experts = random_experts(rng, num_experts, hidden, inter, gate_t, up_t, down_t)
        x, ids, weights = _inputs(rng, num_tokens, top_k, num_experts, hidden)
        if i % 2:  # experts the GPU holds come as negative ids: skipped, never read
            ids = np.where(ids % 3 == 0, -1, ids)
        out = np.full_like(x, np.nan)
        numba.set_num_threads(1 + i % 2)
        moe_forward(x, ids, weights, experts, out, mode=mode)
        err = rel_error(out, moe_forward_ref(x, ids, weights, experts))
        tol = EXACT_TOL if mode == "exact" else FAST_TOL
        assert err <= tol, f"{mix} {mode} T={num_tokens} K={top_k} H={hidden} I={inter}: {err:.2e}"


def test_group_by_expert_covers_every_slot_once() -> None:
    ids = np.array([[3, 1], [1, 0], [3, 2]])
    weights = np.array([[0.5, 0.25], [1.0, 2.0], [3.0, 4.0]], np.float32)
    expert_ids, offsets, token_ids, w = group_by_expert(ids, weights)
    assert expert_ids.tolist() == [0, 1, 2, 3]
    assert offsets.tolist() == [0, 1, 3, 4, 6]
    assert token_ids.tolist() == [1, 0, 1, 2, 0, 2]
    assert w.tolist() == [2.0, 0.25, 1.0, 4.0, 0.5, 3.0]


def test_route_equals_group_by_expert() -> None:
    rng = np.random.default_rng(5)
    for num_tokens, top_k, num_experts in [(1, 1, 3), (7, 4, 9), (300, 8, 64), (9, 4, 9)]:
        ids = np.stack([rng.choice(num_experts, top_k, replace=False) for _ in range(num_tokens)])
        if num_tokens == 9:  # negative ids (experts held elsewhere) are left out
            ids = np.where(ids < 4, -1, ids)
        weights = rng.random(ids.shape).astype(np.float32)
        for got, want in zip(route(ids, weights, num_experts), group_by_expert(ids, weights)):
            np.testing.assert_array_equal(got, want)


def test_moe_rejects_bad_inputs() -> None:
    rng = np.random.default_rng(0)
    experts = random_experts(rng, 4, 64, 32, qt.Q8_0, qt.Q8_0, qt.Q8_0)
    x, ids, weights = _inputs(rng, 2, 2, 4, 64)
    out = np.empty_like(x)
    with pytest.raises(ValueError, match="expert ids outside"):
        moe_forward(x, ids + 4, weights, experts, out)
    out[:] = np.nan  # every slot held elsewhere: a zero row, nothing read
    moe_forward(x, np.full_like(ids, -1), weights, experts, out)
    assert (out == 0).all()
    with pytest.raises(ValueError, match="do not fit experts"):
        moe_forward(x[:, :32], ids, weights, experts, out[:, :32])
    with pytest.raises(ValueError, match="unknown mode"):
        moe_forward(x, ids, weights, experts, out, mode="turbo")


def test_busiest_expert_ignores_experts_held_elsewhere() -> None:
    """The AMX gate counts rows per expert; negative ids (held on the GPU) are no expert's."""
    assert busiest_expert(np.array([[2, -1], [2, 0], [-1, 2]])) == 3
    assert busiest_expert(np.full((4, 2), -1)) == 0
    assert busiest_expert(np.zeros((0, 6), np.int64)) == 0
