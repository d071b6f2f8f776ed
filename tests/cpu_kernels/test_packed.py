"""Packed (row-interleaved) weights: tiles exact on quantized activations, MoE equal to the blocks'."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from cpu_kernels.fast.packed import PackedMatrix, pack
from cpu_kernels.fast.q8_activations import Q8Activations, dequantize_ref
from cpu_kernels.fast.tile_set import packed_tile  # every packed type
from cpu_kernels.formats import qtypes as qt
from cpu_kernels.formats.random_blocks import random_blocks, random_experts, random_matrix
from cpu_kernels.formats.reference import dequantize, moe_forward_ref, rel_error
from cpu_kernels.formats.weights import QuantMatrix
from cpu_kernels.moe import moe_forward

TYPES = [qt.Q4_K, qt.Q6_K, qt.Q8_0, qt.Q5_0, qt.Q2_K, qt.Q3_K, qt.IQ2_XXS, qt.IQ2_XS, qt.IQ2_S,
         qt.IQ3_XXS, qt.IQ3_S, qt.IQ1_S, qt.IQ1_M, qt.IQ4_XS, qt.IQ4_NL, qt.MXFP4]


@pytest.mark.parametrize("qtype", TYPES, ids=qt.type_name)
def test_packed_tile_is_exact_on_quantized_activations(qtype: int) -> None:
    for planes in (1, 2):
        rng = np.random.default_rng(qtype * 10 + planes)
        block = qt.BLOCK_GEOMETRY[qtype][0]
        cols = block * int(rng.choice([1, 3]) if block == 256 else rng.choice([1, 7, 44]))
        rows = int(rng.integers(1, 40))  # not a multiple of 8: the last group is padded
        w = random_matrix(rng, qtype, (2, rows, cols))
        packed = PackedMatrix.of(w)
        x = (rng.standard_normal((6, cols)) * rng.uniform(0.01, 10)).astype(np.float32)
        act = Q8Activations.of(x, planes=planes)
        ref = dequantize_ref(act) @ dequantize(w, 1).T  # [6, rows]
        res = np.empty(64, np.float32)
        groups = packed.data.shape[1]
        for tokens, nt in [((4, 1, 2, 3), 4), ((5, 0, 2, 2), 3), ((3, 3, 3, 3), 1), ((1, 0, 0, 0), 2)]:
            got = np.empty((nt, groups * 8), np.float32)
            for ga in range(0, groups, 2):  # 16-row tiles; an odd last group pairs with itself
                gb = min(ga + 1, groups - 1)
                packed_tile(qtype, packed.data[1, ga], packed.data[1, gb], act.xq, act.lo_offset,
                            act.dx, act.xqsum, act.xsum16.reshape(-1), *tokens, nt, res)
                tile = res.reshape(4, 16)[:nt]
                got[:, 8 * ga:8 * gb + 8] = tile[:, :8 * (gb - ga + 1)]
                if gb == ga:
                    np.testing.assert_array_equal(tile[:, 8:], tile[:, :8])
            err = rel_error(got[:, :rows], ref[list(tokens[:nt])])
            assert err <= 1e-5, f"{qt.type_name(qtype)} planes={planes} nt={nt}: {err:.2e}"


MIXES = [(qt.Q4_K, qt.Q4_K, qt.Q6_K), (qt.Q4_K, qt.Q4_K, qt.Q4_K), (qt.Q5_0, qt.Q5_0, qt.Q8_0),
         (qt.Q8_0, qt.Q6_K, qt.Q5_0), (qt.Q4_K, qt.Q3_K, qt.Q2_K), (qt.IQ1_S, qt.IQ1_S, qt.IQ2_XXS),
         (qt.IQ2_XS, qt.IQ3_S, qt.IQ1_M), (qt.IQ3_XXS, qt.IQ2_S, qt.IQ3_XXS),
         (qt.IQ4_XS, qt.IQ4_XS, qt.IQ4_NL), (qt.MXFP4, qt.MXFP4, qt.MXFP4)]


@pytest.mark.parametrize("mix", MIXES, ids=lambda m: "-".join(map(qt.type_name, m)))
def test_packed_moe_matches_reference(mix: tuple[int, int, int]) -> None:
    k_block = max(qt.BLOCK_GEOMETRY[mix[0]][0], qt.BLOCK_GEOMETRY[mix[1]][0])
    d_block = qt.BLOCK_GEOMETRY[mix[2]][0]
    for i, (num_tokens, top_k, num_experts) in enumerate([(1, 8, 10), (3, 2, 5), (45, 6, 9)]):
        rng = np.random.default_rng(100 * i + mix[2])
        hidden = k_block * int(rng.choice([1, 3]))
        inter = d_block * int(rng.choice([1, 2])) + (0 if d_block == 256 else 32 * 3)
        experts = random_experts(rng, num_experts, hidden, inter, *mix)
        x = rng.standard_normal((num_tokens, hidden)).astype(np.float32)
        ids = np.stack([rng.choice(num_experts, top_k, replace=False) for _ in range(num_tokens)])
        weights = rng.random((num_tokens, top_k)).astype(np.float32)
        out = np.full_like(x, np.nan)
        numba.set_num_threads(1 + i % 2)
        moe_forward(x, ids, weights, experts, out, mode="fast")
        assert experts.packed is not None  # fast mode packed them
        err = rel_error(out, moe_forward_ref(x, ids, weights, experts))
        assert 1e-4 < err < 1e-2, f"T={num_tokens} K={top_k} H={hidden} I={inter}: {err:.2e}"


def test_packed_bytes_stay_near_gguf_bytes() -> None:
    rng = np.random.default_rng(3)
    for qtype, limit in [(qt.Q4_K, 1.06), (qt.Q6_K, 1.01), (qt.Q8_0, 1.06), (qt.Q5_0, 1.1),
                         (qt.Q2_K, 1.05), (qt.Q3_K, 1.06), (qt.IQ2_XXS, 1.1), (qt.IQ2_XS, 1.03),
                         (qt.IQ2_S, 1.03), (qt.IQ3_XXS, 1.07), (qt.IQ3_S, 1.02), (qt.IQ1_S, 1.04),
                         (qt.IQ1_M, 1.08), (qt.IQ4_XS, 1.03), (qt.IQ4_NL, 1.12),
                         (qt.MXFP4, 1.0)]:
        w = random_matrix(rng, qtype, (2, 16, 512))
        assert PackedMatrix.of(w).nbytes <= limit * w.nbytes, qt.type_name(qtype)


def test_pack_keeps_unpackable_types_on_blocks() -> None:
    rng = np.random.default_rng(0)
    experts = random_experts(rng, 2, 256, 64, qt.Q5_K, qt.Q5_K, qt.BF16)
    assert pack(experts) is experts and experts.packed is None


def test_weights_reach_the_kernels_read_only_whatever_made_them() -> None:
    """numba compiles a read-only array as a type of its own: a file's weights (mapped
    read-only) and weights made in memory (synthetic, packed) must be the same type, or every
    kernel compiles twice. The caller's own array stays writable."""
    rng = np.random.default_rng(0)
    raw = random_blocks(rng, qt.Q4_K, (2, 16, 512))
    w = QuantMatrix(qt.Q4_K, (2, 16, 512), raw)
    assert raw.flags.writeable and not w.blocks.flags.writeable
    assert np.shares_memory(raw, w.blocks)
    packed = PackedMatrix.of(w)
    assert not packed.data.flags.writeable
    assert not numba.typeof(w.blocks).mutable and not numba.typeof(packed.data).mutable
