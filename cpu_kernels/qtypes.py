"""GGML type ids and block geometry for the types our kernels compute on.

Ids and sizes are ggml's (gguf-py `GGMLQuantizationType`, `GGML_QUANT_SIZES`); they are written out
here so that cpu_kernels depends on nothing but numpy and numba at run time.
"""

from __future__ import annotations

F32 = 0
F16 = 1
Q4_0 = 2
Q5_0 = 6
Q8_0 = 8
Q2_K = 10
Q3_K = 11
Q4_K = 12
Q5_K = 13
Q6_K = 14
IQ2_XXS = 16
IQ2_XS = 17
IQ3_XXS = 18
IQ1_S = 19
IQ4_NL = 20
IQ3_S = 21
IQ2_S = 22
IQ4_XS = 23
IQ1_M = 29
BF16 = 30

# qtype -> (elements per block, bytes per block)
BLOCK_GEOMETRY: dict[int, tuple[int, int]] = {
    F16: (1, 2),
    BF16: (1, 2),
    Q4_0: (32, 18),
    Q5_0: (32, 22),
    Q8_0: (32, 34),
    Q2_K: (256, 84),
    Q3_K: (256, 110),
    Q4_K: (256, 144),
    Q5_K: (256, 176),
    Q6_K: (256, 210),
    IQ2_XXS: (256, 66),
    IQ2_XS: (256, 74),
    IQ2_S: (256, 82),
    IQ3_XXS: (256, 98),
    IQ3_S: (256, 110),
    IQ1_S: (256, 50),
    IQ1_M: (256, 56),
    IQ4_NL: (32, 18),
    IQ4_XS: (256, 136),
}
# the i-quants: lattice or level-table codes, read through cpu_kernels/iquant_tables.py
IQUANTS = (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS)

NAMES: dict[int, str] = {
    F32: "F32", F16: "F16", Q4_0: "Q4_0", Q5_0: "Q5_0", Q8_0: "Q8_0", Q2_K: "Q2_K",
    Q3_K: "Q3_K", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K", BF16: "BF16", IQ2_XXS: "IQ2_XXS",
    IQ2_XS: "IQ2_XS", IQ2_S: "IQ2_S", IQ3_XXS: "IQ3_XXS", IQ3_S: "IQ3_S", IQ1_S: "IQ1_S",
    IQ1_M: "IQ1_M", IQ4_NL: "IQ4_NL", IQ4_XS: "IQ4_XS",
}

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
