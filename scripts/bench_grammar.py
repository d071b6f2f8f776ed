"""Structured output's cost: decode at batch 16 with every request under a JSON schema against
the same batch without, one model, one run; and the masks alone per step.

    python scripts/bench_grammar.py [--gguf-path P] [--optimize-rules R] [--mode fast]
        [--batch 16]

Without --gguf-path it writes the tiny-v3 Q4_K_M model with DeepSeek's 129,280-token
vocabulary (the mask's size is the vocabulary's). The schema's strings are free text, so the
grammar never ends a request early: both runs decode the same number of steps.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_e2e import build_model, rules_with_mode

from hybrid.engine.config import EngineConfig
from hybrid.engine.llm import LLM
from hybrid.engine.sampling.grammar import json_grammar, mask_logits
from hybrid.tuning.measure import step_ms

SCHEMA = {"type": "object", "properties": {"notes": {"type": "array", "items": {"type": "string"}}},
          "required": ["notes"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf-path", default=None)
    ap.add_argument("--optimize-rules", default=None)
    ap.add_argument("--mode", choices=["fast", "exact"], default=None,
                    help="the CPU experts' mode (the rule file's when left out)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--overlap-decode", choices=["auto", "on", "off"],
                    default=EngineConfig.overlap_decode,
                    help="the engine's overlap_decode (its default: as served)")
    args = ap.parse_args()
    path = args.gguf_path or build_model("tiny-v3", Path(tempfile.mkdtemp()))
    rules = args.optimize_rules
    if args.mode is not None:
        if rules is None:
            ap.error("--mode rewrites a rule file: name it with --optimize-rules")
        rules = rules_with_mode(rules, args.mode)
    llm = LLM(str(path), rules,
              engine_config=EngineConfig(max_batch_size=args.batch, prefix_cache=False,
                                         overlap_decode=args.overlap_decode))
    grammar = json_grammar(SCHEMA)
    free = step_ms(llm, args.batch, args.steps)
    constrained = step_ms(llm, args.batch, args.steps, grammar)
    # the masks alone: a batch of matchers mid-string, over the model's vocabulary
    matchers = [llm.engine.outputs.grammar_vocab.matcher(grammar) for _ in range(args.batch)]
    for m in matchers:
        for t in llm.tokenizer.encode('{"notes": ["', add_bos=False):
            m.accept(t)
    logits = torch.zeros(args.batch, llm.loaded.spec.vocab_size)
    times = []
    for _ in range(50):
        t = time.perf_counter()
        mask_logits(logits, matchers)
        times.append(time.perf_counter() - t)
    mask = sorted(times)[len(times) // 2] * 1e3
    print(f"overlap_decode={args.overlap_decode}")
    print(f"| batch {args.batch} | decode step ms | with grammars ms | overhead | masks alone ms |")
    print("|---|---|---|---|---|")
    print(f"| {llm.loaded.spec.vocab_size} tokens | {free:.2f} | {constrained:.2f} | "
          f"{(constrained - free) / free:.1%} | {mask:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
