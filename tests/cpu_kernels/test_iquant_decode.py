"""Decoded i-quant rows (iquant_decode) and their SIMD dots against gguf-py and float64 math."""

from __future__ import annotations

import numpy as np
import pytest

from cpu_kernels.exact.iquant_decode import decode_row, dot_decoded, dot_decoded_q8
from cpu_kernels.formats import qtypes as qt
from cpu_kernels.formats.random_blocks import random_matrix
from cpu_kernels.formats.reference import dequantize


def _decoded(qtype: int, row: np.ndarray, cols: int) -> tuple[np.ndarray, np.ndarray]:
    w64 = np.zeros(cols // 8, np.uint64)
    sc16 = np.zeros(cols // 16, np.float32)
    decode_row(qtype, row, w64, sc16)
    return w64, sc16


@pytest.mark.parametrize("qtype", qt.TABLE_CODED, ids=qt.type_name)
def test_decoded_rows_are_gguf_py_weights(qtype: int) -> None:
    rng = np.random.default_rng(qtype)
    for cols in (256, 768, 2048):
        w = random_matrix(rng, qtype, (1, 5, cols))
        ref = dequantize(w).astype(np.float32)  # gguf-py, fp32 products
        for r in range(5):
            w64, sc16 = _decoded(qtype, w.blocks[0, r], cols)
            ours = w64.view(np.int8).astype(np.float32) * np.repeat(sc16, 16)
            np.testing.assert_array_equal(ours, ref[r])


@pytest.mark.parametrize("qtype", qt.TABLE_CODED, ids=qt.type_name)
def test_decoded_dots_match_float64(qtype: int) -> None:
    rng = np.random.default_rng(100 + qtype)
    for cols in (256, 1536, 7168):
        w = random_matrix(rng, qtype, (1, 3, cols))
        ref_w = dequantize(w)
        x = rng.standard_normal(cols).astype(np.float32)
        dx = (np.abs(x).reshape(-1, 32).max(1) / 127).astype(np.float32)
        xq = np.rint(x.reshape(-1, 32) / dx[:, None]).astype(np.int8).reshape(-1)
        xr = (xq.reshape(-1, 32) * dx[:, None].astype(np.float64)).reshape(-1)
        for r in range(3):
            w64, sc16 = _decoded(qtype, w.blocks[0, r], cols)
            exact, quant = ref_w[r] @ x.astype(np.float64), ref_w[r] @ xr
            scale = np.linalg.norm(ref_w[r]) * np.linalg.norm(x)  # a dot's natural size
            assert abs(dot_decoded(w64, sc16, x, cols) - exact) <= 1e-6 * scale
            assert abs(dot_decoded_q8(w64, sc16, xq, dx, cols) - quant) <= 1e-6 * scale


def test_integer_dot_is_exact_at_the_extremes() -> None:
    """|w|, |x| up to 127: the AVX2 pair sums (vpmaddubsw) must not saturate."""
    cols = 64
    w8 = np.array([127, -127] * 32, np.int8)
    for x in (np.full(cols, 127, np.int8), np.full(cols, -127, np.int8),
              np.array([127, -127] * 32, np.int8), np.array([-127, 127] * 32, np.int8)):
        w64 = w8.view(np.uint64).copy()
        sc16 = np.ones(cols // 16, np.float32)
        got = dot_decoded_q8(w64, sc16, x, np.ones(cols // 32, np.float32), cols)
        assert got == float(w8.astype(np.int64) @ x.astype(np.int64))
