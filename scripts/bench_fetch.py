"""The share of each step's routed experts the GPU fetches over PCIe (`fetch_experts`), swept
in one process on the GPU machine: decode tok/s at 1 and 16 streams per share, and the greedy
tokens of a few prompts against the share 0 (every expert on the CPU).

    python scripts/bench_fetch.py [--gguf-path P | --preset v2-lite] [--optimize-rules R]
        [--shares 0,0.25,0.35,0.45] [--streams 1,16] [--json out.json]

The rule file gets fetch_experts at the largest share (its slots); each row sets the share on
every layer's fetcher (a device tensor the captured graphs read), so every row runs the same
graphs.
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

from bench_e2e import build_model, decode

from hybrid.engine.config import EngineConfig
from hybrid.engine.llm import LLM
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.rules.planner import with_fetched_experts, with_held_experts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf-path")
    ap.add_argument("--preset", default="v2-lite")
    ap.add_argument("--optimize-rules", default="DeepSeek-V2-Lite")
    ap.add_argument("--shares", default="0,0.25,0.35,0.45")
    ap.add_argument("--streams", default="1,16")
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode-graph", default="auto", help="EngineConfig.decode_graph")
    ap.add_argument("--hold", type=int, default=0,
                    help="also hold experts 0 .. N-1 of every layer on the GPU")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    shares = [float(s) for s in args.shares.split(",")]
    streams = [int(s) for s in args.streams.split(",")]
    path = args.gguf_path or build_model(args.preset, Path(tempfile.mkdtemp()))
    rules = str(with_fetched_experts(args.optimize_rules, max(shares), Path(tempfile.mkdtemp())))
    if args.hold:
        rules = str(with_held_experts(rules, list(range(args.hold)), "cuda",
                                      Path(tempfile.mkdtemp())))
    t = time.perf_counter()
    llm = LLM(path, rules, engine_config=EngineConfig(max_batch_size=max(streams),
                                                    decode_graph=args.decode_graph),
              status=lambda m: print("start-up:", m, flush=True))
    print(f"loaded in {time.perf_counter() - t:.1f} s", flush=True)
    ops = [op for op in llm.engine.runner.program.moe_layers if op.fetcher is not None]
    print(f"{len(ops)} layers fetch, {ops[0].fetcher.slots if ops else 0} slots", flush=True)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    prompts = [[1000 + 13 * i + j for j in range(24)] for i in range(4)]
    rows, tokens = [], {}
    for _ in range(args.repeats):
        for share in shares:
            for op in ops:
                op.fetcher.set_share(share)
            for s in streams:
                d = decode(llm, s, 32, args.gen)
                rows.append({"share": share, "streams": s, "tok_s": d["tok_s"],
                             "step_ms": d["step_ms"]})
                print(json.dumps(rows[-1]), flush=True)
            if share not in tokens:
                out = llm.generate(prompt_token_ids=prompts, sampling_params=params)
                tokens[share] = [o.outputs[0].token_ids for o in out]
    base = tokens[shares[0]]
    table = []
    for share in shares:
        agree = [sum(a == b for a, b in zip(x, y)) / len(x) for x, y in zip(tokens[share], base)]
        row = {"share": share, "agreement": statistics.mean(agree)}
        for s in streams:
            row[f"tok_s_{s}"] = statistics.median(r["tok_s"] for r in rows
                                                  if r["share"] == share and r["streams"] == s)
        table.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "table": table}, indent=1))
    print(f"\n{Path(path).name}, {args.optimize_rules}, medians of {args.repeats}")
    print("| share | " + " | ".join(f"decode x{s} tok/s | vs share 0" for s in streams)
          + " | greedy agreement with share 0 |")
    print("|---|" + "---|---|" * len(streams) + "---|")
    for row in table:
        cells = []
        for s in streams:
            v, b = row[f"tok_s_{s}"], table[0][f"tok_s_{s}"]
            cells.append(f"{v:.1f} | {v / b:.2f}x")
        print(f"| {row['share']:g} | " + " | ".join(cells) + f" | {row['agreement']:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
