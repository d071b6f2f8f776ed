"""The parallel packers (pack_kernels.py) write packed.py's numpy reference byte for byte."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from cpu_kernels.fast.packed import PACKED_GEOMETRY, PackedMatrix
from cpu_kernels.formats import qtypes as qt
from cpu_kernels.formats.random_blocks import random_matrix


@pytest.mark.parametrize("qtype", list(PACKED_GEOMETRY), ids=qt.type_name)
def test_parallel_packers_equal_the_reference(qtype: int) -> None:
    rng = np.random.default_rng(qtype)
    block = PACKED_GEOMETRY[qtype][0]
    for rows, blocks, row_range, col_blocks in ((8, 1, None, None), (21, 3, (3, 19), (1, 3)),
                                                (40, 2, (8, 40), None), (5, 4, None, (2, 4))):
        w = random_matrix(rng, qtype, (3, rows, blocks * block))
        cols = None if col_blocks is None else (col_blocks[0] * block, col_blocks[1] * block)
        numba.set_num_threads(1 + rows % 2)
        ours = PackedMatrix.of(w, rows=row_range, cols=cols)
        ref = PackedMatrix.reference(w, rows=row_range, cols=cols)
        assert ours.shape == ref.shape
        np.testing.assert_array_equal(ours.data, ref.data)
