"""The i-quant grids written into cpu_kernels/formats/iquant_tables.py are gguf-py's, value for value."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import quants

from cpu_kernels.formats import iquant_tables


@pytest.mark.parametrize("name", ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S"])
def test_grids_equal_gguf_py(name: str) -> None:
    cls = getattr(quants, name)
    cls.init_grid()
    expected = np.asarray(cls.grid, np.float32).reshape(cls.grid_shape)
    np.testing.assert_array_equal(getattr(iquant_tables, f"GRID_{name}"), expected)


def test_signs_and_levels_equal_gguf_py() -> None:
    ksigns = np.frombuffer(quants.IQ2_XXS.ksigns, np.uint8)
    bits = (ksigns[:, None] >> np.arange(8)) & 1
    np.testing.assert_array_equal(iquant_tables.SIGNS, 1 - 2 * bits)
    np.testing.assert_array_equal(iquant_tables.IQ4_LEVELS, quants.IQ4_NL.kvalues)
