"""The AMX bf16 kernel: its weight tiles are the exact weights rounded to bf16, and its MoE equals
a float64 MoE on bf16-rounded x, weights and h."""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest

from cpu_kernels.amx.amx_bf16_moe import TILE_CONFIG_BF16, amx_bf16_moe_kernel, runs_on_amx
from cpu_kernels.amx.amx_bf16_tiles import bf16_weight_tiles, to_bf16
from cpu_kernels.fast.packed import PackedMatrix, pack
from cpu_kernels.fast.tile_set import KQUANT_TILES
from cpu_kernels.formats import qtypes as qt
from cpu_kernels.formats.random_blocks import random_experts, random_matrix
from cpu_kernels.formats.reference import dequantize, moe_forward_ref, rel_error
from cpu_kernels.moe import moe_forward
from cpu_kernels.simd.amx import HAS_AMX

pytestmark = pytest.mark.skipif(not HAS_AMX, reason="this CPU has no AMX (or Linux refused it)")

# (H, I, E, gate/up type, down type): Q4_K_M's two down types, V2-Lite's Q5_0/Q8_0 (I not a
# multiple of 256), a Q3_K down (no bf16 tiles: VNNI in the same call)
CASES = [(512, 256, 6, qt.Q4_K, qt.Q6_K), (768, 512, 9, qt.Q4_K, qt.Q4_K),
         (256, 352, 5, qt.Q5_0, qt.Q8_0), (512, 256, 4, qt.Q4_K, qt.Q3_K)]


def _bf16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to bf16 (nearest even), as float64."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def _moe_bf16_ref(x, ids, w, experts, down_bf16: bool) -> np.ndarray:
    """float64 MoE on bf16-rounded x, weights and h (down's weights and h exact if not
    down_bf16)."""
    out = np.zeros(x.shape)
    for e in np.unique(ids):
        rows, ks = np.nonzero(ids == e)
        xe = _bf16(x[rows])
        g = xe @ _bf16(dequantize(experts.gate, e)).T
        u = xe @ _bf16(dequantize(experts.up, e)).T
        h = w[rows, ks, None] * g / (1 + np.exp(-g)) * u
        d = dequantize(experts.down, e).astype(np.float64)
        out[rows] += (_bf16(h) @ _bf16(d).T) if down_bf16 else h @ d.T
    return out


def _route(rng, num_tokens, top_k, num_experts):
    top_k = min(top_k, num_experts)
    ids = np.stack([rng.choice(num_experts, top_k, replace=False) for _ in range(num_tokens)])
    return ids.astype(np.int64), rng.random(ids.shape).astype(np.float32)


@pytest.mark.parametrize("qtype,cols", [(qt.Q4_K, 512), (qt.Q6_K, 768), (qt.Q8_0, 96),
                                        (qt.Q5_0, 160)], ids=lambda v: str(v))
def test_weight_tiles_are_the_rounded_exact_weights(qtype, cols) -> None:
    rng = np.random.default_rng(cols)
    w = random_matrix(rng, qtype, (2, 20, cols))  # 3 row groups: the last pairs with itself
    pk = PackedMatrix.of(w).data[1]
    exact = np.zeros((24, cols), np.float32)
    exact[:20] = dequantize(w, 1)
    for ga, gb in [(0, 1), (2, 2)]:
        buf = np.zeros(cols * 32, np.uint8)
        bf16_weight_tiles(qtype, pk[ga], pk[gb], cols, buf)
        # tile t, pair row p, weight row n, h -> column 32t + 2p + h of row n
        got = buf.view(np.uint16).reshape(cols // 32, 16, 16, 2).transpose(2, 0, 1, 3)
        got = (got.reshape(16, cols).astype(np.uint32) << 16).view(np.float32)
        rows = [8 * ga + r for r in range(8)] + [8 * gb + r for r in range(8)]
        np.testing.assert_array_equal(got, _bf16(exact[rows]).astype(np.float32))


def test_to_bf16_rounds_to_nearest_even() -> None:
    x = np.array([1.0, 1.00390625, 1.01171875, -2.5e-3, 3.0e38, 0.0], np.float32)
    got = np.empty(x.shape, np.uint16)
    to_bf16(x, got)
    np.testing.assert_array_equal((got.astype(np.uint32) << 16).view(np.float32),
                                  _bf16(x).astype(np.float32))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"H{c[0]}-I{c[1]}-{qt.type_name(c[4])}")
