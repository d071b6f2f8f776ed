"""The paged latent KV cache: one tensor per attention layer, rows addressed by slot.

Row `page * page_size + offset` of every layer's tensor holds one token's latent c and rotated
shared key k_r (concatenated: [c + r] values, 576 for DeepSeek-V3) in that layer's
kv_cache_dtype, on that layer's device. One more row, `scratch_slot`, takes the writes of
padding rows (a CUDA graph's unused batch rows, start-up warm-up) and is never read as a real
token. Which pages a request holds is the scheduler's business (`PageAllocator`); this class
only owns the memory.
"""

from __future__ import annotations

import torch

from hybrid.errors import HybridError


class PagedLatentCache:
    def __init__(self, attention_ops: list, num_slots: int) -> None:
        """attention_ops: each layer's MLAAttentionOp (device, kv_dtype, kv_lora, rope)."""
        self.num_slots = num_slots
        # torch.empty: the OS commits memory as pages are first written. Reads only ever touch
        # slots written earlier (the torch path pads with a sequence's own first slot; the
        # decode kernel masks past each length), so the uninitialized rows are never read.
        try:
            self.layers = [torch.empty(num_slots + 1, op.kv_lora + op.rope, dtype=op.kv_dtype,
                                       device=op.device) for op in attention_ops]
        except (torch.OutOfMemoryError, RuntimeError) as e:
            gib = self.bytes_for(attention_ops, num_slots) / 2**30
            raise HybridError(f"cannot allocate the KV cache ({num_slots} tokens, {gib:.2f} GiB): "
                              f"{e}; lower --cache-lens") from e

    @property
    def scratch_slot(self) -> int:
        return self.num_slots

    @staticmethod
    def bytes_for(attention_ops: list, num_slots: int) -> int:
        return sum(num_slots * (op.kv_lora + op.rope) * op.kv_dtype.itemsize
                   for op in attention_ops)

    def layer(self, index: int) -> torch.Tensor:
        return self.layers[index]  # [slots + 1, c + r]
