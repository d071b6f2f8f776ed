"""Routed experts streamed to the GPU for long prompts: a MoE layer's expert blocks copied from
page-locked host memory (the GGUF's map, host_pinning.py) while the GPU multiplies the ones
before, then every token of the step multiplied at once by the grouped quantized kernels
(gpu_kernels/moe_grouped.py). One copy serves all the step's tokens, so past some token count
this beats the CPU (prefill_costs.py decides per layer).

Units: a streamed layer's experts in ranges of `experts_per_unit` (a whole layer when the
memory budget allows); each expert tensor ([E, R, row bytes] in the GGUF, [E, R/8, group bytes]
packed) holds a range's bytes contiguously, so a unit is one host-to-device copy per tensor.
The source is the GGUF's map (exact mode: the CPU kernels' own bytes) or fast mode's packed
copy, turned back into planes on the device (gpu_kernels/packed_unpack.py). GPU memory: two
raw slots (the next unit lands while this one is split into planes) and this unit's planes.

    copy stream:    wait freed[s]; raw[s] <- the unit's host bytes; record copied[s]  (s = u % 2)
    model stream:   wait copied[s]; planes <- to_planes(raw[s]); record freed[s];
                    queue the copy of unit u + 2; out += moe_experts(x, ids - e0, planes)

The host never waits: the model stream's launches queue behind the copies, and the copy engine
runs ahead by two units (PCIe-bound layers: copy time; compute-bound ones: kernel time).
On a CPU device (Triton's interpreter in tests) the same runs with plain copies in order.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from cpu_kernels.fast.packed import PackedMatrix
from cpu_kernels.formats.weights import QuantMatrix

# GPU bytes a unit's expert costs: two raw slots, its planes (<= 1.04x) and to_planes'
# temporaries (the K-quants' scale unpacking); with fp16 products over many pairs, one of its
# tensors decoded into fp16 rows besides (gpu_kernels/moe_dense.py)
BYTES_PER_UNIT_BYTE = 3.25


@dataclass(frozen=True)
class StreamTensor:
    """One expert tensor [E, rows, cols] as the stream reads it: host bytes [E, bytes per
    expert] in the GGUF's blocks, or in cpu_kernels' packed layout (`packed`: fast mode's
    copy, turned back into planes on the device by gpu_kernels/packed_unpack.py)."""

    qtype: int
    rows: int
    cols: int
    host: np.ndarray  # [E, bytes per expert] uint8
    packed: bool

    @classmethod
    def of(cls, m: QuantMatrix | PackedMatrix) -> StreamTensor:
        e, rows, cols = m.shape
        data = m.data if isinstance(m, PackedMatrix) else m.blocks
        return cls(m.qtype, rows, cols, data.reshape(e, -1), isinstance(m, PackedMatrix))

    @property
    def num_experts(self) -> int:
        return self.host.shape[0]

    @property
    def expert_nbytes(self) -> int:
        return self.host.shape[1]

    @property
    def nbytes(self) -> int:
        return int(self.host.nbytes)

    def planes(self, raw: torch.Tensor, experts: int):
        """raw: `experts` experts' bytes on the device -> their GpuQuant of experts * rows,
        holding none of raw's memory: the stream refills raw with a later unit's bytes while
        this unit's products may still run (a plane that is a view of raw, as to_planes gives
        for float types, is copied)."""
        if self.packed:
            from gpu_kernels.packed_unpack import unpack

            q = unpack(raw.view(experts, -1), self.qtype, self.rows, self.cols)
        else:
            from gpu_kernels.qformat import to_planes

            q = to_planes(raw, self.qtype, experts * self.rows, self.cols)
        base = raw.untyped_storage().data_ptr()
        return replace(q, planes=tuple(
            p.clone() if p.untyped_storage().data_ptr() == base else p for p in q.planes))


class ExpertStream:
    def __init__(self, layers: Sequence[tuple[QuantMatrix | PackedMatrix, ...]],
                 device: torch.device, memory_bytes: int | None, fp16: bool,
                 dense: bool = True) -> None:
        """layers: each streamable MoE layer's expert tensors, (gate, up, down) or the fused
        layout's (gate_up, down), as QuantMatrix stacks on the GGUF's bytes or PackedMatrix
        stacks (fast mode's copy; planes_from_packed must cover them). memory_bytes: the GPU
        memory the stream may hold; None: a whole layer a unit (with one decoded tensor where
        `dense` may apply), at most half the device's free memory. fp16: tensor-core products in fp16 (fast mode's error
        budget) instead of tf32x3. dense: with fp16, many pairs multiply on weights decoded once
        (gpu_kernels/moe_dense.py) where the memory holds them."""
        from gpu_kernels import moe_dense

        self.layers = [tuple(StreamTensor.of(m) for m in parts) for parts in layers]
        self.device, self.fp16 = device, fp16
        self.num_experts = self.layers[0][0].num_experts
        self.expert_nbytes = max(sum(m.expert_nbytes for m in parts) for parts in self.layers)
        if memory_bytes is None:
            memory_bytes = self.num_experts * expert_memory(self.layers, dense and fp16)
            if device.type == "cuda":
                memory_bytes = min(memory_bytes, torch.cuda.mem_get_info(device)[0] // 2)
        # many pairs multiply on weights decoded once (fast mode only: fp16), where the memory
        # holds a unit's decoded tensor too; else on the tiles
        self.dense = dense and fp16 \
            and all(moe_dense.fits(m.cols) for p in self.layers for m in p) \
            and memory_bytes >= expert_memory(self.layers, True)
        fits = int(memory_bytes // expert_memory(self.layers, self.dense))
        if fits < 1:
            raise ValueError(f"{memory_bytes / 2**20:.0f} MiB of GPU memory for streaming holds "
                             f"no expert ({self.expert_nbytes / 2**20:.1f} MiB each, "
                             f"{BYTES_PER_UNIT_BYTE}x that while streaming)")
        self.experts_per_unit = min(self.num_experts, fits)
        slot = self.experts_per_unit * self.expert_nbytes
        self.slots = [torch.empty(slot, dtype=torch.uint8, device=device) for _ in range(2)]
        self.cuda = device.type == "cuda"
        self.registration = None
        if self.cuda:
            from hybrid.engine.prefill.host_pinning import HostRegistration

            self.copy_stream = torch.cuda.Stream(device)
            self.copied = [torch.cuda.Event() for _ in range(2)]
            self.freed = [torch.cuda.Event() for _ in range(2)]
            self.registration = HostRegistration([m.host for p in self.layers for m in p])
        # (pass, layer, first expert, end) in order; a pass is one entry of begin's list
        self._units: list[tuple[int, int, int, int]] = []
        self._next = 0  # the next unit to compute; units below _next + 2 are queued

    @property
    def layer_nbytes(self) -> list[int]:
        """Each layer's expert bytes: what a streamed layer moves over PCIe."""
        return [sum(m.nbytes for m in parts) for parts in self.layers]

    @property
    def pinned(self) -> bool:
        """The host bytes are page-locked (else copies go through pageable memory)."""
        return self.registration is not None and self.registration.ok

    def begin(self, layers: Sequence[int]) -> None:
        """Start a step that streams `layers` (indices into the constructor's list, in the order
        the step reaches them; repeats allowed): queues the first two units' copies."""
        step = self.experts_per_unit
        self._units = [(p, layer, e0, min(e0 + step, self.num_experts))
                       for p, layer in enumerate(layers)
                       for e0 in range(0, self.num_experts, step)]
        self._next = 0
        for u in range(min(2, len(self._units))):
            self._copy(u)

    def run(self, layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
            bm: int | None = None) -> torch.Tensor:
        """x [N, H] f32, ids [N, K], weights [N, K] on the device -> [N, H] f32: `layer`'s
        routed experts for every row (the next layer `begin` named). `bm` forces the
        grouped launches' block size (warm-up)."""
        from gpu_kernels import moe_dense, moe_grouped

        n, k = ids.shape
        bm = bm or moe_grouped.block_rows(n * k, self.num_experts)
        if self._next >= len(self._units) or self._units[self._next][1] != layer:
            raise RuntimeError(f"MoE layer {layer} is not the next one ExpertStream.begin "
                               f"queued")
        x, out = x.float().contiguous(), None
        this = self._units[self._next][0]
        while self._next < len(self._units) and self._units[self._next][0] == this:
            u = self._next
            _, _, e0, e1 = self._units[u]
            s = u % 2
            if self.cuda:
                torch.cuda.current_stream(self.device).wait_event(self.copied[s])
            planes, at = [], 0
            for m in self.layers[layer]:
                size = (e1 - e0) * m.expert_nbytes
                planes.append(m.planes(self.slots[s][at:at + size], e1 - e0))
                at += size
            if self.cuda:
                self.freed[s].record()
            self._next += 1
            if u + 2 < len(self._units):
                self._copy(u + 2)
            held = ids if e1 - e0 == self.num_experts else \
                torch.where((ids >= e0) & (ids < e1), ids - e0, -1)  # [N, K] local, -1: not here
            if self.dense and n * k >= moe_dense.DENSE_MIN_PAIRS_PER_EXPERT * self.num_experts:
                part = moe_dense.moe_experts_dense(x, held, weights, tuple(planes[:-1]),
                                                   planes[-1], e1 - e0)  # [N, H]
            else:
                part = moe_grouped.moe_experts(x, held, weights, tuple(planes[:-1]), planes[-1],
                                               e1 - e0, bm=bm, fp16=self.fp16)  # [N, H]
            out = part if out is None else out.add_(part)
        return out

    def _copy(self, u: int) -> None:
        """Queue unit u's host-to-device copies into raw slot u % 2 on the copy stream."""
        _, layer, e0, e1 = self._units[u]
        s = u % 2
        if self.cuda:
            with torch.cuda.stream(self.copy_stream):
                self.copy_stream.wait_event(self.freed[s])
                self._copy_bytes(layer, e0, e1, self.slots[s])
                self.copied[s].record(self.copy_stream)
        else:
            self._copy_bytes(layer, e0, e1, self.slots[s])

    def _copy_bytes(self, layer: int, e0: int, e1: int, slot: torch.Tensor) -> None:
        at = 0
        for m in self.layers[layer]:
            src = _host_tensor(m.host[e0:e1].reshape(-1))
            slot[at:at + src.numel()].copy_(src, non_blocking=True)
            at += src.numel()


def expert_memory(layers: Sequence[tuple[StreamTensor, ...]], dense: bool) -> int:
    """GPU bytes the stream holds per expert of a unit (the most any layer needs): its bytes
    times BYTES_PER_UNIT_BYTE, plus its largest tensor's fp16 rows where `dense`."""
    nbytes = max(sum(m.expert_nbytes for m in parts) for parts in layers)
    rows16 = max(2 * m.rows * m.cols for parts in layers for m in parts) if dense else 0
    return int(BYTES_PER_UNIT_BYTE * nbytes) + rows16


def _host_tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor over the GGUF's read-only map; nothing writes through it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "the given NumPy array is not writable"
        return torch.from_numpy(a)
