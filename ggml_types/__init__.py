"""GGML tensor types: ids, names and block geometry, written out once for the kernel packages.

Ids and sizes are ggml's (gguf-py `GGMLQuantizationType`, `GGML_QUANT_SIZES`; a test holds this
table to gguf-py's), written out so that cpu_kernels and gpu_kernels depend on nothing but their
own numeric libraries. This package imports nothing. Each kernel package keeps its own list of
the types it computes on (cpu_kernels/formats/qtypes.py, gpu_kernels/qtypes.py); the runtime reads
files through gguf-py (hybrid/gguf/quant_types.py).
"""

from __future__ import annotations

F32 = 0
F16 = 1
Q4_0 = 2
Q4_1 = 3
Q5_0 = 6
Q5_1 = 7
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
MXFP4 = 39  # OCP microscaling FP4: E2M1 codes, one E8M0 (power of two) scale per 32

# qtype -> (elements per block, bytes per block); the float types are blocks of one element
GEOMETRY: dict[int, tuple[int, int]] = {
    F32: (1, 4), F16: (1, 2), BF16: (1, 2),
    Q4_0: (32, 18), Q4_1: (32, 20), Q5_0: (32, 22), Q5_1: (32, 24), Q8_0: (32, 34),
    Q2_K: (256, 84), Q3_K: (256, 110), Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210),
    IQ2_XXS: (256, 66), IQ2_XS: (256, 74), IQ2_S: (256, 82), IQ3_XXS: (256, 98),
    IQ3_S: (256, 110), IQ1_S: (256, 50), IQ1_M: (256, 56), IQ4_NL: (32, 18),
    IQ4_XS: (256, 136), MXFP4: (32, 17),
}

NAMES: dict[int, str] = {
    F32: "F32", F16: "F16", BF16: "BF16", Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0",
    Q5_1: "Q5_1", Q8_0: "Q8_0", Q2_K: "Q2_K", Q3_K: "Q3_K", Q4_K: "Q4_K", Q5_K: "Q5_K",
    Q6_K: "Q6_K", IQ2_XXS: "IQ2_XXS", IQ2_XS: "IQ2_XS", IQ2_S: "IQ2_S", IQ3_XXS: "IQ3_XXS",
    IQ3_S: "IQ3_S", IQ1_S: "IQ1_S", IQ1_M: "IQ1_M", IQ4_NL: "IQ4_NL", IQ4_XS: "IQ4_XS",
    MXFP4: "MXFP4",
}


def name(qtype: int) -> str:
    """ggml's name of a type id, or `type <id>` for one not in this table."""
    return NAMES.get(qtype, f"type {qtype}")
