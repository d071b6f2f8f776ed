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
}

NAMES: dict[int, str] = {
    F32: "F32", F16: "F16", Q4_0: "Q4_0", Q5_0: "Q5_0", Q8_0: "Q8_0", Q2_K: "Q2_K",
    Q3_K: "Q3_K", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K", BF16: "BF16",
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
