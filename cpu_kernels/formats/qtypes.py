"""GGML type ids and block geometry for the types our kernels compute on.

Ids, names and sizes come from the one table in ggml_types/ (which imports nothing); this module
says which of them the CPU kernels compute on and how their rows line up.
"""

from __future__ import annotations

from ggml_types import (
    BF16,
    F16,
    F32,
    GEOMETRY,
    IQ1_M,
    IQ1_S,
    IQ2_S,
    IQ2_XS,
    IQ2_XXS,
    IQ3_S,
    IQ3_XXS,
    IQ4_NL,
    IQ4_XS,
    MXFP4,
    Q2_K,
    Q3_K,
    Q4_0,
    Q4_K,
    Q5_0,
    Q5_K,
    Q6_K,
    Q8_0,
)
from ggml_types import NAMES as _GGML_NAMES

# the types our kernels compute on -> (elements per block, bytes per block)
BLOCK_GEOMETRY: dict[int, tuple[int, int]] = {t: GEOMETRY[t] for t in (
    F16, BF16, Q4_0, Q5_0, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
    IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, IQ4_NL, IQ4_XS, MXFP4)}
# the i-quants: lattice or level-table codes, read through cpu_kernels/formats/iquant_tables.py
IQUANTS = (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS)
# codes that select values from a table (the i-quants, and MXFP4's E2M1 levels): the exact path
# decodes their rows once (exact/iquant_decode.py); the AMX kernel takes none of them
TABLE_CODED = (*IQUANTS, MXFP4)

NAMES: dict[int, str] = {t: _GGML_NAMES[t] for t in (F32, *BLOCK_GEOMETRY)}

# Rows must be whole groups of 32 elements (for F16/BF16 too): activations are summed and, in
# `fast` mode, quantized per group of 32, and every block type's scales line up with these groups.
GROUP = 32


def type_name(qtype: int) -> str:
    return NAMES.get(qtype, f"type {qtype}")


def is_supported(qtype: int) -> bool:
    return qtype in BLOCK_GEOMETRY


def row_nbytes(qtype: int, cols: int) -> int:
    """Bytes of one row of `cols` elements; raises ValueError if cols is not whole blocks."""
    if qtype not in BLOCK_GEOMETRY:
        raise ValueError(f"cpu_kernels has no kernel for {type_name(qtype)}")
    block_size, type_size = BLOCK_GEOMETRY[qtype]
    if cols % block_size or cols % GROUP:
        raise ValueError(f"{type_name(qtype)} rows of {cols} are not whole blocks of "
                         f"{max(block_size, GROUP)}")
    return cols // block_size * type_size
