"""gpu_kernels/packed_unpack.py: the packed experts unpacked by a kernel a type equal the
reference's torch ops (packed_planes.planes_from_packed) plane for plane, byte for byte, over
shapes with one, several and a ragged last run of blocks; types without a kernel go to the
reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cpu_kernels.fast.packed import PackedMatrix
from cpu_kernels.formats.random_blocks import random_rows
from cpu_kernels.formats.weights import QuantMatrix
from gpu_kernels import qtypes as qt
from gpu_kernels.packed_planes import planes_from_packed
from gpu_kernels.packed_unpack import unpack


def _packed(qtype: int, experts: int, rows: int, cols: int, seed: int) -> torch.Tensor:
    raw = random_rows(np.random.default_rng(seed), qtype, experts * rows, cols, 0.05)
    m = QuantMatrix.from_raw(qtype, (experts, rows, cols), raw)
    return torch.from_numpy(PackedMatrix.of(m).data.copy())


@pytest.mark.parametrize("qtype,experts,rows,cols,seed", [
    (qt.Q4_K, 1, 8, 256, 1), (qt.Q4_K, 3, 16, 512, 2), (qt.Q4_K, 2, 8, 2816, 3),
    (qt.Q4_K, 1, 24, 2560, 4), (qt.Q8_0, 1, 8, 32, 5), (qt.Q8_0, 2, 16, 1408, 6),
    (qt.Q8_0, 3, 8, 96, 7), (qt.Q6_K, 2, 8, 512, 8), (qt.Q5_0, 1, 16, 64, 9)],
    ids=lambda v: str(v))
def test_equals_the_reference(device, qtype, experts, rows, cols, seed) -> None:
    data = _packed(qtype, experts, rows, cols, seed)
    want = planes_from_packed(data, qtype, rows, cols)
    got = unpack(data.to(device), qtype, rows, cols)
    assert (got.qtype, got.rows, got.cols) == (want.qtype, want.rows, want.cols)
    assert len(got.planes) == len(want.planes)
    for a, b in zip(got.planes, want.planes):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.cpu().numpy().tobytes() == b.numpy().tobytes()


def test_refuses_bytes_of_another_shape(device) -> None:
    data = _packed(qt.Q4_K, 2, 8, 256, 0).to(device)
    with pytest.raises(ValueError, match="not 2 experts of 8 x 512 Q4_K"):
        unpack(data, qt.Q4_K, 8, 512)
