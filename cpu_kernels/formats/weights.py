"""Quantized weight records: raw GGUF blocks with their type and shape, never loose arrays."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from cpu_kernels.formats.qtypes import row_nbytes, type_name

if TYPE_CHECKING:
    from cpu_kernels.fast.packed import PackedExperts


def read_only(a: np.ndarray) -> np.ndarray:
    """`a`, or a view of it that cannot be written. Kernels see weights only so: numba compiles
    a read-only array as a type of its own, so weights from a file (memory-mapped read-only) and
    weights built in memory (packing, synthetic blocks) would each compile every kernel again,
    twice the minutes on a cold start and twice the on-disk cache."""
    if not a.flags.writeable:
        return a
    view = a.view()
    view.flags.writeable = False
    return view


@dataclass(frozen=True)
class QuantMatrix:
    """A stack of quantized matrices as stored in GGUF.

    `shape` is numpy order `(E, rows, cols)` (ggml's ne reversed: `cols` are the input features);
    `blocks` is `[E, rows, row_bytes]` uint8, C-contiguous (a memory-mapped view is fine: nothing
    is copied when the bytes are already contiguous). A single matrix is a stack with E = 1.
    """

    qtype: int
    shape: tuple[int, int, int]
    blocks: np.ndarray  # [E, rows, row_bytes] uint8, read-only

    def __post_init__(self) -> None:
        object.__setattr__(self, "blocks", read_only(self.blocks))

    @classmethod
    def from_raw(cls, qtype: int, shape: tuple[int, ...], raw: np.ndarray) -> QuantMatrix:
        """Wrap GGUF bytes (any dtype, e.g. a memmap of uint8 or of float16 elements).

        `shape` is `(E, rows, cols)` or `(rows, cols)`.
        """
        if len(shape) == 2:
            shape = (1, *shape)
        if len(shape) != 3:
            raise ValueError(f"expected shape (E, rows, cols) or (rows, cols), got {shape}")
        num_experts, rows, cols = (int(s) for s in shape)
        nbytes = row_nbytes(qtype, cols)
        flat = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
        if flat.size != num_experts * rows * nbytes:
            raise ValueError(f"{type_name(qtype)} {shape} needs {num_experts * rows * nbytes} "
                             f"bytes, got {flat.size}")
        return cls(qtype, (num_experts, rows, cols), flat.reshape(num_experts, rows, nbytes))

    @property
    def num_experts(self) -> int:
        return self.shape[0]

    @property
    def rows(self) -> int:
        return self.shape[1]

    @property
    def cols(self) -> int:
        return self.shape[2]

    @property
    def nbytes(self) -> int:
        return int(self.blocks.nbytes)

    @property
    def expert_nbytes(self) -> int:
        return self.nbytes // self.num_experts


@dataclass(frozen=True)
class ExpertWeights:
    """The routed experts of one MoE layer: gate/up `[E, I, H]`, down `[E, H, I]`.

    `packed` (made by `pack()`) is the row-interleaved copy that `fast` mode runs on; `exact`
    mode always reads the blocks. `swiglu_limit`: the activation's clamp (DeepSeek-V4's
    clamped SwiGLU, exact/swiglu.py); inf for plain SwiGLU.
    """

    gate: QuantMatrix
    up: QuantMatrix
    down: QuantMatrix
    packed: PackedExperts | None = field(default=None, repr=False, compare=False)
    swiglu_limit: float = math.inf

    def __post_init__(self) -> None:
        num_experts, inter, hidden = self.gate.shape
        if self.up.shape != self.gate.shape:
            raise ValueError(f"gate {self.gate.shape} and up {self.up.shape} differ")
        if self.down.shape != (num_experts, hidden, inter):
            raise ValueError(f"down {self.down.shape} is not {(num_experts, hidden, inter)}")
        if not self.swiglu_limit > 0:
            raise ValueError(f"swiglu_limit must be > 0 (inf: no clamp), got {self.swiglu_limit}")

    @property
    def num_experts(self) -> int:
        return self.gate.shape[0]

    @property
    def intermediate_size(self) -> int:
        return self.gate.shape[1]

    @property
    def hidden_size(self) -> int:
        return self.gate.shape[2]

    def use_packed(self, packed: PackedExperts) -> ExpertWeights:
        """Adopt a packed copy made elsewhere (a memory map of an earlier start's, say) in
        place of any made here, and return self."""
        for name in ("gate", "up", "down"):
            w, p = getattr(self, name), getattr(packed, name)
            if (p.qtype, p.shape) != (w.qtype, w.shape):
                raise ValueError(f"packed {name} {p.shape} is not this layer's {w.shape}")
        object.__setattr__(self, "packed", packed)
        return self

    def expert_nbytes(self) -> int:
        """Bytes read for one expert (gate + up + down)."""
        return self.gate.expert_nbytes + self.up.expert_nbytes + self.down.expert_nbytes
