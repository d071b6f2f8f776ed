"""A GGUF tensor as stored: raw blocks, type and shape, never loose arrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hybrid.gguf.dequant import dequantize
from hybrid.gguf.quant_types import type_name


@dataclass(frozen=True)
class QuantTensor:
    """One tensor of a GGUF file, still in its file encoding.

    `shape` is in numpy/PyTorch order (the reverse of ggml's ne), so a linear weight is
    `[out_features, in_features]` and stacked experts are `[E, out, in]`. `data` is a read-only
    memory-mapped view of the file: uint8 bytes for quantized types, elements for F32/F16/BF16.
    """

    name: str
    qtype: int
    shape: tuple[int, ...]
    data: np.ndarray
    file_path: str

    @property
    def type_name(self) -> str:
        return type_name(self.qtype)

    @property
    def num_elements(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def dequantize(self) -> torch.Tensor:
        """The tensor as fp32 with `shape`."""
        return dequantize(self.data, self.qtype, self.shape)
