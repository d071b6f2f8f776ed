"""The vpdpbusd tiles: dot(exact weights, quantized x) to float32 rounding, 1 and 2 planes."""

from __future__ import annotations

import numpy as np
import pytest

from cpu_kernels import qtypes as qt
from cpu_kernels.q8_activations import Q8Activations, dequantize_ref
from cpu_kernels.random_blocks import random_matrix
from cpu_kernels.reference import dequantize, rel_error
from cpu_kernels.tile_dot import tile_dot

TYPES = [qt.Q4_K, qt.Q6_K, qt.Q8_0, qt.Q5_0]


@pytest.mark.parametrize("planes", [1, 2])
@pytest.mark.parametrize("qtype", TYPES, ids=qt.type_name)
def test_tile_is_exact_on_quantized_activations(qtype: int, planes: int) -> None:
    rng = np.random.default_rng(qtype * 10 + planes)
    block = qt.BLOCK_GEOMETRY[qtype][0]
    cols = block * int(rng.choice([1, 3]) if block == 256 else rng.choice([1, 7, 44]))
    w = random_matrix(rng, qtype, (1, 5, cols))
    x = (rng.standard_normal((6, cols)) * rng.uniform(0.01, 10)).astype(np.float32)
    act = Q8Activations.of(x, planes=planes)
    ref = dequantize_ref(act) @ dequantize(w).T  # [6, 5]
    empty = np.empty((6, 0), np.float32)
    for tokens, nt in [((4, 1, 2, 3), 4), ((5, 0, 2, 2), 3), ((3, 3, 3, 3), 1)]:
        got = np.empty((nt, 5), np.float32)
        for r in range(5):
            res = tile_dot(True, qtype, w.blocks[0, r], x, empty, act.xq, act.lo_offset, act.dx,
                           act.xqsum, act.xsum4, *tokens, nt)
            got[:, r] = res[:nt]
        err = rel_error(got, ref[list(tokens[:nt])])
        assert err <= 1e-5, f"{qt.type_name(qtype)} planes={planes} nt={nt}: {err:.2e}"


def test_two_planes_quantize_much_finer() -> None:
    x = np.random.default_rng(0).standard_normal((3, 256)).astype(np.float32)
    one = rel_error(dequantize_ref(Q8Activations.of(x, 1)).astype(np.float32), x.astype(float))
    two = rel_error(dequantize_ref(Q8Activations.of(x, 2)).astype(np.float32), x.astype(float))
    assert 1e-3 < one < 1e-2 and two < one / 100
