"""GGML type ids and block geometry for the types the GPU kernels read.

Ids, names and sizes come from the one table in ggml_types/ (which imports nothing); this module
says which of them the GPU kernels read.
"""

from __future__ import annotations

import torch

from ggml_types import (
    BF16,
    F16,
    F32,
    GEOMETRY,
    IQ4_NL,
    IQ4_XS,
    MXFP4,
    Q2_K,
    Q3_K,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_K,
    Q6_K,
    Q8_0,
)
from ggml_types import NAMES as _GGML_NAMES

# IQ4_NL / IQ4_XS: the 16 non-uniform int8 levels a 4-bit code selects (ggml's kvalues_iq4nl)
IQ4_LEVELS = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
# MXFP4: the E2M1 values a 4-bit code selects, doubled to integers (ggml's kvalues_mxfp4); the
# block's E8M0 scale 2^(e - 128) is half the format's 2^(e - 127), so level * scale is the value
MXFP4_LEVELS = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)

FLOAT_DTYPES: dict[int, torch.dtype] = {F32: torch.float32, F16: torch.float16,
                                        BF16: torch.bfloat16}

# the block-quantized types the GPU kernels read -> (elements per block, bytes per block)
BLOCK_GEOMETRY: dict[int, tuple[int, int]] = {t: GEOMETRY[t] for t in (
    Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4)}

_NAMES = {t: _GGML_NAMES[t] for t in (F32, F16, BF16, *BLOCK_GEOMETRY)}

SUPPORTED: tuple[int, ...] = tuple(_NAMES)


def name(qtype: int) -> str:
    return _NAMES.get(qtype, f"type {qtype}")


def is_supported(qtype: int) -> bool:
    return qtype in _NAMES


def block_size(qtype: int) -> int:
    """Elements per block (1 for the float types)."""
    return BLOCK_GEOMETRY.get(qtype, (1, 0))[0]
