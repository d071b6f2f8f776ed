"""The GGML tensor types we read, with their block geometry.

A quantized tensor is stored as rows of blocks; each block holds `block_size` elements in
`type_size` bytes. Rows (the ggml ne0 dimension, a weight's input features) are always a whole
number of blocks.
"""

from __future__ import annotations

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType

# Types with a dequantizer in hybrid.gguf.dequant (the order is what error messages list).
SUPPORTED_TYPES: tuple[GGMLQuantizationType, ...] = (
    Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1,
    Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K,
    Q.IQ1_S, Q.IQ1_M, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ4_NL, Q.IQ4_XS,
    Q.MXFP4, Q.I32,
)


def type_name(qtype: int) -> str:
    """The ggml name of a type id, or `type <id>` for ids that gguf does not know."""
    try:
        return Q(qtype).name
    except ValueError:
        return f"unknown type id {qtype} (not a ggml type; ik_llama.cpp-only types are not readable)"


def supported_names() -> str:
    return ", ".join(t.name for t in SUPPORTED_TYPES)


def block_geometry(qtype: int) -> tuple[int, int]:
    """(elements per block, bytes per block) for a type id known to gguf."""
    return GGML_QUANT_SIZES[Q(qtype)]


def tensor_nbytes(qtype: int, num_elements: int) -> int:
    block_size, type_size = block_geometry(qtype)
    return num_elements // block_size * type_size
