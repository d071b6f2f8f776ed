"""A CUDA graph bucket's static buffers: the packed index array its graphs read on the device,
its pinned host twin, and the StepState over them.

A decode step of B requests replays the graphs of a bucket of `size` >= B rows: its indices are
packed into the staging buffer (padding rows get token 0, length 0 and the cache's scratch
slot), the attention backend rewrites what else the graphs read (prepare_for_replay), and one
kernel reads the array from pinned memory (gpu_kernels/handshake.py's fetch: a copy would queue
behind a long prompt's expert uploads on the host-to-device copy engine). That kernel is
launched by `load`, or, for graphs that capture `fetch` as their first work (the whole-step
form), by the replay itself: nothing is launched between staging and replaying. Either way the
staging buffer is rewritten only after the step that read it is past its first MoE layer (its
fetch comes before that layer's hand-over, which the host's experts answered).
Padding rows sample too; their logits are dropped. A decode row's input token may be one the
step before sampled and the host has not read back: staged as -(j + 1), the fetch takes it from
the device's carried ids (row j of that step's samples; the engine's overlapped decode).
"""

from __future__ import annotations

import numpy as np
import torch

from gpu_kernels.handshake import fetch
from hybrid.engine.step.forward_batch import ForwardBatch, SequenceRows, StepLayout
from hybrid.engine.step.kv_cache import PagedLatentCache
from hybrid.engine.step.step_state import StepState


class StaticStep:
    def __init__(self, size: int, page_size: int, max_pages: int, cache: PagedLatentCache,
                 device: torch.device, attention, carried: torch.Tensor) -> None:
        """A decode step of `size` padding rows whose page tables hold up to max_pages pages;
        attention: the engine's decode attention backend (prepared for capture here);
        carried: [J] int64 on the device, the sampled ids a staged -(j + 1) names."""
        self.size, self.page_size, self.cache = size, page_size, cache
        self.attention, self.carried = attention, carried
        self.layout = StepLayout(size, size, max_pages, size)
        assert self.layout.fields["input_ids"][0] == 0  # the fetch's span: the first `size`
        # [layout.size] int64: the device buffer the graphs read, and its pinned staging twin
        self.inputs, fb = ForwardBatch.scratch_decode(self.layout, page_size, cache, device)
        attention.prepare_for_capture(fb, size)
        self.staging = torch.empty(self.layout.size, dtype=torch.int64, pin_memory=True)
        # the capture's indices back through the staging buffer: load's kernel compiled now,
        # not in the first request's step
        self.staging.copy_(self.inputs)
        self.fetch()
        # the staged fields as numpy views, and where the sampled rows sit: made once (the
        # buffer never moves), not on every replay
        self._host = self.layout.views(self.staging.numpy())
        self._sample_at = self.layout.fields["sample_rows"][0]
        self.state = StepState(fb, num_real=size, crossings={})

    def load(self, chunks: list[SequenceRows], fetch_now: bool = True) -> None:
        """Stage a step's decode rows (len(chunks) <= size) into the buffers the graphs read;
        fetch_now False: the graphs fetch the staged rows themselves (captured `fetch`)."""
        b = len(chunks)
        packed, _, _, _ = ForwardBatch.pack(chunks, self.page_size, self.cache.scratch_slot,
                                            self.layout)
        at = self._sample_at
        packed[at + b:at + self.size] = np.arange(b, self.size)
        self.staging.numpy()[:] = packed
        self.attention.prepare_for_replay(self.state.fb, self._host["page_table"],
                                          self._host["seq_lens"])
        if fetch_now:
            self.fetch()
        self.state.num_real = b

    def fetch(self) -> None:
        """GPU work: the staged rows into the device buffer the graphs read (input tokens
        staged as -(j + 1) from the carried ids)."""
        fetch(self.staging, self.inputs, self.carried, self.size)
