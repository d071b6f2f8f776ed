"""DeepSeek-V4's two bundled layouts on one file, in one process: DeepSeek-V4.yaml (every linear
layer on the GPU in the file's blocks, transformers' attention on the GPU) against
DeepSeek-V4-cpu.yaml (transformers' modules in fp32 on the CPU); the routed experts on the CPU
kernels in both (fast mode). Through `hybrid.LLM` with the engine's defaults.

    python scripts/bench_v4_layouts.py --gguf-path FILE [--prompt 512] [--new 32]
        [--layouts DeepSeek-V4,DeepSeek-V4-cpu] [--json out.json]

Per layout: the prompt's time to first token, the decode rate of one stream (medians of
--repeats), and the greedy tokens; then the ratio and whether the layouts' tokens agree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from hybrid.engine.llm import LLM
from hybrid.engine.sampling.sampling_params import SamplingParams


def _timed(llm: LLM, prompt: list[int], tokens: int) -> tuple[float, list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    t = time.perf_counter()
    out = llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0].outputs[0]
    return time.perf_counter() - t, out.token_ids


def _run(llm: LLM, prompt: list[int], new: int) -> tuple[float, float, list[int]]:
    """-> (seconds to the first token, decode tokens a second, the greedy tokens): a request
    of one token, then one of new + 1; the difference is the new tokens' decode (no prefix
    cache on this runner: each request computes its prompt)."""
    first, _ = _timed(llm, prompt, 1)
    whole, tokens = _timed(llm, prompt, new + 1)
    return first, new / max(1e-9, whole - first), tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf-path", required=True)
    ap.add_argument("--layouts", default="DeepSeek-V4,DeepSeek-V4-cpu")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = {}
    for layout in a.layouts.split(","):
        t = time.perf_counter()
        llm = LLM(a.gguf_path, layout)
        start = time.perf_counter() - t
        vocab = llm.loaded.spec.vocab_size
        prompt = [int(t) for t in np.random.default_rng(0).integers(3, vocab, size=a.prompt)]
        _run(llm, prompt, 2)  # warm-up: the prompt's and a decode's kernels compiled
        runs = [_run(llm, prompt, a.new) for _ in range(a.repeats)]
        rows[layout] = {"start_s": start,
                        "ttft_s": statistics.median(r[0] for r in runs),
                        "decode_tok_s": statistics.median(r[1] for r in runs),
                        "tokens": runs[0][2]}
        print(layout, {k: v for k, v in rows[layout].items() if k != "tokens"}, flush=True)
        del llm  # its worker idles; the next layout's weights are loaded beside it
    names = list(rows)
    print(f"\nfile {a.gguf_path}; prompt {a.prompt} tokens, {a.new} new, medians of {a.repeats}")
    print("| layout | start s | TTFT s | decode tok/s |")
    print("|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['start_s']:.1f} | {r['ttft_s']:.3f} | {r['decode_tok_s']:.2f} |")
    if len(names) == 2:
        a0, b0 = rows[names[0]], rows[names[1]]
        same = sum(x == y for x, y in zip(a0["tokens"], b0["tokens"]))
        print(f"{names[0]} / {names[1]}: decode {a0['decode_tok_s'] / b0['decode_tok_s']:.2f}x, "
              f"TTFT {b0['ttft_s'] / a0['ttft_s']:.2f}x faster; greedy tokens equal "
              f"{same}/{len(a0['tokens'])}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
