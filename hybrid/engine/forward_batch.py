"""What one forward over mixed prefill and decode tokens needs to know about its sequences.

The model runs the batch's N tokens as one row [1, N, H]: every layer but attention works
token by token, so only attention needs to know which tokens form which sequence. A sequence
contributes q_len consecutive tokens (a prefill chunk, or 1 for a decode) at positions
[kv_len - q_len, kv_len); it attends to its kv_len cached tokens, the new ones included.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hybrid.engine.kv_cache import PagedLatentCache


@dataclass(frozen=True)
class SequenceSpan:
    q_start: int  # first row of this sequence in the batch
    q_len: int
    kv_len: int
    kv_slots: torch.Tensor  # [kv_len] cache rows of positions 0..kv_len-1 (cpu, long)


@dataclass
class ForwardBatch:
    positions: torch.Tensor  # [N] long, cpu
    slots: torch.Tensor  # [N] long: the cache row each new token's latent is written to
    spans: list[SequenceSpan]
    cache: PagedLatentCache
    _on_device: dict = field(default_factory=dict, repr=False)  # per-step memo only

    @classmethod
    def build(cls, sequences: list[tuple[list[int], int, int]], page_size: int,
              cache: PagedLatentCache) -> ForwardBatch:
        """sequences: (page_ids, start position, number of new tokens), in batch row order."""
        positions, slots, spans, row = [], [], [], 0
        for page_ids, start, n in sequences:
            kv_len = start + n
            pos = torch.arange(kv_len)
            pages = torch.tensor(page_ids, dtype=torch.long)
            kv_slots = pages[pos // page_size] * page_size + pos % page_size  # [kv_len]
            positions.append(pos[start:])
            slots.append(kv_slots[start:])
            spans.append(SequenceSpan(row, n, kv_len, kv_slots))
            row += n
        return cls(torch.cat(positions), torch.cat(slots), spans, cache)

    @property
    def decode_spans(self) -> list[SequenceSpan]:
        return [s for s in self.spans if s.q_len == 1]

    @property
    def prefill_spans(self) -> list[SequenceSpan]:
        return [s for s in self.spans if s.q_len > 1]

    def on(self, device: torch.device) -> dict:
        """Index tensors on `device` (built once per device and step, shared by every layer):
        slots [N]; decode_rows [B]; decode_slots [B, S_max] padded with each sequence's own
        first slot; decode_valid [B, S_max] bool; prefill_slots: one [kv_len] per prefill span."""
        key = str(device)
        if key not in self._on_device:
            d = self.decode_spans
            t = {"slots": self.slots}
            if d:
                s_max = max(s.kv_len for s in d)
                pad = torch.stack([torch.cat([s.kv_slots, s.kv_slots[:1].expand(s_max - s.kv_len)])
                                   for s in d])
                t["decode_rows"] = torch.tensor([s.q_start for s in d])
                t["decode_slots"] = pad
                lens = torch.tensor([s.kv_len for s in d])
                t["decode_valid"] = torch.arange(s_max)[None, :] < lens[:, None]
            moved = {k: v.to(device, non_blocking=True) for k, v in t.items()}
            moved["prefill_slots"] = [s.kv_slots.to(device, non_blocking=True)
                                      for s in self.prefill_spans]
            self._on_device[key] = moved
        return self._on_device[key]
