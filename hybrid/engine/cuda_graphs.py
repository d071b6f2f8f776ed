"""Decode steps replayed as CUDA graphs, one set per batch-size bucket, captured at start-up.

A decode step of B requests runs in the graphs of the smallest bucket >= B: its indices are
packed into the bucket's static input buffer (one host-to-device copy; padding rows get length
0 and the cache's scratch slot), then each device piece of the DecoderProgram replays as one
graph and each host piece (the CPU experts) runs between them, on the first B rows only. The
decode attention's split count is fixed per bucket, sized for the longest sequence the cache
holds; the kernel reads the real lengths from the input buffer.

All buckets share one memory pool, captured largest first; within a bucket the pieces replay
in their capture order, so memory one piece frees and a later one reuses is never live twice.

`whole_step`: each bucket is one graph of the whole step (DecoderProgram.run_on_device: the GPU
raises a flag when a MoE layer's rows are in pinned memory and waits for the flag of the
experts' answer); the host launches it and then drives every layer's CPU experts from one call
(HostExperts) while it runs. Nothing is launched per layer and no host code runs between two
layers' experts but a spin on a flag.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from hybrid.engine.decoder import DecoderProgram, StepState
from hybrid.engine.forward_batch import ForwardBatch, SequenceRows, StepLayout
from hybrid.engine.kv_cache import PagedLatentCache
from hybrid.errors import DeviceLost

log = logging.getLogger("hybrid.engine")


def bucket_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, 12, 16, 24, 32, 48, 64, ... up to max_batch_size (always included)."""
    sizes, b = [], 1
    while b < max_batch_size:
        sizes.append(b)
        b = b * 2 if b < 8 else b + (b // 2 if b & (b - 1) == 0 else b // 3)
    return sizes + [max_batch_size]


@dataclass
class _Captured:
    layout: StepLayout
    inputs: torch.Tensor  # [layout.size] int64 on the device: the static index buffer
    staging: torch.Tensor  # the same, pinned on the host
    state: StepState
    graphs: list[torch.cuda.CUDAGraph | None]  # per piece, None for host pieces; or [whole]


class DecodeGraphs:
    def __init__(self, program: DecoderProgram, cache: PagedLatentCache, page_size: int,
                 max_pages: int, max_batch_size: int, device: torch.device,
                 num_splits: Callable[[int], int],
                 progress: Callable[[str], None] | None = None, whole_step: bool = False,
                 flashinfer=None) -> None:
        """flashinfer: the engine's FlashInferPlans when flashinfer attends the decode rows
        (each bucket's wrapper planned before each replay), else None (ours)."""
        self.program, self.cache, self.page_size = program, cache, page_size
        self.flashinfer = flashinfer
        self.max_pages, self.device = max_pages, device
        self.host = None
        if whole_step:
            from hybrid.engine.host_experts import HostExperts

            program.bridge.use_flags(len(program.moe_layers))
            self.host = HostExperts(program.moe_layers, program.bridge)
            if progress is not None:
                progress("compiling the CPU experts' step driver")
            self.host.warm_up()
        self.sizes = bucket_sizes(max_batch_size)
        self.pool = torch.cuda.graph_pool_handle()
        self._captured: dict[int, _Captured] = {}
        for i, b in enumerate(sorted(self.sizes, reverse=True)):
            if progress is not None:
                progress(f"capturing decode graphs: batch {b} ({i + 1}/{len(self.sizes)})")
            self._captured[b] = self._capture(b, num_splits(b))

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    def _state(self, b: int, num_splits: int) -> tuple[StepLayout, torch.Tensor, StepState]:
        layout = StepLayout(b, b, self.max_pages, b)
        inputs, fb = ForwardBatch.scratch_decode(layout, self.page_size, self.cache, self.device)
        if self.flashinfer is not None:  # padding rows: planned as one token of page 0
            self.flashinfer.attach(fb, self.flashinfer.for_graph(b))
        return layout, inputs, StepState(fb, num_real=b, num_splits=num_splits)

    def _capture(self, b: int, num_splits: int) -> _Captured:
        layout, inputs, state = self._state(b, num_splits)
        self.program.run(state)  # warm-up: compiles every kernel of this shape
        torch.cuda.synchronize(self.device)
        if self.host is not None:
            # flags and seq are all 0: the waits pass at once (this compiles the hand-over
            # kernels outside the capture)
            self.program.run_on_device(state)
            torch.cuda.synchronize(self.device)
            graphs = [self._graph(self.program.run_on_device, state)]
        else:  # host work is never captured
            graphs = [self._graph(piece.run, state) if piece.on_device else None
                      for piece in self.program.pieces]
        torch.cuda.synchronize(self.device)
        staging = torch.empty(layout.size, dtype=torch.int64, pin_memory=True)
        return _Captured(layout, inputs, staging, state, graphs)

    def _graph(self, work: Callable[[StepState], object], state: StepState
               ) -> torch.cuda.CUDAGraph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            work(state)
        return g

    def run(self, chunks: list[SequenceRows]) -> torch.Tensor:
        """chunks: one decode (one token, its pages, its position, sampling) per request ->
        logits [B, V]."""
        b = len(chunks)
        size = next(s for s in self.sizes if s >= b)
        cap = self._captured[size]
        packed, _, _, _ = ForwardBatch.pack(chunks, self.page_size, self.cache.scratch_slot,
                                            cap.layout)
        at = cap.layout.fields["sample_rows"][0]
        packed[at + b:at + size] = np.arange(b, size)  # padding rows sample too (discarded)
        cap.staging.numpy()[:] = packed
        if self.flashinfer is not None:  # rewrites the buffers the graph reads
            host = cap.layout.views(cap.staging)
            cap.state.fb.decode_attention.plan(host["page_table"], host["seq_lens"])
        cap.inputs.copy_(cap.staging, non_blocking=True)
        cap.state.num_real = b
        if self.host is not None:
            self._run_whole(cap, b)
            return cap.state.logits[:b]
        for piece, graph in zip(self.program.pieces, cap.graphs):
            if graph is not None:
                graph.replay()
            else:
                piece.run(cap.state)
        return cap.state.logits[:b]

    def _run_whole(self, cap: _Captured, b: int) -> None:
        bridge = self.program.bridge
        if bridge.gave_up:
            raise DeviceLost("a CUDA graph stopped waiting for the CPU experts (see the log "
                              "for the failure before it); restart the server")
        seq = bridge.next_seq()  # before the replay, on its stream
        cap.graphs[0].replay()
        self.host.run(seq, b)
