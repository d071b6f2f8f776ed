"""Ours: gpu_kernels.mla_decode, one launch per layer for every decode row, split over the
keys (flash-decoding). Error against the float64 reference ~3e-6 (bf16x2 products)."""

from __future__ import annotations

from hybrid.engine.attention.base import DecodeAttention


class TritonDecode(DecodeAttention):
    name = "triton"

    def __init__(self, heads: int, capacity: int) -> None:
        """heads: the model's attention heads; capacity: the most tokens a sequence can hold
        (a captured graph's split count is sized for it)."""
        self.heads, self.capacity = heads, capacity

    def prepare(self, fb) -> None:
        """The split count follows this step's longest sequence."""
        from gpu_kernels.mla_decode import choose_splits

        fb.attention, fb.attention_plan = self, None
        if fb.num_decodes:  # a batch without decode rows has nothing to attend
            fb.attention_plan = choose_splits(fb.num_decodes, self.heads,
                                              max(fb.max_decode_len, 1))

    def prepare_for_capture(self, fb, batch: int) -> None:
        """The split count is fixed in the graph: sized for the longest sequence the cache
        holds (the kernel reads the real lengths from the input buffer)."""
        from gpu_kernels.mla_decode import choose_splits

        fb.attention = self
        fb.attention_plan = choose_splits(batch, self.heads, self.capacity)

    def run(self, q_lat, q_rope, cache, fb, scale, out) -> None:
        from gpu_kernels.mla_decode import mla_decode

        mla_decode(q_lat, q_rope, cache, fb.page_table, fb.seq_lens, fb.page_size, scale,
                   fb.attention_plan, out=out)
