"""What one forward over mixed decode and prefill tokens needs to know about its sequences.

The model runs the batch's N tokens as rows [N, H]: every layer but attention works token by
token, so only attention needs to know which tokens form which sequence. The scheduler puts
decodes first: rows [0, B) are one token each of B sequences (attention reads their pages
through `page_table` [B, P] and `seq_lens` [B]); each prefill chunk after them is q_len
consecutive rows at positions [kv_len - q_len, kv_len), attending to its kv_len cached tokens,
the new ones included.

Every index is built on the host into one int64 array and copied to the device once per step
(`StepLayout` says where each field sits, so a captured CUDA graph can read the same fields
from a static buffer of the same layout). Every field a kernel reads starts 16 bytes into the
array's alignment (ALIGN elements): Triton compiles a kernel anew for a pointer that is not
16-byte aligned, so an unaligned field would make a prompt of odd length pay a compilation
that the start-up warm-up did not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import numpy as np
import torch

from hybrid.engine.step.kv_cache import PagedLatentCache

ALIGN = 2  # int64 elements: 16 bytes, the pointer alignment Triton specializes on


class SequenceRows(NamedTuple):
    """One sequence's rows in a step (a plain 4-tuple in this order is taken too)."""

    token_ids: list[int]  # its new tokens: one for a decode, a chunk of its prompt otherwise
    page_ids: list[int]  # its KV cache pages, covering positions [0, start + len(token_ids))
    start: int  # the position of its first new token
    samples: bool  # its last row goes through the head and samples a token

    @classmethod
    def of(cls, chunks) -> list[SequenceRows]:
        """Scheduled chunks (scheduler.ScheduledChunk) as a step takes them: their request's
        pages as they are now."""
        return [cls(c.token_ids, c.request.page_ids, c.start, c.samples) for c in chunks]


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class SequenceSpan:
    q_start: int  # first row of this prefill chunk in the batch
    q_len: int
    kv_len: int
    kv_slots: torch.Tensor  # [kv_len] cache rows of positions 0..kv_len-1 (int64)


@dataclass(frozen=True)
class StepLayout:
    """Field offsets in the packed int64 index array of a step."""

    num_tokens: int  # N
    num_decodes: int  # B
    max_pages: int  # P: page-table columns
    num_samples: int  # R

    # computed once a layout (a CUDA graph bucket's is packed every decode step)
    @cached_property
    def fields(self) -> dict[str, tuple[int, tuple[int, ...]]]:
        n, b, p, r = self.num_tokens, self.num_decodes, self.max_pages, self.num_samples
        shapes = {"input_ids": (n,), "positions": (n,), "slots": (n,), "seq_lens": (b,),
                  "page_table": (b, p), "sample_rows": (r,)}
        out, at = {}, 0
        for name, shape in shapes.items():
            out[name] = (at, shape)
            at += _aligned(math.prod(shape))
        return out

    @cached_property
    def size(self) -> int:
        at, shape = list(self.fields.values())[-1]
        return at + _aligned(math.prod(shape))

    def views(self, buf):
        """Each field of `buf` (a packed int64 array or tensor) in its shape."""
        return {k: buf[at:at + math.prod(s)].reshape(s) for k, (at, s) in self.fields.items()}


