"""The KV cache's size when --cache-lens is left open (hybrid/model/kv_budget.py): the default
on the CPU, toward the model's whole context on a GPU within a third of its free memory, never
below the default the plan was checked with, whole pages."""

from __future__ import annotations

import pytest

from hybrid.engine.config import EngineConfig
from hybrid.model.kv_budget import DEFAULT_CACHE_LENS, GPU_SHARE, auto_cache_lens

V3_TOKEN = 61 * 576 * 2  # bytes of one token's latent over V3's layers, bf16
GIB = 2**30


@pytest.mark.parametrize("context,free,want", [
    (163840, None, DEFAULT_CACHE_LENS),  # no GPU: the default
    (163840, 60 * GIB, 163840),  # a big GPU: the whole context
    (163840, 8 * GIB, (8 * GIB // GPU_SHARE // V3_TOKEN) // 64 * 64),  # a third of what is free
    (163840, 1 * GIB, DEFAULT_CACHE_LENS),  # never below what the plan was checked with
    (4096, 60 * GIB, DEFAULT_CACHE_LENS),  # a short-context model: still the default
])
def test_auto_cache_lens(context, free, want) -> None:
    got = auto_cache_lens(context, V3_TOKEN, free, 64)
    assert got == want and got % 64 == 0


def test_the_engine_chooses_cache_lens_when_left_open(models) -> None:
    """On the CPU the engine's config holds the default, and the scheduler's request limit
    follows it; a given --cache-lens stays as given."""
    from hybrid.engine.llm import LLM

    path = str(models.path("tiny-v3", "q4_k_m"))
    llm = LLM(path, "cpu", engine_config=EngineConfig(max_batch_size=2, page_size=16))
    assert EngineConfig().cache_lens is None
    assert llm.engine.config.cache_lens == DEFAULT_CACHE_LENS
    assert llm.engine.scheduler.max_request_tokens == min(DEFAULT_CACHE_LENS,
                                                         llm.engine.spec.context_length)
    llm = LLM(path, "cpu", engine_config=EngineConfig(max_batch_size=2, page_size=16,
                                                      cache_lens=256))
    assert llm.engine.config.cache_lens == 256 and llm.engine.scheduler.max_request_tokens == 256
