"""Routed experts the GPU copies over PCIe from page-locked host memory (`gpu_experts` with
`gpu_experts_memory: host`) beside the CPU's cores reading the rest: decode and prompt rates
against the CPU alone, one engine process per share, on one file and the same prompts.

The host's memory serves PCIe beside the cores (docs/serving.md, scripts/probe_dram_share.py),
so a decode step whose used experts are split between the two reads them sooner. Which experts
the GPU takes is fixed per layer (rules.plan.pcie_expert_ids), so nothing is chosen on the
device and a whole-step CUDA graph holds the step as with experts held in GPU memory.

    python scripts/bench_pcie_experts.py --gguf-path v2-lite-q4_k_m.gguf \\
        --optimize-rules DeepSeek-V2-Lite --shares 0,0.15,0.3 [--memory host] \\
        [--streams 1,16] [--ttft 512,2048] [--tokens 64] [--repeats 3] [--rounds 2] \\
        [--json out.json]

Rows per share: decode tok/s of one sampled stream and of each --streams count at once
(the median of --repeats in each of --rounds processes, which alternate with the other shares'
since the host drifts over minutes), TTFT of each --ttft prompt length (median of 3), the
greedy tokens' agreement with the first share's (the GPU's products round differently from the
CPU's), and the engine's start-up seconds. Prints a markdown table last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_e2e import prefill_rows
from deferral_accuracy import batch_rate, corpus, decode_rate, greedy


def ttft(llm, length: int) -> float:
    """Median of 3 prompts of `length` tokens (bench_e2e.prefill_rows; the engine caches no
    prefix)."""
    return prefill_rows(llm, [length], 3)[0]["ttft_s"]


def one(args) -> dict:
    """One engine with `args.share` of every layer's experts read by the GPU: its row."""
    from hybrid import LLM
    from hybrid.engine.config import EngineConfig
    from hybrid.model.loader import open_model
    from hybrid.rules.plan import pcie_expert_ids
    from hybrid.rules.planner import with_gpu_experts, with_pcie_experts

    spec = open_model(args.gguf_path)[1]
    ids = pcie_expert_ids(spec.num_experts, args.share) if args.share else []
    folder = Path(tempfile.mkdtemp())
    # share 0 strips the rules' own pcie_experts (the bundled V2-Lite rules hold one); host
    # memory on the GPU machine is the rules' own option, device memory names the same ids
    if args.memory == "host" and args.gpu_device.startswith("cuda"):
        rules = str(with_pcie_experts(args.optimize_rules, args.share, folder))
    else:
        rules = str(with_gpu_experts(args.optimize_rules, ids, args.memory, folder,
                                     args.gpu_device))
    streams = [int(v) for v in args.streams.split(",") if v]
    batch = max(streams + [8])
    config = EngineConfig(max_batch_size=batch, prefix_cache=False,
                          cache_lens=max(batch * (32 + args.tokens + 256),
                                         max(_ints(args.ttft), default=0) + 512))
    t = time.perf_counter()
    llm = LLM(args.gguf_path, rules, engine_config=config)
    row: dict = {"share": args.share, "held": len(ids), "memory": args.memory,
                 "start_s": time.perf_counter() - t}
    prompts = corpus(spec.vocab_size, 4)
    row["greedy"] = greedy(llm, prompts, 32)[0]
    many = corpus(spec.vocab_size, max(streams), seed=1)
    for s in streams:
        rates = [decode_rate(llm, prompts[0], args.tokens, 1) if s == 1
                 else batch_rate(llm, many[:s], args.tokens) for _ in range(args.repeats)]
        row[f"decode_x{s}"] = statistics.median(rates)
        row[f"decode_x{s}_samples"] = rates
    for n in _ints(args.ttft):
        row[f"ttft_{n}"] = ttft(llm, n)
    return row


