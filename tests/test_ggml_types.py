"""The one table of ggml types (ggml_types/) is ggml's own, as gguf-py has it, and each kernel
package's list of the types it computes on is drawn from it."""

from __future__ import annotations

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

import cpu_kernels.formats.qtypes as cq
import ggml_types
import gpu_kernels.qtypes as gq


def test_the_table_is_ggmls() -> None:
    for qtype, geometry in ggml_types.GEOMETRY.items():
        assert GGML_QUANT_SIZES[GGMLQuantizationType(qtype)] == geometry
        assert GGMLQuantizationType(qtype).name == ggml_types.NAMES[qtype]
    assert set(ggml_types.NAMES) == set(ggml_types.GEOMETRY)
    assert ggml_types.name(12) == "Q4_K" and ggml_types.name(99) == "type 99"


def test_the_kernel_packages_draw_from_it() -> None:
    for table in (cq.BLOCK_GEOMETRY, gq.BLOCK_GEOMETRY):
        assert all(ggml_types.GEOMETRY[t] == g for t, g in table.items())
    assert cq.type_name(cq.IQ2_XXS) == "IQ2_XXS" and gq.name(gq.Q5_1) == "Q5_1"
    assert cq.row_nbytes(cq.Q4_K, 512) == 2 * 144 and gq.block_size(gq.F16) == 1
