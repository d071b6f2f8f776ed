"""flashinfer's paged MLA decode (gpu_kernels.mla_decode_flashinfer, when flashinfer is
installed). Error against the float64 reference ~4e-3 (bf16 queries and probabilities).

A plan is per step: every layer's decode rows share the lengths and pages. Eager steps plan one
wrapper from the step's packed host indices; each CUDA graph bucket owns a wrapper whose fixed
buffers its graph reads, planned again from the staged indices before each replay.
"""

from __future__ import annotations

import logging

import torch

from hybrid.engine.attention.base import DecodeAttention

log = logging.getLogger("hybrid.engine")


class FlashInferDecode(DecodeAttention):
    name = "flashinfer"

    def __init__(self, op, page_size: int, max_pages: int) -> None:
        """op: an MLAAttentionOp (every layer's match it: heads, dims, scale, cache dtype).
        Builds flashinfer's kernels now (JIT, nvcc): a build that fails fails at start-up."""
        from gpu_kernels.mla_decode_flashinfer import WORKSPACE_BYTES, FlashInferMLADecode

        # one scratch for every wrapper: steps run one after another on one stream
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=op.device)
        self._make = lambda **kw: FlashInferMLADecode(
            op.device, op.heads, op.kv_lora, op.rope, page_size, op.scale, op.kv_dtype,
            workspace=workspace, **kw)
        self.max_pages = max_pages
        self.eager = self._make()
        self._graphs: dict[int, object] = {}
        # one row over page 0 of a scratch cache
        scratch = torch.zeros(page_size + 1, op.kv_lora + op.rope, dtype=op.kv_dtype,
                              device=op.device)
        self.eager.plan(torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32))
        q = torch.zeros(1, op.heads, op.kv_lora + op.rope, device=op.device)
        self.eager.run(q[..., :op.kv_lora], q[..., op.kv_lora:], scratch)
        log.info("decode attention: flashinfer (%s)", self.eager.backend)

    def for_graph(self, batch: int):
        """The wrapper a CUDA graph of `batch` decode rows captures (made once: its fixed
        buffers are what the graph reads)."""
        if batch not in self._graphs:
            self._graphs[batch] = self._make(graph_batch=batch, max_pages=self.max_pages)
        return self._graphs[batch]

    def prepare(self, fb) -> None:
        fb.attention, fb.attention_plan = self, None
        if fb.num_decodes:  # a batch without decode rows has nothing to attend
            self.eager.plan(*fb.host_decodes)
            fb.attention_plan = self.eager

    def prepare_for_capture(self, fb, batch: int) -> None:
        wrapper = self.for_graph(batch)
        wrapper.plan(*fb.host_decodes)  # the padding rows: one token of page 0
        fb.attention, fb.attention_plan = self, wrapper

    def prepare_for_replay(self, fb, page_table, seq_lens) -> None:
        fb.attention_plan.plan(page_table, seq_lens)  # rewrites the buffers the graph reads

    def run(self, q_lat, q_rope, cache, fb, scale, out) -> None:
        fb.attention_plan.run(q_lat, q_rope, cache, out=out)
