"""GGUF blocks split into planes: the reference dequantization of the planes equals gguf-py's
dequantization of the blocks, and the planes cost at most 1.04x the file's bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import quants

from cpu_kernels.formats.random_blocks import random_rows
from gpu_kernels import qtypes
from gpu_kernels.dequant_ref import dequantize, element_values
from gpu_kernels.dequant_rows import dequant_rows
from gpu_kernels.qformat import to_planes

TYPES = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K,
         Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4,
         Q.F16, Q.BF16, Q.F32]


def mxfp4_rows(rng: np.random.Generator, rows: int, cols: int,
               exponents: tuple[int, int]) -> np.ndarray:
    """Random MXFP4 rows [rows, cols / 32 * 17] uint8: random codes, each block's E8M0 exponent
    uniform in [exponents[0], exponents[1])."""
    raw = rng.integers(0, 256, size=(rows, cols // 32, 17), dtype=np.uint8)
    raw[..., 0] = rng.integers(*exponents, size=(rows, cols // 32))
    return raw.reshape(rows, -1)


def gguf_dequant(raw: np.ndarray, qtype: Q, rows: int, cols: int) -> np.ndarray:
    if qtype in (Q.F32, Q.F16):
        return raw.astype(np.float32)
    if qtype == Q.BF16:
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return quants.dequantize(raw, qtype).reshape(rows, cols)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("seed", [0, 1])
def test_planes_equal_gguf(qtype: Q, seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows, cols = 7, 768
    raw = random_rows(rng, int(qtype), rows, cols, 0.02)
    q = to_planes(torch.from_numpy(raw.copy()), int(qtype), rows, cols)
    np.testing.assert_array_equal(dequantize(q).numpy(), gguf_dequant(raw, qtype, rows, cols))
    assert q.nbytes <= 1.04 * raw.nbytes
    # any rows and columns, in any order (embedding lookups gather rows)
    r, c = torch.tensor([6, 0, 3]), torch.tensor([767, 5, 256, 31])
    np.testing.assert_array_equal(element_values(q, r, c).numpy(),
                                  gguf_dequant(raw, qtype, rows, cols)[r][:, c])


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("rows,cols", [(1, 96), (5, 64), (12, 320)])
def test_mxfp4_planes_equal_gguf(rows: int, cols: int, device: torch.device) -> None:
    """Exponents in 110..125 (scales 2^-18 .. 2^-3) and, in the first three blocks, the edges:
    0 and 1 (the denormal scales 2^-128 and 2^-127) and 254 (2^126: levels from 4 on overflow
    to inf, as in ggml). The planes' reference and the Triton tile equal gguf-py bit for bit."""
    raw = mxfp4_rows(np.random.default_rng(cols), rows, cols, (110, 126))
    raw.reshape(-1, 17)[:3, 0] = [0, 1, 254]
    expected = gguf_dequant(raw, Q.MXFP4, rows, cols)
    q = to_planes(torch.from_numpy(raw.copy()), int(Q.MXFP4), rows, cols)
    assert q.nbytes == raw.nbytes
    np.testing.assert_array_equal(dequantize(q).numpy().view(np.uint32), expected.view(np.uint32))
    tile = dequant_rows(q.to(device), rows)[0].cpu().numpy()  # [rows, cols]: dequant_tile
    np.testing.assert_array_equal(tile.view(np.uint32), expected.view(np.uint32))


def test_rows_must_be_whole_blocks() -> None:
    raw = torch.zeros(2, 144, dtype=torch.uint8)
    with pytest.raises(ValueError, match="whole blocks"):
        to_planes(raw, qtypes.Q4_K, 1, 288)
