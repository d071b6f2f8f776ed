"""Where a decode step's time goes, by operator class, at batch 1, 4 and 8.

    python scripts/profile_step.py --gguf-path P --optimize-rules R [--preset v2-lite]

Without --gguf-path it writes a synthetic model of --preset. Steps run eagerly (no CUDA graphs;
scripts/bench_e2e.py times the real thing). Each operator's forward is timed
with a device synchronize before and after (so the sum is honest, the total a little slower
than without the probes); nested operators are counted in their parent only.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

import torch

from hybrid.engine.config import EngineConfig
from hybrid.engine.llm import LLM
from hybrid.engine.sampling.sampling_params import SamplingParams


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def attach_timers(model: torch.nn.Module) -> collections.Counter:
    spent: collections.Counter = collections.Counter()
    depth = [0]
    for module in model.modules():
        if not type(module).__module__.startswith("hybrid.ops"):
            continue
        name = type(module).__name__

        def pre(mod, args, _name=name):
            depth[0] += 1
            if depth[0] == 1:
                _sync()
                mod._t0 = time.perf_counter()

        def post(mod, args, out, _name=name):
            if depth[0] == 1:
                _sync()
                spent[_name] += time.perf_counter() - mod._t0
            depth[0] -= 1

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)
        if hasattr(module, "step"):  # attention's engine path is a method, not forward()
            def step(*args, _mod=module, _orig=module.step, _pre=pre, _post=post, **kw):
                _pre(_mod, args)
                out = _orig(*args, **kw)
                _post(_mod, args, out)
                return out
            module.step = step
    return spent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf-path")
    ap.add_argument("--preset", default="v2-lite")
    ap.add_argument("--optimize-rules", default="DeepSeek-V2-Lite.yaml")
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    path = args.gguf_path
    if path is None:
        from hybrid.synth.make_model import MakeModelOptions, make_model
        from hybrid.synth.presets import get_preset
        from hybrid.synth.vocab import get_vocab

        preset = get_preset(args.preset)
        path = str(make_model(MakeModelOptions(preset, "q4_k_m", "legacy", 0, 1, "small"),
                              get_vocab("small", preset.vocab_size),
                              Path(tempfile.mkdtemp()) / "m.gguf")[0])
    # eager steps: a replayed CUDA graph runs no Python, so nothing could be timed per operator
    llm = LLM(path, args.optimize_rules, engine_config=EngineConfig(cuda_graphs=False,
                                                                prefix_cache=False))
    params = SamplingParams(temperature=0, max_tokens=10_000, ignore_eos=True)
    llm.generate(prompt_token_ids=[[1, 2, 3]], sampling_params=SamplingParams(max_tokens=3))
    spent = attach_timers(llm.loaded.model)
    print(f"{'batch':>5} {'ms/step':>8} {'tok/s':>7}  top operators (ms/step)")
    for batch in (1, 4, 8):
        requests = [llm._submit([5 + i] * 32, params, lambda e: None) for i in range(batch)]
        for _ in range(3):  # prefill and settle
            llm.worker.step()
        spent.clear()
        _sync()
        t = time.perf_counter()
        for _ in range(args.steps):
            llm.worker.step()
        dt = (time.perf_counter() - t) / args.steps
        top = ", ".join(f"{k} {v / args.steps * 1e3:.1f}" for k, v in spent.most_common(6))
        print(f"{batch:>5} {dt * 1e3:>8.1f} {batch / dt:>7.1f}  {top}", flush=True)
        for r in requests:
            llm.worker.cancel(r)
        llm.worker.step()
    for batch in (1, 4):  # prefill: `batch` prompts of 32 tokens in one step
        requests = [llm._submit([9 + i] * 32, params, lambda e: None) for i in range(batch)]
        spent.clear()
        _sync()
        t = time.perf_counter()
        llm.worker.step()
        dt = time.perf_counter() - t
        top = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in spent.most_common(6))
        print(f"prefill {batch}x32: {dt * 1e3:.1f} ms  {top}", flush=True)
        for r in requests:
            llm.worker.cancel(r)
        llm.worker.step()
    return 0


if __name__ == "__main__":
    sys.exit(main())
