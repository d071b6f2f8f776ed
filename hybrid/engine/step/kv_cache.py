"""The paged latent KV cache: one tensor per attention layer, rows addressed by slot.

Row `page * page_size + offset` of every layer's tensor holds one token's latent c and rotated
shared key k_r (concatenated: [c + r] values, 576 for DeepSeek-V3) in that layer's
kv_cache_dtype, on that layer's device. One more row, `scratch_slot`, takes the writes of
padding rows (a CUDA graph's unused batch rows, start-up warm-up) and is never read as a real
token. A model with DeepSeek-V3.2's lightning indexer keeps, per attention layer, a second tensor
of the same rows: each token's indexer key [index_head_dim] (`index_layer`), so everything that
addresses a token's latent by slot (pages, the prefix cache's shared pages) carries its indexer
key too. Which pages a request holds is the scheduler's business (`PageAllocator`); this class
only owns the memory.
"""

from __future__ import annotations

import torch

from hybrid.errors import HybridError


class PagedLatentCache:
    def __init__(self, attention_ops: list, num_slots: int) -> None:
        """attention_ops: each layer's MLAAttentionOp (device, kv_dtype, kv_lora, rope, and
        index_head_dim: 0 without an indexer)."""
        self.num_slots = num_slots
        # Reads only ever touch slots written earlier (the torch path pads with a sequence's own
        # first slot; the decode kernel masks past each length): the rows need no values. A
        # host cache is still written once here (zeros): the OS would otherwise commit its pages
        # as requests first write them, so a server's memory would grow for as long as untouched
        # pages remain (docs/serving.md, "Soak") and a cache the host cannot hold would fail
        # mid-request rather than at start-up.
        def alloc(width: int, op) -> torch.Tensor:
            make = torch.zeros if torch.device(op.device).type == "cpu" else torch.empty
            return make(num_slots + 1, width, dtype=op.kv_dtype, device=op.device)
        try:
            self.layers = [alloc(op.kv_lora + op.rope, op) for op in attention_ops]
            self.index_layers = [alloc(op.index_head_dim, op) if op.index_head_dim else None
                                 for op in attention_ops]
        except (torch.OutOfMemoryError, RuntimeError) as e:
            gib = self.bytes_for(attention_ops, num_slots) / 2**30
            raise HybridError(f"cannot allocate the KV cache ({num_slots} tokens, {gib:.2f} GiB): "
                              f"{e}; lower --cache-lens") from e

    @property
    def scratch_slot(self) -> int:
        return self.num_slots

    @staticmethod
    def bytes_for(attention_ops: list, num_slots: int) -> int:
        return sum(num_slots * (op.kv_lora + op.rope + op.index_head_dim) * op.kv_dtype.itemsize
                   for op in attention_ops)

    def layer(self, index: int) -> torch.Tensor:
        return self.layers[index]  # [slots + 1, c + r]

    def index_layer(self, index: int) -> torch.Tensor | None:
        """The layer's indexer keys [slots + 1, index_head_dim], or None (no indexer)."""
        return self.index_layers[index]
