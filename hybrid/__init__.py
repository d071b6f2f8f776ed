"""hybrid: DeepSeek MoE GGUF inference on GPU + CPU."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["LLM", "SamplingParams"]

if TYPE_CHECKING:
    from hybrid.engine.llm import LLM
    from hybrid.engine.sampling.sampling_params import SamplingParams


def __getattr__(name: str):
    # Lazy: `import hybrid` stays cheap (no torch/transformers) for tools that need only a part.
    if name == "LLM":
        from hybrid.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from hybrid.engine.sampling.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(name)
