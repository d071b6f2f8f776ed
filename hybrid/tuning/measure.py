"""Measured speed for `hybrid tune --measure` (and bench_grammar): decode as the median step
time of `batch` requests decoding at once once their prompts are in (`step_ms`; `decode_ms` on a
fresh engine per rule file), and prefill as one long prompt's tokens per second."""

from __future__ import annotations

import gc
import time
from collections.abc import Mapping

from hybrid.engine.config import EngineConfig
from hybrid.engine.sampling.sampling_params import SamplingParams


def step_ms(llm, batch: int, steps: int, grammar: str | None = None) -> float:
    """Median ms per decode step of `llm` (an unstarted LLM) with `batch` requests in flight,
    each under `grammar` when given."""
    params = SamplingParams(temperature=1.0, seed=0, max_tokens=steps + 16, ignore_eos=True,
                            grammar=grammar)
    reqs = [llm._submit([0, 100 + i, 7, 9], params, lambda e: None) for i in range(batch)]
    while any(r.num_output_tokens < 4 for r in reqs):  # prompts in, kernels compiled
        llm.worker.step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        llm.worker.step()
        times.append(time.perf_counter() - t)
    for r in reqs:
        r.cancel()
    while llm.engine.has_work:
        llm.worker.step()
    return sorted(times)[len(times) // 2] * 1e3


def prefill_tok_s(llm, prompt_tokens: int) -> float:
    """Prompt tokens per second of one `prompt_tokens`-token prompt (its first token out), after
    a short warm-up prompt; at the engine's chunk size."""
    params = SamplingParams(temperature=0, max_tokens=1)
    llm.generate(prompt_token_ids=[[0] + [100 + k % 3000 for k in range(63)]],
                 sampling_params=params)
    prompt = [0] + [1000 + (37 * k) % 3000 for k in range(prompt_tokens - 1)]
    t = time.perf_counter()
    llm.generate(prompt_token_ids=[prompt], sampling_params=params)
    return prompt_tokens / (time.perf_counter() - t)


def on_fresh_engine(gguf_path: str, rules: str, config: EngineConfig, fn,
                    device_map: Mapping[str, str] | None = None):
    """fn(llm) on a fresh engine for rule file `rules`, its CPU pool closed after."""
    from hybrid.engine.llm import LLM

    llm = LLM(gguf_path, rules, device_map=dict(device_map) if device_map else None,
              engine_config=config)
    try:
        return fn(llm)
    finally:
        if llm.engine.cpu_pool is not None:  # its threads, before the next engine starts
            llm.engine.cpu_pool.close()
        del llm
        gc.collect()


def decode_ms(gguf_path: str, rules: str, batch: int = 1, steps: int = 32,
              cpu_threads: int | None = None,
              device_map: Mapping[str, str] | None = None) -> float:
    """step_ms on a fresh engine for rule file `rules`."""
    config = EngineConfig(max_batch_size=max(batch, 1), prefix_cache=False,
                          cpu_threads=cpu_threads)
    return on_fresh_engine(gguf_path, rules, config, lambda llm: step_ms(llm, batch, steps),
                           device_map)