def merged(runs: list[dict]) -> dict:
    """One share's row from its runs (one per round): each rate the median of every sample,
    each TTFT and start-up the median of the runs', greedy agreement the lowest."""
    row = dict(runs[0])
    for key in [k for k in row if k.startswith("decode_x") and not k.endswith("_samples")]:
        row[f"{key}_samples"] = [v for r in runs for v in r[f"{key}_samples"]]
        row[key] = statistics.median(row[f"{key}_samples"])
    for key in [k for k in row if k.startswith("ttft_")] + ["start_s"]:
        row[key] = statistics.median(r[key] for r in runs)
    row["greedy_agreement"] = min(r["greedy_agreement"] for r in runs)
    row["rounds"] = len(runs)
    return row


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf-path", required=True)
    ap.add_argument("--optimize-rules", default="DeepSeek-V2-Lite")
    ap.add_argument("--shares", default="0,0.15,0.3")
    ap.add_argument("--memory", choices=["host", "device"], default="host")
    ap.add_argument("--gpu-device", default="cuda:0", help="cpu: a check without a GPU")
    ap.add_argument("--streams", default="1,16")
    ap.add_argument("--ttft", default="512,2048")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1, help="runs of every share, alternating")
    ap.add_argument("--json", default=None)
    ap.add_argument("--share", type=float, default=None, help=argparse.SUPPRESS)  # one engine
    args = ap.parse_args()
    if args.share is not None:
        print("ROW " + json.dumps(one(args)), flush=True)
        return 0
    rows = []
    shares = [float(v) for v in args.shares.split(",") if v]
    # the host drifts over minutes: the shares alternate, each round one process per share
    for share in shares * args.rounds:
        cmd = [sys.executable, __file__, "--gguf-path", args.gguf_path, "--optimize-rules",
               args.optimize_rules, "--memory", args.memory, "--gpu-device", args.gpu_device,
               "--streams", args.streams,
               "--ttft", args.ttft, "--tokens", str(args.tokens), "--repeats",
               str(args.repeats), "--share", str(share)]
        run = subprocess.run(cmd, check=False, capture_output=True, text=True)
        got = [line[4:] for line in run.stdout.splitlines() if line.startswith("ROW ")]
        if run.returncode or not got:
            print(f"share {share}: rc {run.returncode}\n{run.stderr[-3000:]}", flush=True)
            continue
        rows.append(json.loads(got[0]))
        print({k: v for k, v in rows[-1].items() if k != "greedy"}, flush=True)
    if not rows:
        return 1
    for r in rows:
        same = [a == b for x, y in zip(rows[0]["greedy"], r["greedy"]) for a, b in zip(x, y)]
        r["greedy_agreement"] = float(np.mean(same))
    runs = rows
    rows = [merged([r for r in runs if r["share"] == share]) for share in shares
            if any(r["share"] == share for r in runs)]
    base = rows[0]
    if args.json:
        Path(args.json).write_text(json.dumps({"model": Path(args.gguf_path).name,
                                               "rules": args.optimize_rules, "rows": rows,
                                               "runs": runs}, indent=1))
    streams, ttfts = _ints(args.streams), _ints(args.ttft)
    print(f"\n{Path(args.gguf_path).name}, rules {args.optimize_rules}, experts in "
          f"{args.memory} memory")
    print("| share | held a layer | " + " | ".join(f"decode x{s} tok/s | vs share {base['share']}"
                                                    for s in streams)
          + "".join(f" | TTFT {n} s" for n in ttfts) + " | greedy agreement | start s |")
    print("|---|---|" + "---|---|" * len(streams) + "---|" * len(ttfts) + "---|---|")
    for r in rows:
        print(f"| {r['share']} | {r['held']} | " + " | ".join(
            f"{r[f'decode_x{s}']:.1f} | {r[f'decode_x{s}'] / base[f'decode_x{s}']:.2f}x"
            for s in streams) + "".join(f" | {r[f'ttft_{n}']:.3f}" for n in ttfts)
            + f" | {r['greedy_agreement']:.3f} | {r['start_s']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
