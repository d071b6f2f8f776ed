"""Run one scheduled batch, mixed prefill chunks and decodes, as a single forward.

All N tokens of the step go through the model as one row [1, N, H]; the attention operators
find their sequences and cache rows in a `ForwardBatch`. Only the rows that sample (the last
token of each chunk that reaches its request's newest token) go through the final norm and
lm_head: with a 129K vocabulary that is most of the head's cost saved during prefill.
"""

from __future__ import annotations

import torch
from torch import nn

from hybrid.engine.config import EngineConfig
from hybrid.engine.forward_batch import ForwardBatch
from hybrid.engine.kv_cache import PagedLatentCache
from hybrid.engine.scheduler import ScheduledBatch
from hybrid.errors import HybridError
from hybrid.ops.mla_attention import MLAAttentionOp


class ModelRunner:
    def __init__(self, model: nn.Module, config: EngineConfig) -> None:
        self.model = model
        self.page_size = config.page_size
        layers = model.model.layers
        attention = [layer.self_attn for layer in layers]
        for i, op in enumerate(attention):
            if not isinstance(op, MLAAttentionOp):
                raise HybridError(
                    f"model.layers.{i}.self_attn is {type(op).__name__}; the serving engine "
                    f"needs the mla_attention operator on every layer's self_attn: add or fix "
                    f"that rule in your optimize-rules file")
        self.cache = PagedLatentCache(attention, config.num_pages * config.page_size)

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> torch.Tensor:
        """-> logits [R, V] fp32, one row per sampling chunk, in batch order."""
        ids = [t for c in batch.chunks for t in c.token_ids]
        fb = ForwardBatch.build([(c.request.page_ids, c.start, len(c.token_ids))
                                 for c in batch.chunks], self.page_size, self.cache)
        inner = self.model.model
        input_ids = torch.tensor(ids, dtype=torch.long)[None]  # [1, N]
        positions = fb.positions[None]  # [1, N]
        hidden = inner.embed_tokens(input_ids)  # [1, N, H]
        position_embeddings = inner.rotary_emb(hidden, positions)
        for layer in inner.layers:
            hidden = layer(hidden, position_embeddings=position_embeddings,
                           position_ids=positions, forward_batch=fb)
        ends, row = [], 0
        for c in batch.chunks:
            row += len(c.token_ids)
            if c.samples:
                ends.append(row - 1)
        if not ends:  # only mid-prompt chunks: nothing to sample this step
            return torch.empty(0, self.model.config.vocab_size)
        picked = hidden[:, torch.tensor(ends, dtype=torch.long, device=hidden.device)]  # [1, R, H]
        return self.model.lm_head(inner.norm(picked))[0].float()  # [R, V]
