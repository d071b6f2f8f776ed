"""Expert deferral's cost and gain (issue 39): for k = 0 (exact) and each --defer k, in one
engine (ops.experts.set_deferral switches k between runs) over the same file and corpus:

- decode tok/s of one stream: median of --repeats rounds, each a sampled generation of
  --tokens tokens at every k in turn; with --streams 8,16 also the aggregate decode tok/s of
  that many sampled streams at once (the issue's item 5: a batch reads the union of its
  tokens' experts);
- greedy agreement: of k=0's greedy tokens, the share k's own greedy run reproduces position
  by position (--tokens a prompt), and the mean position of the first difference;
- teacher forced on the decode path (SamplingParams.forced_ids: each token decoded as a
  generated one is): k=0's greedy continuation scored under k: mean and max |dlogprob| of its
  tokens against k=0's own, and the mean negative log-likelihood (k=0's row: its own);
  the first token comes from the prompt, which deferral leaves exact, so it is left out.

    python scripts/deferral_accuracy.py --preset tiny-v3 --optimize-rules cpu --defer 1,2,3
    python scripts/deferral_accuracy.py --gguf-path v2-lite-q4_k_m.gguf \\
        --optimize-rules DeepSeek-V2-Lite --defer 1,2,3 --json out.json

Prints a markdown table last. The corpus: --prompts prompts of 32 token ids drawn with a fixed
seed from the vocabulary's middle (synthetic models have no text).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

import numpy as np

from hybrid.engine.config import EngineConfig
from hybrid.engine.llm import LLM
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.ops.experts import set_deferral


def corpus(vocab: int, prompts: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    lo, hi = min(1000, vocab // 4), max(vocab - 1000, 3 * vocab // 4)
    return [rng.integers(lo, hi, 32).tolist() for _ in range(prompts)]


def greedy(llm: LLM, prompts: list[list[int]], tokens: int) -> tuple[list, list]:
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, logprobs=0)
    outs = [o.outputs[0] for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)]
    return [o.token_ids for o in outs], [o.logprobs for o in outs]


def forced(llm: LLM, prompts: list[list[int]], continuations: list[list[int]]) -> list:
    params = [SamplingParams(temperature=0, max_tokens=len(c), ignore_eos=True, logprobs=0,
                             forced_ids=tuple(c)) for c in continuations]
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    return [o.outputs[0].logprobs for o in outs]


def decode_rate(llm: LLM, prompt: list[int], tokens: int, repeats: int) -> float:
    # sampled, not greedy: a random model's greedy stream soon repeats one token, whose experts
    # then stay in the CPU's caches and time faster than any real stream's
    params = SamplingParams(temperature=1.0, seed=0, max_tokens=tokens, ignore_eos=True)
    llm.generate(prompt_token_ids=[prompt], sampling_params=params)  # warm
    rates = []
    for _ in range(repeats):
        first = None
        for i, _ in enumerate(llm.stream(prompt, params)):
            if i == 0:
                first = time.perf_counter()
        rates.append((tokens - 1) / (time.perf_counter() - first))
    return statistics.median(rates)


def measure(llm: LLM, k: int, prompts: list[list[int]], args, reference: dict | None) -> dict:
    set_deferral(llm.engine.runner.model, k)
    tokens, logprobs = greedy(llm, prompts, args.tokens)
    if reference is None:
        return {"k": k, "tokens": tokens, "logprobs": logprobs, "agreement": 1.0,
                "first_difference": float(args.tokens),
                "nll": float(np.mean([-x for lp in logprobs for x in lp[1:]])),
                "mean_dlogprob": 0.0, "max_dlogprob": 0.0}
    row: dict = {"k": k}
    same = [[a == b for a, b in zip(t0, t1)] for t0, t1 in zip(reference["tokens"], tokens)]
    row["agreement"] = float(np.mean([s for row_ in same for s in row_]))
    row["first_difference"] = float(np.mean([s.index(False) if False in s else len(s)
                                             for s in same]))
    scored = forced(llm, prompts, reference["tokens"])
    d = [abs(a - b) for lp0, lp1 in zip(reference["logprobs"], scored)
         for a, b in zip(lp0[1:], lp1[1:])]
    row["mean_dlogprob"], row["max_dlogprob"] = float(np.mean(d)), float(np.max(d))
    row["nll"] = float(np.mean([-x for lp in scored for x in lp[1:]]))
    return row


def batch_rate(llm: LLM, prompts: list[list[int]], tokens: int) -> float:
    """Aggregate decode tok/s of len(prompts) sampled streams decoding together: timed from
    the step after every stream has its first token (their prompts are prefilled) to the
    last."""
    reqs = [llm._submit(p, SamplingParams(temperature=1.0, seed=i, max_tokens=tokens,
                                          ignore_eos=True), lambda e: None)
            for i, p in enumerate(prompts)]
    while any(r.num_output_tokens == 0 for r in reqs):
        llm.worker.step()
    before = sum(r.num_output_tokens for r in reqs)
    t = time.perf_counter()
    while any(not r.is_finished for r in reqs):
        llm.worker.step()
    return (sum(r.num_output_tokens for r in reqs) - before) / (time.perf_counter() - t)


def speeds(llm: LLM, ks: list[int], streams: list[int], prompt: list[int],
           many: list[list[int]], args) -> dict[tuple[int, int], float]:
    """Median decode tok/s per (k, streams), the ks interleaved round by round (--repeats
    rounds) in this one engine: the shared host's drift falls on every k alike. One stream
    decodes `prompt`; s streams the first s of `many`."""
    rates: dict[tuple[int, int], list[float]] = {(k, s): [] for k in ks for s in streams}
    for _ in range(args.repeats):
        for k in ks:
            set_deferral(llm.engine.runner.model, k)
            for s in streams:
                rates[k, s].append(decode_rate(llm, prompt, args.tokens, 1) if s == 1
                                   else batch_rate(llm, many[:s], args.tokens))
    return {key: statistics.median(v) for key, v in rates.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf-path")
    ap.add_argument("--preset", default="tiny-v3")
    ap.add_argument("--optimize-rules", default="cpu")
    ap.add_argument("--defer", default="1,2,3", help="k values besides 0, comma-separated")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--streams", default="1", help="decode rows: streams at once, e.g. 1,8,16")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    path = args.gguf_path or _tiny(args.preset)
    from hybrid.model.loader import open_model

    vocab = open_model(path)[1].vocab_size
    prompts = corpus(vocab, args.prompts)
    ks = [0] + [int(v) for v in args.defer.split(",") if v]
    # one stream always: its row is the main table's "decode tok/s"
    streams = sorted({1, *(int(v) for v in args.streams.split(",") if v)})
    batch = max(len(prompts), *streams, 1)
    # room for every stream at once: a request holds whole pages (64 tokens by default);
    # with fewer, the last streams wait for pages and the timed window is their tail alone
    config = EngineConfig(max_batch_size=batch, prefix_cache=False,
                          cache_lens=batch * (32 + args.tokens + 256))
    llm = LLM(path, args.optimize_rules, engine_config=config)
    rows = [measure(llm, 0, prompts, args, None)]
    rows += [measure(llm, k, prompts, args, rows[0]) for k in ks[1:]]
    rate = speeds(llm, ks, streams, prompts[0], corpus(vocab, max(streams), seed=1), args)
    summary = [{"decode_tok_s": rate[r["k"], 1],
                **{f"decode_tok_s_x{s}": rate[r["k"], s] for s in streams},
                **{key: v for key, v in r.items() if key not in ("tokens", "logprobs")}}
               for r in rows]
    if args.json:
        Path(args.json).write_text(json.dumps({"model": Path(path).name,
                                               "rules": args.optimize_rules,
                                               "prompts": args.prompts, "tokens": args.tokens,
                                               "rows": summary}, indent=1))
    base = summary[0]["decode_tok_s"]
    print(f"\n{Path(path).name}, rules {args.optimize_rules}, {args.prompts} prompts x "
          f"{args.tokens} tokens")
    print("| k | decode tok/s | vs k=0 | greedy agreement | first difference (mean) | "
          "mean abs dlogprob | max abs dlogprob | NLL of k=0's tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for r in summary:
        print(f"| {r['k']} | {r['decode_tok_s']:.1f} | {r['decode_tok_s'] / base:.2f}x | "
              f"{r['agreement']:.3f} | {r['first_difference']:.1f} | {r['mean_dlogprob']:.4f} | "
              f"{r['max_dlogprob']:.4f} | {r['nll']:.4f} |")
    if len(streams) > 1:
        print("\n| k | " + " | ".join(f"decode x{s} tok/s | vs k=0" for s in streams) + " |")
        print("|---|" + "---|---|" * len(streams))
        for r in summary:
            print(f"| {r['k']} | " + " | ".join(
                f"{r[f'decode_tok_s_x{s}']:.1f} | "
                f"{r[f'decode_tok_s_x{s}'] / summary[0][f'decode_tok_s_x{s}']:.2f}x"
                for s in streams) + " |")
    return 0


def _tiny(preset: str) -> str:
    from hybrid.synth.make_model import MakeModelOptions, make_model
    from hybrid.synth.presets import get_preset
    from hybrid.synth.vocab import get_vocab

    p = get_preset(preset)
    out = Path(tempfile.mkdtemp()) / f"{preset}-q4_k_m.gguf"
    (made,) = make_model(MakeModelOptions(p, "q4_k_m", "legacy", vocab="deepseek"),
                         get_vocab("deepseek", p.vocab_size), out)
    return str(made)


if __name__ == "__main__":
    sys.exit(main())
