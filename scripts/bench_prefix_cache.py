"""A 3-turn chat whose history reaches ~2,000 tokens: time to first token of each turn with the
prefix cache on and off, same model, one process, and the third turn's ratio.

    python scripts/bench_prefix_cache.py [--gguf-path P] [--optimize-rules R] [--first 1800]
        [--message 64] [--answer 16]

Without --gguf-path it writes the tiny-v3 Q4_K_M model. The first turn brings a long context
(`--first` tokens: a pasted document, a system prompt); each later turn resends the whole
history (the previous prompt, the model's answer) plus a new message of `--message` tokens, as
chat clients do, so with the cache it prefills only the answer and the message. Every
conversation is new (nothing of it cached before its first turn).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_e2e import build_model

from hybrid.engine.config import EngineConfig
from hybrid.engine.llm import LLM
from hybrid.engine.sampling.sampling_params import SamplingParams


def turns(llm: LLM, first: int, message: int, answer: int, seed: int) -> list[float]:
    """TTFT of each of 3 turns (seconds) of conversation `seed`."""
    params = SamplingParams(temperature=0, max_tokens=answer, ignore_eos=True)
    prompt: list[int] = [0, 3000 + seed]
    out = []
    for turn in range(3):
        n = first if turn == 0 else message
        prompt = prompt + [1000 + (37 * (turn * 7919 + k)) % 3000 for k in range(n)]
        r = llm._submit(prompt, params, lambda e: None)
        t = time.perf_counter()
        first = None
        while not r.is_finished:
            llm.worker.step()
            if first is None and r.num_output_tokens:
                first = time.perf_counter() - t
        out.append(first)
        prompt = prompt + r.output_ids
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf-path", default=None)
    ap.add_argument("--optimize-rules", default=None)
    ap.add_argument("--first", type=int, default=1800)
    ap.add_argument("--message", type=int, default=64)
    ap.add_argument("--answer", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    path = args.gguf_path or build_model("tiny-v3", Path(tempfile.mkdtemp()))
    rows = {}
    for cache in (False, True):
        config = EngineConfig(prefix_cache=cache, chunk_size=512, cache_lens=8192)
        llm = LLM(str(path), args.optimize_rules, engine_config=config)
        turns(llm, args.first, args.message, args.answer, 0)  # compiles
        runs = [turns(llm, args.first, args.message, args.answer, 1 + i)
                for i in range(args.repeats)]
        rows[cache] = [sorted(r[t] for r in runs)[len(runs) // 2] for t in range(3)]
        del llm
    print("| prefix cache | turn 1 TTFT ms | turn 2 | turn 3 |")
    print("|---|---|---|---|")
    for cache, ttft in rows.items():
        print(f"| {'on' if cache else 'off'} | " + " | ".join(f"{t * 1e3:.1f}" for t in ttft) + " |")
    history = 2 + args.first + 2 * (args.message + args.answer)
    print(f"third turn ({history} tokens of history): {rows[False][2] / rows[True][2]:.1f}x "
          "faster to the first token with the cache")
    return 0


if __name__ == "__main__":
    sys.exit(main())