def test_amx_equals_bf16_reference(case) -> None:
    hidden, inter, num_experts, gate_up, down = case
    rng = np.random.default_rng(hidden + inter)
    experts = random_experts(rng, num_experts, hidden, inter, gate_up, gate_up, down)
    pk = pack(experts).packed
    stamps = np.zeros(2, np.int64)
    for num_tokens, top_k, min_tokens, threads in [(1, 1, 1, 1), (13, 3, 1, 2), (40, 4, 8, 2),
                                                    (300, 8, 8, 2), (70, 2, 1, 1)]:
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        x = (rng.standard_normal((num_tokens, hidden)) * rng.uniform(0.1, 3)).astype(np.float32)
        ids, w = _route(rng, num_tokens, top_k, num_experts)
        got = np.empty_like(x)
        amx_bf16_moe_kernel(KQUANT_TILES, pk.gate.qtype, pk.gate.data, pk.up.qtype, pk.up.data,
                            pk.down.qtype, pk.down.data, x, ids, w, math.inf, got, stamps,
                            TILE_CONFIG_BF16, min_tokens, numba.get_num_threads())
        where = f"T={num_tokens} K={top_k} min_tokens={min_tokens}"
        # fast mode's stated tolerance, with some experts on VNNI (min_tokens 8) or none
        assert rel_error(got, moe_forward_ref(x, ids, w, experts)) <= 1e-2, where
        if min_tokens == 1 and down != qt.Q3_K:  # every product on AMX: bf16 math exactly
            # float32 sums vs float64: h's bf16 rounding may flip a few last bits
            assert rel_error(got, _moe_bf16_ref(x, ids, w, experts, True)) <= 1e-4, where


def test_fast_mode_runs_amx_within_tolerance() -> None:
    rng = np.random.default_rng(7)
    experts = random_experts(rng, 8, 512, 256, qt.Q4_K, qt.Q4_K, qt.Q6_K)
    assert runs_on_amx(qt.Q4_K, qt.Q4_K, qt.Q6_K)
    assert not runs_on_amx(qt.Q2_K, qt.Q3_K, qt.Q3_K)
    x = rng.standard_normal((64, 512)).astype(np.float32)
    ids, w = _route(rng, 64, 6, 8)  # ~48 tokens per expert: every expert on AMX
    amx, vnni = np.empty_like(x), np.empty_like(x)
    moe_forward(x, ids, w, experts, amx, mode="fast")
    moe_forward(x, ids, w, experts, vnni, mode="fast", use_amx=False)
    ref = moe_forward_ref(x, ids, w, experts)
    assert rel_error(amx, _moe_bf16_ref(x, ids, w, experts, True)) <= 1e-4
    # bf16 (8 mantissa bits on x, h and the weights) errs less than VNNI's int8 x
    assert rel_error(amx, ref) <= 1e-2
    assert rel_error(amx, ref) < rel_error(vnni, ref)


def test_experts_held_elsewhere_are_skipped_on_amx() -> None:
    """Negative ids (experts held on the GPU) in a step that takes AMX: those slots add
    nothing, as in the VNNI kernel."""
    rng = np.random.default_rng(8)
    experts = random_experts(rng, 8, 512, 256, qt.Q4_K, qt.Q4_K, qt.Q6_K)
    x = rng.standard_normal((64, 512)).astype(np.float32)
    ids, w = _route(rng, 64, 6, 8)
    held = ids == 3  # expert 3 lives elsewhere
    amx = np.empty_like(x)
    moe_forward(x, np.where(held, -1, ids), w, experts, amx, mode="fast")
    ref = moe_forward_ref(x, ids, np.where(held, 0.0, w).astype(np.float32), experts)
    assert rel_error(amx, ref) <= 1e-2
