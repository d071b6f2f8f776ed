"""Measured decode speed: `batch` requests decoding at once, the median step time over `steps`
steps once their prompts are in (`step_ms` on an engine; `decode_ms` on a fresh one per rule
file, for `hybrid tune --measure`)."""

from __future__ import annotations

import gc
import time
from collections.abc import Mapping

from hybrid.engine.config import EngineConfig
from hybrid.engine.sampling_params import SamplingParams


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


def decode_ms(gguf_path: str, rules: str, batch: int = 1, steps: int = 32,
              cpu_threads: int | None = None,
              device_map: Mapping[str, str] | None = None) -> float:
    """step_ms on a fresh engine for rule file `rules` (its CPU pool closed after)."""
    from hybrid.engine.llm import LLM

    config = EngineConfig(max_batch_size=max(batch, 1), prefix_cache=False,
                          cpu_threads=cpu_threads)
    llm = LLM(gguf_path, rules, device_map=dict(device_map) if device_map else None,
              engine_config=config)
    try:
        return step_ms(llm, batch, steps)
    finally:
        if llm.engine.cpu_pool is not None:  # its threads, before the next engine starts
            llm.engine.cpu_pool.close()
        del llm
        gc.collect()
