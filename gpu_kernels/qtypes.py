"""GGML type ids and block geometry for the types the GPU kernels read.

Ids and sizes are ggml's (gguf-py `GGMLQuantizationType`, `GGML_QUANT_SIZES`), written out so
that gpu_kernels depends on nothing but torch (and triton, for the kernels themselves).
"""

from __future__ import annotations

import torch

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
IQ4_NL = 20
IQ4_XS = 23
BF16 = 30
# IQ4_NL / IQ4_XS: the 16 non-uniform int8 levels a 4-bit code selects (ggml's kvalues_iq4nl)
IQ4_LEVELS = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)

FLOAT_DTYPES: dict[int, torch.dtype] = {F32: torch.float32, F16: torch.float16,
                                        BF16: torch.bfloat16}

# qtype -> (elements per block, bytes per block), for the block-quantized types
BLOCK_GEOMETRY: dict[int, tuple[int, int]] = {
    Q4_0: (32, 18), Q4_1: (32, 20), Q5_0: (32, 22), Q5_1: (32, 24), Q8_0: (32, 34),
    Q2_K: (256, 84), Q3_K: (256, 110), Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210),
    IQ4_NL: (32, 18), IQ4_XS: (256, 136),
}

_NAMES = {F32: "F32", F16: "F16", BF16: "BF16", Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0",
          Q5_1: "Q5_1", Q8_0: "Q8_0", Q2_K: "Q2_K", Q3_K: "Q3_K", Q4_K: "Q4_K", Q5_K: "Q5_K",
          Q6_K: "Q6_K", IQ4_NL: "IQ4_NL", IQ4_XS: "IQ4_XS"}

SUPPORTED: tuple[int, ...] = tuple(_NAMES)


def name(qtype: int) -> str:
    return _NAMES.get(qtype, f"type {qtype}")


def is_supported(qtype: int) -> bool:
    return qtype in _NAMES


def block_size(qtype: int) -> int:
    """Elements per block (1 for the float types)."""
    return BLOCK_GEOMETRY.get(qtype, (1, 0))[0]
