"""cpu_kernels' packed expert layout back to the GPU kernels' planes: equal to to_planes on the
GGUF's bytes, plane by plane, for every unpackable type and several shapes and seeds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from cpu_kernels.fast.packed import PackedMatrix
from cpu_kernels.formats.random_blocks import random_rows
from cpu_kernels.formats.weights import QuantMatrix
from gpu_kernels.packed_planes import can_unpack, planes_from_packed
from gpu_kernels.qformat import to_planes


@pytest.mark.parametrize("qtype,experts,rows,cols,seed", [
    (Q.Q4_K, 3, 16, 512, 1), (Q.Q4_K, 1, 8, 256, 2), (Q.Q6_K, 2, 24, 512, 3),
    (Q.Q6_K, 1, 8, 256, 4), (Q.Q8_0, 2, 16, 96, 5), (Q.Q8_0, 1, 8, 32, 6),
    (Q.Q5_0, 2, 16, 64, 7), (Q.Q5_0, 3, 8, 32, 8), (Q.Q2_K, 2, 16, 512, 9),
    (Q.Q2_K, 1, 8, 256, 10), (Q.Q3_K, 2, 16, 512, 11), (Q.Q3_K, 1, 8, 256, 12)], ids=lambda v: getattr(v, "name", str(v)))
def test_equals_to_planes_of_the_gguf_bytes(qtype, experts, rows, cols, seed) -> None:
    raw = random_rows(np.random.default_rng(seed), int(qtype), experts * rows, cols, 0.05)
    m = QuantMatrix.from_raw(int(qtype), (experts, rows, cols), raw)
    packed = PackedMatrix.of(m)
    got = planes_from_packed(torch.from_numpy(packed.data.copy()), int(qtype), rows, cols)
    want = to_planes(torch.from_numpy(raw.copy()), int(qtype), experts * rows, cols)
    assert (got.rows, got.cols, len(got.planes)) == (want.rows, want.cols, len(want.planes))
    for a, b in zip(got.planes, want.planes):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.numpy().tobytes() == b.numpy().tobytes()


def test_types_and_shapes_left_to_the_gguf_bytes() -> None:
    assert not can_unpack(int(Q.Q5_K), 8) and not can_unpack(int(Q.Q4_0), 8)  # never packed
    assert not can_unpack(int(Q.Q4_K), 12)  # rows not whole groups of 8
    with pytest.raises(ValueError, match="no unpacking of Q5_K"):
        planes_from_packed(torch.zeros(1, 1, 1, dtype=torch.uint8), int(Q.Q5_K), 8, 256)
