"""Quantized matmul kernels against gguf-py dequantization + float64 math."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from cpu_kernels.exact.matmul import quant_matmul
from cpu_kernels.formats import qtypes as qt
from cpu_kernels.formats.random_blocks import random_matrix
from cpu_kernels.formats.reference import matmul_ref, rel_error
from cpu_kernels.formats.weights import QuantMatrix

EXACT_TOL = 1e-5
# int8 activations per 32-group: measured 0.4-0.8% per product on random blocks
FAST_TOL = 1e-2
TYPES = [qt.Q4_K, qt.Q5_K, qt.Q6_K, qt.Q8_0, qt.Q4_0, qt.Q5_0, qt.BF16, qt.F16, qt.Q2_K, qt.Q3_K,
         *qt.TABLE_CODED]


def _cols(rng: np.random.Generator, qtype: int) -> int:
    block = max(qt.BLOCK_GEOMETRY[qtype][0], 32)
    return block * int(rng.choice([1, 3, 5] if block == 256 else [1, 7, 13, 44]))


@pytest.mark.parametrize("mode", ["exact", "fast"])
@pytest.mark.parametrize("qtype", TYPES, ids=qt.type_name)
def test_matmul_matches_reference(qtype: int, mode: str) -> None:
    for seed in range(3):
        rng = np.random.default_rng(seed * 100 + qtype)
        rows, cols, n = int(rng.integers(1, 70)), _cols(rng, qtype), int(rng.choice([1, 3, 17]))
        w = random_matrix(rng, qtype, (2, rows, cols))
        x = rng.standard_normal((n, cols)).astype(np.float32)
        out = np.full((n, rows), np.nan, np.float32)
        numba.set_num_threads(1 + seed % 2)
        quant_matmul(x, w, out, expert=1, mode=mode)
        err = rel_error(out, matmul_ref(x, w, expert=1))
        tol = EXACT_TOL if mode == "exact" or qtype in (qt.BF16, qt.F16) else FAST_TOL
        assert err <= tol, f"{qt.type_name(qtype)} {mode} {rows}x{cols} n={n}: {err:.2e}"


def test_fast_mode_differs_from_exact() -> None:
    # guards against `fast` silently running the exact kernels
    rng = np.random.default_rng(7)
    w = random_matrix(rng, qt.Q4_K, (1, 8, 256))
    x = rng.standard_normal((1, 256)).astype(np.float32)
    exact, fast = np.empty((1, 8), np.float32), np.empty((1, 8), np.float32)
    quant_matmul(x, w, exact, mode="exact")
    quant_matmul(x, w, fast, mode="fast")
    assert 0 < rel_error(fast, exact.astype(np.float64)) < FAST_TOL


def test_rejects_bad_shapes_and_modes() -> None:
    rng = np.random.default_rng(0)
    w = random_matrix(rng, qt.Q8_0, (1, 4, 64))
    with pytest.raises(ValueError, match="does not fit"):
        quant_matmul(np.zeros((1, 32), np.float32), w, np.zeros((1, 4), np.float32))
    with pytest.raises(ValueError, match="unknown mode"):
        quant_matmul(np.zeros((1, 64), np.float32), w, np.zeros((1, 4), np.float32), mode="x")
    with pytest.raises(ValueError, match="not whole blocks"):
        QuantMatrix.from_raw(qt.Q4_K, (4, 128), np.zeros(4 * 72, np.uint8))
    with pytest.raises(ValueError, match="needs 136 bytes"):
        QuantMatrix.from_raw(qt.Q8_0, (2, 64), np.zeros(100, np.uint8))


def test_from_raw_views_gguf_bytes_without_copy() -> None:
    raw = np.zeros(3 * 4 * 34 * 2, np.uint8)
    w = QuantMatrix.from_raw(qt.Q8_0, (3, 4, 64), raw)
    assert w.blocks.shape == (3, 4, 68) and np.shares_memory(w.blocks, raw)
    f16 = np.zeros((2, 32), np.float16)
    assert QuantMatrix.from_raw(qt.F16, (2, 32), f16).blocks.shape == (1, 2, 64)
