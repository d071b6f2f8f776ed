"""Run the model for one sequence: prefill a prompt, then decode token by token.

This is the reference runner over transformers' own KV cache. The serving engine (continuous
batching over a paged latent KV cache) replaces it; both must produce the same tokens.
"""

from __future__ import annotations

import torch
from torch import nn


class SequenceRunner:
    """Holds one sequence's KV cache. logits: [V] fp32 for the last position."""

    def __init__(self, model: nn.Module) -> None:
        from transformers import DynamicCache

        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.num_tokens = 0

    @torch.inference_mode()
    def forward(self, token_ids: list[int]) -> torch.Tensor:
        ids = torch.tensor([token_ids], dtype=torch.long)  # [1, T]
        positions = torch.arange(self.num_tokens, self.num_tokens + len(token_ids)).unsqueeze(0)
        out = self.model(
            input_ids=ids,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.num_tokens += len(token_ids)
        return out.logits[0, -1].float()  # [V]
