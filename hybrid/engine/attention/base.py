"""The decode attention backend's interface (mini-sglang's shape: prepare, prepare for capture,
prepare for replay, run)."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class DecodeAttention(ABC):
    """How one engine's decode rows attend to their pages. A step's plan (what `run` needs
    beyond the batch's tensors: a split count, a planned wrapper) lives on its ForwardBatch as
    `fb.attention_plan`; `fb.attention` is the backend. Every hook leaves both set."""

    name: str  # as --attention-backend names it

    def prepare(self, fb) -> None:
        """An eager step: plan fb's decode rows (fb.host_decodes: their page table and lengths
        as packed on the host)."""
        fb.attention, fb.attention_plan = self, None

    def prepare_for_capture(self, fb, batch: int) -> None:
        """A CUDA graph bucket's scratch batch of `batch` padding rows, before its capture: the
        plan the graph bakes in must serve any lengths the cache can hold."""
        fb.attention, fb.attention_plan = self, None

    def prepare_for_replay(self, fb, page_table, seq_lens) -> None:
        """Before a replay of the graph captured over `fb`: the step's rows as packed on the
        host (page_table [B, P], seq_lens [B], numpy) are already staged for the graph's input
        buffer. Rewrite what the graph reads besides it (nothing for most backends)."""

    @abstractmethod
    def run(self, q_lat: torch.Tensor, q_rope: torch.Tensor, cache: torch.Tensor, fb,
            scale: float, out: torch.Tensor) -> None:
        """The decode rows' attention. q_lat [B, h, c], q_rope [B, h, r] f32 (the first B rows
        of the step, absorbed); cache [slots, c + r] with this step's latents written; fb: the
        step's ForwardBatch on the cache's device -> out [B, h, c] f32 (written)."""