@dataclass
class ForwardBatch:
    num_tokens: int
    num_decodes: int
    max_decode_len: int  # bounds seq_lens (sizes the attention kernel's split count)
    page_size: int
    input_ids: torch.Tensor  # [N]
    positions: torch.Tensor  # [N]
    slots: torch.Tensor  # [N] the cache row each new token's latent is written to
    seq_lens: torch.Tensor  # [B] decode sequences' lengths, the new token included
    page_table: torch.Tensor  # [B, P] their pages
    sample_rows: torch.Tensor  # [R] rows whose logits are sampled
    prefill_spans: list[SequenceSpan]
    cache: PagedLatentCache
    # the spans for one attention launch: [S, 4] (q_start, q_len, kv_len, offset into
    # prefill_slots) and every span's kv_slots end to end; views of the step's one copy
    prefill_meta: torch.Tensor | None = None
    prefill_slots: torch.Tensor | None = None
    # the decode rows' attention backend (hybrid/engine/attention/) and its plan for this step,
    # set by the backend's prepare hooks before the forward
    attention: object | None = None
    attention_plan: object | None = None
    # (page_table [B, P], seq_lens [B]) as packed on the host, for planners that run there
    host_decodes: tuple | None = None
    _moved: dict = field(default_factory=dict, repr=False)  # per-step memo of on()

    @staticmethod
    def pack(chunks: list[SequenceRows], page_size: int,
             scratch_slot: int, layout: StepLayout | None = None
             ) -> tuple[np.ndarray, StepLayout, list[tuple[int, int, int]], int]:
        """chunks: one SequenceRows per sequence, decodes first.
        -> (packed int64 indices, their layout, prefill spans (q_start, q_len, kv_len) whose
        kv slots follow the layout's fields in the array, then a row (q_start, q_len, kv_len,
        offset of its slots) per span; longest decode sequence).
        `layout` (a CUDA graph's static one) may be larger than the batch: padding decode rows
        get token 0, length 0 and the cache's scratch slot."""
        n = sum(len(t) for t, _, _, _ in chunks)
        b = next((i for i, (ids, _, _, _) in enumerate(chunks) if len(ids) != 1), len(chunks))
        p = max((len(pages) for _, pages, _, _ in chunks[:b]), default=0)
        samples = sum(1 for _, _, _, samples_here in chunks if samples_here)
        layout = layout or StepLayout(n, b, p, samples)
        buf = np.zeros(layout.size, np.int64)
        host = layout.views(buf)
        host["slots"][:] = scratch_slot
        spans, row, ends, kv_parts = [], 0, [], []
        for i, (ids, pages, start, samples_here) in enumerate(chunks):
            q_len = len(ids)
            kv_len = start + q_len
            pos = np.arange(start, kv_len)
            pg = np.asarray(pages, np.int64)
            host["input_ids"][row:row + q_len] = ids
            host["positions"][row:row + q_len] = pos
            host["slots"][row:row + q_len] = pg[pos // page_size] * page_size + pos % page_size
            if i < b:
                host["seq_lens"][i] = kv_len
                host["page_table"][i, :len(pages)] = pg
            else:
                allpos = np.arange(kv_len)
                kv_parts.append(pg[allpos // page_size] * page_size + allpos % page_size)
                spans.append((row, q_len, kv_len))
            row += q_len
            if samples_here:
                ends.append(row - 1)
        host["sample_rows"][:len(ends)] = ends
        offsets = np.cumsum([0] + [kv for _, _, kv in spans])[:-1]
        kv_total = sum(kv for _, _, kv in spans)
        pad = np.zeros(_aligned(kv_total) - kv_total, np.int64)  # meta starts aligned
        meta = [np.array([*span, off], np.int64) for span, off in zip(spans, offsets)]
        packed = np.concatenate([buf, *kv_parts, pad, *meta]) if kv_parts else buf
        max_len = int(max((start + 1 for _, _, start, _ in chunks[:b]), default=0))
        return packed, layout, spans, max_len

    @classmethod
    def from_device(cls, dev: torch.device | torch.Tensor, layout: StepLayout,
                    spans: list[tuple[int, int, int]], max_decode_len: int, page_size: int,
                    cache: PagedLatentCache) -> ForwardBatch:
        """The batch over `dev`, a packed index array already on the device."""
        t = layout.views(dev)
        prefill, at = [], layout.size
        for (q_start, q_len, kv_len) in spans:
            prefill.append(SequenceSpan(q_start, q_len, kv_len, dev[at:at + kv_len]))
            at += kv_len
        meta_at = layout.size + _aligned(at - layout.size)
        return cls(layout.num_tokens, layout.num_decodes, max_decode_len, page_size,
                   t["input_ids"], t["positions"], t["slots"], t["seq_lens"], t["page_table"],
                   t["sample_rows"], prefill, cache,
                   dev[meta_at:meta_at + 4 * len(spans)].reshape(-1, 4), dev[layout.size:at])

    @classmethod
    def build(cls, chunks: list[SequenceRows], page_size: int,
              cache: PagedLatentCache, device: torch.device) -> ForwardBatch:
        """Pack the chunks' indices and copy them to `device` in one copy."""
        packed, layout, spans, max_len = cls.pack(chunks, page_size, cache.scratch_slot)
        dev = torch.from_numpy(packed).to(device)
        return cls._with_host(cls.from_device(dev, layout, spans, max_len, page_size, cache),
                              layout, packed)

    @staticmethod
    def _with_host(fb: ForwardBatch, layout: StepLayout, packed: np.ndarray) -> ForwardBatch:
        host = layout.views(packed)
        fb.host_decodes = (host["page_table"], host["seq_lens"])
        return fb

    @classmethod
    def scratch_prefill(cls, n: int, page_size: int, cache: PagedLatentCache,
                        device: torch.device, samples: int = 1) -> ForwardBatch:
        """One prefill chunk of n tokens (ids 0, positions 0..n-1) whose latents are all
        written to, and read from, the cache's scratch slot, its last `samples` rows sampling:
        a step of n tokens' shapes that touches no request's pages (kernel warm-up)."""
        scratch = torch.full((n,), cache.scratch_slot, dtype=torch.long, device=device)
        meta = torch.tensor([[0, n, n, 0]], dtype=torch.long, device=device)
        return cls(n, 0, 0, page_size, torch.zeros_like(scratch),
                   torch.arange(n, device=device), scratch, scratch[:0],
                   scratch[:0].view(0, 1), torch.arange(n - samples, n, device=device),
                   [SequenceSpan(0, n, n, scratch)], cache, meta, scratch)

    @classmethod
    def scratch_decode(cls, layout: StepLayout, page_size: int, cache: PagedLatentCache,
                       device: torch.device) -> tuple[torch.Tensor, ForwardBatch]:
        """A decode step of layout.num_decodes padding rows (token 0, length 0, the scratch
        slot), every row sampling -> (its packed index array on `device`, the batch over it).
        A CUDA graph captures it and replays it with real rows copied into the array."""
        b = layout.num_decodes
        packed, _, _, _ = cls.pack([], page_size, cache.scratch_slot, layout)
        at = layout.fields["sample_rows"][0]
        packed[at:at + b] = np.arange(b)
        inputs = torch.from_numpy(packed).to(device)
        return inputs, cls._with_host(cls.from_device(inputs, layout, [],
                                                      layout.max_pages * page_size, page_size,
                                                      cache), layout, packed)

    def prefill_index(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The prefill chunks for one attention launch: prefill_meta, prefill_slots and the
        longest q_len."""
        return (self.prefill_meta, self.prefill_slots,
                max((sp.q_len for sp in self.prefill_spans), default=0))

    _MOVED = ("input_ids", "positions", "slots", "seq_lens", "page_table", "sample_rows",
              "prefill_meta", "prefill_slots")

    def on(self, device: torch.device) -> ForwardBatch:
        """This batch with its index tensors on `device` (moved once per step and device)."""
        if self.positions.device == device:
            return self
        key = str(device)
        if key not in self._moved:
            moved = {k: getattr(self, k).to(device) for k in self._MOVED
                     if getattr(self, k) is not None}
            spans = [SequenceSpan(s.q_start, s.q_len, s.kv_len, s.kv_slots.to(device))
                     for s in self.prefill_spans]
            self._moved[key] = ForwardBatch(self.num_tokens, self.num_decodes, self.max_decode_len,
                                            self.page_size, **moved, prefill_spans=spans,
                                            cache=self.cache,
                                            attention=self.attention,
                                            attention_plan=self.attention_plan,
                                            host_decodes=self.host_decodes)
        return self._moved[key]

    def refresh_on(self, device: torch.device) -> ForwardBatch:
        """on(device), its tensors copied again into the same memory where it was moved before:
        a captured step's batch, refilled in place for each replay, and the graphs on `device`
        reading the copies made at capture."""
        key = str(device)
        if self.positions.device == device or key not in self._moved:
            return self.on(device)
        moved = self._moved[key]
        for k in self._MOVED:
            if getattr(self, k) is not None:
                getattr(moved, k).copy_(getattr(self, k), non_blocking=True)
        for mine, theirs in zip(self.prefill_spans, moved.prefill_spans, strict=True):
            theirs.kv_slots.copy_(mine.kv_slots, non_blocking=True)
        return moved
