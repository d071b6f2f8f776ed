"""cpu_kernels/formats/random_blocks.py, the one generator of synthetic weights: every type's
blocks dequantize (by gguf-py) to weights of about the asked spread, centred; the i-quants'
measured unit spreads hold; random_blocks' shapes and refusals."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

import ggml_types as g
from cpu_kernels.formats.random_blocks import (
    IQUANT_UNIT_STD,
    _put_d,
    random_blocks,
    random_rows,
)

BLOCK_TYPES = [g.Q8_0, g.Q4_0, g.Q4_1, g.Q5_0, g.Q5_1, g.Q2_K, g.Q3_K, g.Q4_K, g.Q5_K, g.Q6_K,
               g.MXFP4, *IQUANT_UNIT_STD]


def _weights(raw: np.ndarray, qtype: int) -> np.ndarray:
    return np.asarray(quants.dequantize(raw, GGMLQuantizationType(qtype)), np.float64)


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: g.NAMES[t])
def test_weights_have_the_asked_spread(qtype: int) -> None:
    std = 0.02
    w = _weights(random_rows(np.random.default_rng(qtype), qtype, 64, 1024, std), qtype)
    assert 0.7 * std < w.std() < 1.3 * std
    assert abs(w.mean()) < 0.25 * std  # Q3_K: codes -4..3, mean -0.5 of spread 2.29


@pytest.mark.parametrize("qtype", list(IQUANT_UNIT_STD), ids=lambda t: g.NAMES[t])
def test_iquant_unit_spreads(qtype: int) -> None:
    """The constants are the spread of random blocks at d = 1, as gguf-py dequantizes them."""
    rng = np.random.default_rng(12345)
    _, type_size = g.GEOMETRY[qtype]
    raw = rng.integers(0, 256, size=(4096, type_size), dtype=np.uint8)
    _put_d(qtype, raw, np.ones((4096, 1), np.float32))
    assert _weights(raw, qtype).std() == pytest.approx(IQUANT_UNIT_STD[qtype], rel=1e-5)


def test_random_blocks_shapes_and_refusals() -> None:
    rng = np.random.default_rng(0)
    assert random_blocks(rng, g.Q4_K, (3, 8, 512)).shape == (3, 8, 2 * 144)
    assert random_blocks(rng, g.BF16, (2, 4, 64)).shape == (2, 4, 128)  # its bytes
    with pytest.raises(ValueError, match="not whole blocks"):
        random_blocks(rng, g.Q4_K, (1, 8, 300))
    with pytest.raises(ValueError, match="no random blocks of type 99"):
        random_rows(rng, 99, 1, 32, 0.1)
