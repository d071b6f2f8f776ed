"""The AMX gate/up kernel: the same integers as the VNNI kernel, so the same MoE up to float32 order."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from cpu_kernels import qtypes as qt
from cpu_kernels.amx import HAS_AMX
from cpu_kernels.amx_moe import TILE_CONFIG, amx_moe_kernel, runs_on_amx
from cpu_kernels.moe import moe_forward
from cpu_kernels.packed_moe import packed_moe_kernel
from cpu_kernels.random_blocks import random_experts
from cpu_kernels.reference import moe_forward_ref, rel_error

pytestmark = pytest.mark.skipif(not HAS_AMX, reason="this CPU has no AMX (or Linux refused it)")

# (H, I, E, down type): Q4_K_M's two down types, V2-Lite's Q8_0 down (I not a multiple of 256)
CASES = [(512, 256, 6, qt.Q6_K), (768, 512, 9, qt.Q4_K), (256, 352, 5, qt.Q8_0),
         (1280, 256, 16, qt.Q6_K)]


def _route(rng, num_tokens, top_k, num_experts):
    top_k = min(top_k, num_experts)
    ids = np.stack([rng.choice(num_experts, top_k, replace=False) for _ in range(num_tokens)])
    return ids.astype(np.int64), rng.random(ids.shape).astype(np.float32)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"H{c[0]}-I{c[1]}-{qt.type_name(c[3])}")
def test_amx_equals_vnni(case) -> None:
    hidden, inter, num_experts, down = case
    rng = np.random.default_rng(hidden + inter)
    pk = random_experts(rng, num_experts, hidden, inter, qt.Q4_K, qt.Q4_K, down).pack().packed
    stamps = np.zeros(2, np.int64)
    for num_tokens, top_k, min_tokens, threads in [(1, 1, 1, 1), (13, 3, 1, 2), (40, 4, 12, 2),
                                                    (300, 8, 12, 2), (33, 8, 16, 1)]:
        x = (rng.standard_normal((num_tokens, hidden)) * rng.uniform(0.1, 3)).astype(np.float32)
        ids, w = _route(rng, num_tokens, top_k, num_experts)
        want, got = np.empty_like(x), np.empty_like(x)
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        packed_moe_kernel(pk.gate.qtype, pk.gate.data, pk.up.qtype, pk.up.data, pk.down.qtype,
                          pk.down.data, x, ids, w, want, stamps)
        amx_moe_kernel(pk.gate.data, pk.up.data, pk.down.qtype, pk.down.data, x, ids, w, got,
                       stamps, TILE_CONFIG, min_tokens)
        err = rel_error(got, want)
        # equal integers; h differs by float32 order, so its int16 rounding may flip a few units
        assert err <= 1e-5, f"T={num_tokens} K={top_k} min_tokens={min_tokens}: {err:.2e}"


def test_fast_mode_runs_amx_within_tolerance() -> None:
    rng = np.random.default_rng(7)
    experts = random_experts(rng, 8, 512, 256, qt.Q4_K, qt.Q4_K, qt.Q6_K)
    assert runs_on_amx(qt.Q4_K, qt.Q4_K) and not runs_on_amx(qt.Q5_0, qt.Q5_0)
    x = rng.standard_normal((64, 512)).astype(np.float32)
    ids, w = _route(rng, 64, 6, 8)  # ~48 tokens per expert: every expert on AMX
    amx, vnni = np.empty_like(x), np.empty_like(x)
    moe_forward(x, ids, w, experts, amx, mode="fast")
    moe_forward(x, ids, w, experts, vnni, mode="fast", use_amx=False)
    assert rel_error(amx, vnni) <= 1e-5
    assert rel_error(amx, moe_forward_ref(x, ids, w, experts)) <= 1e-2
