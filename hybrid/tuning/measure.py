"""Measured speed for `hybrid tune --measure` (and bench_grammar): decode as the median step
time of `batch` requests decoding at once once their prompts are in (`step_ms`; `decode_ms` on a
fresh engine per rule file), the same step with its CPU experts answered at once (`fixed_step_ms`:
what the step costs without them), and prefill as one long prompt's tokens per second."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Mapping

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


def answer_experts_at_once(llm) -> Callable[[], None]:
    """Make every CPU experts call of `llm`'s steps return at once: each ExpertsOp's `run_host`
    and, with whole-step decode graphs, the HostExperts' `run` (each layer's done flag raised as
    soon as its ready flag is; its `prepare` and `wait_driving` do nothing). The routed
    experts' output is then whatever its buffers held: wrong, for timing only. Set on the
    instances (every engine in the process keeps its own experts); -> undo, which puts back
    what the instances held before.
    NOTE: the whole-step graphs are looked up now; capture them before calling this."""
    from hybrid.ops.experts import ExpertsOp

    runner = llm.engine.runner
    ops = [m for m in runner.model.modules() if isinstance(m, ExpertsOp)]
    graphs = getattr(runner, "graphs", None)
    host = graphs.form.host if graphs is not None and graphs.whole_step else None
    patched = [(op, "run_host", _skip) for op in ops]
    if host is not None:  # prepare and wait_driving too: no region starts for beside to await
        patched += [(host, "run", lambda seq, n: _answer_flags(host, seq)),
                    (host, "prepare", _skip), (host, "wait_driving", _skip)]
    missing = object()
    before = [(obj, name, vars(obj).get(name, missing)) for obj, name, _ in patched]
    for obj, name, fn in patched:
        setattr(obj, name, fn)

    def undo() -> None:
        for obj, name, old in before:
            if old is missing:
                delattr(obj, name)  # the class's method again
            else:
                setattr(obj, name, old)
    return undo


def _skip(*args, **kwargs) -> None:
    return None


def _answer_flags(host, seq: int) -> None:
    """Step `seq`'s done flag of every layer, each once the GPU raised the layer's ready flag
    (the graph waits on them in order)."""
    from cpu_kernels.runtime.handshake import set_flag, wait_equal

    ready, done = host.bridge.ready.numpy(), host.bridge.done.numpy()
    for layer in range(len(host.layers)):
        wait_equal(ready, layer, seq, 1 << 40)
        set_flag(done, layer, seq)


def fixed_step_ms(llm, batch: int, steps: int) -> float:
    """step_ms with every CPU experts call answered at once (answer_experts_at_once): the
    step's attention, dense layers, head, hand-overs and overheads alone."""
    undo = answer_experts_at_once(llm)
    try:
        return step_ms(llm, batch, steps)
    finally:
        undo()


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
    return on_fresh_engine(gguf_path, rules, _decode_config(batch, cpu_threads),
                           lambda llm: step_ms(llm, batch, steps), device_map)


def decode_and_fixed_ms(gguf_path: str, rules: str, batch: int, steps: int,
                        cpu_threads: int | None = None,
                        device_map: Mapping[str, str] | None = None) -> tuple[float, float]:
    """(step_ms, fixed_step_ms) on one fresh engine for rule file `rules`, in that order."""
    return on_fresh_engine(
        gguf_path, rules, _decode_config(batch, cpu_threads),
        lambda llm: (step_ms(llm, batch, steps), fixed_step_ms(llm, batch, steps)), device_map)


def _decode_config(batch: int, cpu_threads: int | None) -> EngineConfig:
    return EngineConfig(max_batch_size=max(batch, 1), prefix_cache=False, cpu_threads=cpu_threads)
