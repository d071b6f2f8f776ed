"""Our torch dequantizers against gguf-py's numpy reference, on many random blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import quants

from hybrid.errors import GGUFError
from hybrid.gguf.dequant import dequantize
from hybrid.gguf.quant_types import SUPPORTED_TYPES, Q, block_geometry

BLOCK_TYPES = [t for t in SUPPORTED_TYPES if t not in (Q.F32, Q.F16, Q.BF16, Q.I32)]
# Byte offsets of the fp16 scale fields per block, kept finite (random bytes can be NaN/inf).
F16_FIELDS = {
    Q.Q8_0: [0], Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2],
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
    Q.IQ1_S: [0], Q.IQ2_XXS: [0], Q.IQ2_XS: [0], Q.IQ2_S: [0], Q.IQ3_XXS: [0], Q.IQ3_S: [0],
    Q.IQ4_NL: [0], Q.IQ4_XS: [0], Q.IQ1_M: [], Q.MXFP4: [],
}
# Byte offsets of E8M0 exponents (scale 2^(e - 128)), kept in 110..125: finite, small weights.
E8M0_FIELDS = {Q.MXFP4: [0]}


def random_blocks(rng: np.random.Generator, qtype: int, n: int) -> np.ndarray:
    _, type_size = block_geometry(qtype)
    raw = rng.integers(0, 256, size=(n, type_size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        scale = rng.uniform(-2.0, 2.0, size=(n, 1)).astype(np.float16)
        raw[:, off : off + 2] = scale.view(np.uint8)
    for off in E8M0_FIELDS.get(qtype, []):
        raw[:, off] = rng.integers(110, 126, size=n)
    if qtype == Q.IQ1_M:  # its f16 d sits in the top nibbles of the scale words at 48..55
        d = rng.uniform(-2.0, 2.0, size=n).astype(np.float16).view(np.uint16)
        for m in range(4):
            raw[:, 49 + 2 * m] = (raw[:, 49 + 2 * m] & 15) | (((d >> (4 * m)) & 15) << 4)
    return raw


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_block_types_match_gguf_py(qtype: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    block_size, _ = block_geometry(qtype)
    n = int(rng.integers(1, 300))
    raw = random_blocks(rng, qtype, n)
    expected = quants.dequantize(raw, qtype).reshape(-1)
    ours = dequantize(raw, qtype, (n * block_size,)).numpy()
    np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_shapes_and_rows(qtype: int) -> None:
    rng = np.random.default_rng(7)
    block_size, type_size = block_geometry(qtype)
    rows, blocks_per_row = 5, 3
    raw = random_blocks(rng, qtype, rows * blocks_per_row).reshape(rows, blocks_per_row * type_size)
    ours = dequantize(raw, qtype, (rows, blocks_per_row * block_size)).numpy()
    assert ours.shape == (rows, blocks_per_row * block_size)
    np.testing.assert_allclose(ours, quants.dequantize(raw, qtype), rtol=1e-6, atol=1e-30)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_mxfp4_every_exponent_bit_for_bit() -> None:
    """Every E8M0 exponent with every code: denormal scales at e = 0 and 1, levels overflowing
    to inf at e = 254 and 255, as in gguf-py, whose values ours equal bit for bit."""
    raw = np.empty((256, 17), np.uint8)
    raw[:, 0] = np.arange(256)
    raw[:, 1:] = np.arange(16) | ((15 - np.arange(16)) << 4)  # codes 0..15, low and high
    expected = quants.dequantize(raw, Q.MXFP4).reshape(-1)
    ours = dequantize(raw, Q.MXFP4, (256 * 32,)).numpy()
    np.testing.assert_array_equal(ours.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16], ids=lambda t: t.name)
def test_float_types(qtype: int) -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((7, 64)).astype(np.float32)
    if qtype == Q.F32:
        raw = w
    elif qtype == Q.F16:
        raw = w.astype(np.float16)
    else:
        raw = (w.view(np.uint32) >> 16).astype(np.uint16)
    expected = quants.dequantize(raw.view(np.uint8).reshape(7, -1), qtype)
    np.testing.assert_array_equal(dequantize(raw, qtype, (7, 64)).numpy(), expected)


def test_integer_tables_stay_integers() -> None:
    """I32 (DeepSeek-V4's token-id routing table) is read as int32, not turned into floats."""
    table = np.arange(-3, 9, dtype=np.int32).reshape(4, 3)
    out = dequantize(table.view(np.uint8), Q.I32, (4, 3))
    assert out.dtype == torch.int32 and out.tolist() == table.tolist()


def test_unsupported_type_is_a_clear_error() -> None:
    with pytest.raises(GGUFError, match="TQ1_0 is not supported; supported types: F32"):
        dequantize(np.zeros(54, np.uint8), Q.TQ1_0, (256,))
