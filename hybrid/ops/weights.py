"""A weight as an operator keeps it: dequantized once (f32/bf16/f16), or the GGUF's own blocks
on the device ("gguf": the memory the plan counts).

On a CUDA device a "gguf" weight is held as gpu_kernels planes (the same bytes, one array per
block field; qformat.py) that the GPU kernels read directly (`quant`); a dense weight there is
one float plane. Elsewhere the blocks stay raw and `get()` dequantizes them on use.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import replace

import torch

from hybrid.gguf.dequant import dequantize
from hybrid.gguf.reader import GGUFModelFile
from hybrid.model.spec import ModelSpec
from hybrid.model.tensor_map import combine_sources, gguf_sources, load_hf_weight
from hybrid.ops.kernel_sets import uses_gpu_kernels

_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
log = logging.getLogger(__name__)


class _Raw:
    def __init__(self, data: torch.Tensor, qtype: int, shape: tuple[int, ...]) -> None:
        self.data = data  # bytes (or F32/F16 elements) on the device
        self.qtype = qtype
        self.shape = shape


class Weight:
    """`get()` returns the weight as an fp32-or-storage-dtype tensor on `device`; on CUDA,
    `quant` holds it as GpuQuant matrices, one per GGUF source tensor ([rows, last dim])."""

    def __init__(self, gguf: GGUFModelFile, spec: ModelSpec, hf_name: str, fmt: str,
                 device: str, x_bits: int = 0, fp16_prompts: bool = False) -> None:
        """x_bits, fp16_prompts: GpuQuant's fields of its matrices (the op's `activations` and
        `prompt_products`)."""
        self.hf_name, self.fmt, self.device = hf_name, fmt, torch.device(device)
        self.x_bits, self.fp16_prompts = x_bits, fp16_prompts
        self._kernels = uses_gpu_kernels(self.device)  # once: `quant` is read every call
        self._dense: torch.Tensor | None = None
        self._raw: list[_Raw] = []
        self._quant = None
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
            elif self._kernels and not self._gpu_readable():
                self._to_bf16(sources)
            elif self._kernels:
                self._to_planes()
        else:
            self._dense = load_hf_weight(gguf, spec, hf_name).to(self.device, _DTYPES[fmt])
        if fmt != "gguf" or self.device.type != "cpu":
            # the weight now lives in a copy (the device's, or a dequantized one): its GGUF
            # pages leave this process's resident memory (they stay in the page cache; only a
            # "gguf" weight on the CPU is a view of the map and keeps them)
            for s in gguf_sources(hf_name, spec):
                if gguf.has_tensor(s):
                    gguf.release(s)

    def _gpu_readable(self) -> bool:
        from gpu_kernels.qtypes import is_supported

        return all(is_supported(r.qtype) for r in self._raw)

    def _to_bf16(self, sources: list[str]) -> None:
        """A type the GPU kernels do not read yet (the i-quants): this weight is held as bf16
        (its dequantized values rounded once), said in the log, rather than refused."""
        from hybrid.gguf.quant_types import type_name

        types = ", ".join(sorted({type_name(r.qtype) for r in self._raw}))
        log.warning("%s (%s): the GPU kernels do not read %s; holding it as bf16 on %s",
                    self.hf_name, ", ".join(sources), types, self.device)
        dense = combine_sources(self.hf_name, [dequantize(r.data, r.qtype, r.shape)
                                               for r in self._raw])
        self._dense = dense.to(torch.bfloat16)
        self._raw = []

    def _to_planes(self) -> None:
        from gpu_kernels.qformat import to_planes

        self._quant = tuple(replace(to_planes(r.data, r.qtype, _rows(r.shape), r.shape[-1]),
                                    x_bits=self.x_bits, fp16_prompts=self.fp16_prompts)
                            for r in self._raw)
        self._shapes = [r.shape for r in self._raw]
        self._raw = []  # the planes are the only copy on the device

    @property
    def quant(self):
        """The weight as gpu_kernels GpuQuant matrices (one per source), or None off CUDA."""
        if self._quant is None and self._dense is not None and self._kernels:
            from gpu_kernels.qformat import GpuQuant
            from gpu_kernels.qtypes import BF16, F16, F32

            qtype = {torch.float32: F32, torch.float16: F16, torch.bfloat16: BF16}[self._dense.dtype]
            w = self._dense.reshape(-1, self._dense.shape[-1])
            self._quant = (GpuQuant(qtype, w.shape[0], w.shape[1], (w,),
                                    fp16_prompts=self.fp16_prompts),)
        return self._quant

    def get(self) -> torch.Tensor:
        if self._dense is not None:
            return self._dense
        if self._quant is not None:
            from gpu_kernels.dequant_ref import dequantize as dequantize_planes

            parts = [dequantize_planes(q).reshape(shape)
                     for q, shape in zip(self._quant, self._shapes)]
            return combine_sources(self.hf_name, parts)
        return combine_sources(self.hf_name, [dequantize(r.data, r.qtype, r.shape) for r in self._raw])

    @property
    def nbytes(self) -> int:
        if self._dense is not None:
            return self._dense.numel() * self._dense.element_size()
        if self._quant is not None:
            return sum(q.nbytes for q in self._quant)
        return sum(r.data.numel() * r.data.element_size() for r in self._raw)


def _rows(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape[:-1]:
        n *= d
    return n


def stack_rows(first: Weight, second: Weight):
    """Two weights that multiply the same input (gate and up; q and kv_a) as one GpuQuant
    [R1 + R2, H] (first's rows first), so one launch computes both; None off CUDA or when their
    types differ. The planes are concatenated and each weight's `quant` becomes a view of its
    rows: the same bytes."""
    if first.fmt != "gguf" or second.fmt != "gguf":
        return None  # dense weights would be copied
    a, b = first.quant, second.quant
    if a is None or b is None or len(a) != 1 or len(b) != 1 or a[0].qtype != b[0].qtype \
            or a[0].cols != b[0].cols:
        return None
    a, b = a[0], b[0]
    planes = tuple(torch.cat([p, q]) for p, q in zip(a.planes, b.planes))
    first._quant = (replace(a, planes=tuple(p[:a.rows] for p in planes)),)
    second._quant = (replace(b, planes=tuple(p[a.rows:] for p in planes)),)
    return replace(a, rows=a.rows + b.rows, planes=planes)
