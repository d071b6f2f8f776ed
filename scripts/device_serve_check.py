"""On the GPU machine: the batched engine with CUDA placements gives each request what it gets
alone (tiny-v3, DeepSeek-V3.yaml), and what the all-CPU rules give. Prints one line per check."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from hybrid.engine.config import EngineConfig
from hybrid.engine.llm import LLM
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.synth.make_model import MakeModelOptions, make_model
from hybrid.synth.presets import get_preset
from hybrid.synth.vocab import get_vocab


def main() -> int:
    tmp = Path(tempfile.mkdtemp())
    preset = get_preset("tiny-v3")
    path = make_model(MakeModelOptions(preset, "q4_k_m", "legacy", 0, 1, "small"),
                      get_vocab("small", preset.vocab_size), tmp / "tiny.gguf")[0]
    params = SamplingParams(temperature=0, max_tokens=16, logprobs=0, ignore_eos=True)
    prompts = [[(5 * i + j) % 300 + 2 for j in range(3 + 7 * i)] for i in range(8)]
    results = {}
    for rules in ("cpu.yaml", "DeepSeek-V3.yaml"):
        llm = LLM(str(path), rules, engine_config=EngineConfig(chunk_size=16))
        alone = [llm.generate(prompt_token_ids=[p], sampling_params=params)[0].outputs[0]
                 for p in prompts]
        t = time.perf_counter()
        batched = [o.outputs[0] for o in llm.generate(prompt_token_ids=prompts,
                                                      sampling_params=params)]
        dt = time.perf_counter() - t
        same = sum(a.token_ids == b.token_ids for a, b in zip(alone, batched))
        err = max(abs(x - y) for a, b in zip(alone, batched) for x, y in zip(a.logprobs, b.logprobs))
        print(f"{rules:18} batched == alone: {same}/8 prompts, max |dlogprob| {err:.2e}, "
              f"batch of 8 in {dt:.2f} s, max batch {llm.worker.stats().max_batch_requests}")
        results[rules] = [a.token_ids for a in alone]
    agree = sum(a == b for a, b in zip(*results.values()))
    print(f"CUDA rules vs CPU rules: greedy tokens equal on {agree}/8 prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
