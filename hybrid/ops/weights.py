"""A weight as an operator keeps it: dequantized once (f32/bf16/f16), or the GGUF's own blocks
on the device, dequantized on use ("gguf": the memory the plan counts)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from hybrid.gguf.dequant import dequantize
from hybrid.gguf.reader import GGUFModelFile
from hybrid.model.spec import ModelSpec
from hybrid.model.tensor_map import combine_sources, gguf_sources, load_hf_weight

_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


@dataclass
class _Raw:
    data: torch.Tensor  # bytes (or F32/F16 elements) on the device
    qtype: int
    shape: tuple[int, ...]


class Weight:
    """`get()` returns the weight as an fp32-or-storage-dtype tensor on `device`."""

    def __init__(self, gguf: GGUFModelFile, spec: ModelSpec, hf_name: str, fmt: str,
                 device: str) -> None:
        self.hf_name, self.fmt, self.device = hf_name, fmt, torch.device(device)
        self._dense: torch.Tensor | None = None
        self._raw: list[_Raw] = []
        if fmt == "gguf":
            sources = [s for s in gguf_sources(hf_name, spec) if gguf.has_tensor(s)]
            for s in sources:
                qt = gguf.tensor(s)
                with warnings.catch_warnings():  # the mmap is read-only; we never write to it
                    warnings.simplefilter("ignore", UserWarning)
                    data = torch.from_numpy(qt.data)
                self._raw.append(_Raw(data.to(self.device), qt.qtype, qt.shape))
            if not self._raw:  # a bias absent from the file
                self._dense = load_hf_weight(gguf, spec, hf_name).to(self.device)
        else:
            self._dense = load_hf_weight(gguf, spec, hf_name).to(self.device, _DTYPES[fmt])

    def get(self) -> torch.Tensor:
        if self._dense is not None:
            return self._dense
        return combine_sources(self.hf_name, [dequantize(r.data, r.qtype, r.shape) for r in self._raw])

    @property
    def nbytes(self) -> int:
        if self._dense is not None:
            return self._dense.numel() * self._dense.element_size()
        return sum(r.data.numel() * r.data.element_size() for r in self._raw)
