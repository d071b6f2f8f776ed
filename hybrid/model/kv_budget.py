"""How many tokens the paged KV cache holds when `--cache-lens` is left to the engine.

The plan is checked against the GPU with DEFAULT_CACHE_LENS tokens of cache (rules/explain.py),
so that many always fit. Where attention runs on a GPU, the cache then grows toward one request
of the model's whole context (as llama.cpp's `-c 0` sizes it), within a third of the memory free
after the weights loaded: the rest stays for prompt activations (prefill_chunk.py takes a
quarter of what is free after the cache) and streamed experts. `rules explain` shows the choice
its budget gives. On the CPU it stays at the
default: host memory is plentiful, but attention over a long context there is slow.
"""

from __future__ import annotations

DEFAULT_CACHE_LENS = 32768  # tokens; what the plan is checked with
# requests in flight at once (the engine's default; the plan counts DeepSeek-V4's prefix store,
# whose entries follow it, by it)
DEFAULT_MAX_BATCH_SIZE = 16
GPU_SHARE = 3  # the cache takes at most 1/GPU_SHARE of the GPU memory free after the weights


def auto_cache_lens(context_length: int, bytes_per_token: int, gpu_free_bytes: int | None,
                    page_size: int) -> int:
    """The cache's tokens, a whole number of pages: DEFAULT_CACHE_LENS without a GPU
    (`gpu_free_bytes` None); with one, up to `context_length` as GPU_SHARE allows, never below
    DEFAULT_CACHE_LENS."""
    tokens = DEFAULT_CACHE_LENS
    if gpu_free_bytes is not None and bytes_per_token > 0:
        fits = gpu_free_bytes // GPU_SHARE // bytes_per_token
        tokens = max(DEFAULT_CACHE_LENS, min(context_length, fits))
    return max(page_size, tokens - tokens % page_size)
