"""Start `hybrid serve` on a model, run `hybrid bench` at concurrency 1, 2, 4, 8, and print the
aggregate generated tokens/s relative to one stream (measured in this one run).

    python scripts/bench_serve.py [--gguf-path P | --preset tiny-v3] [--optimize-rules R]

Without --gguf-path it writes a synthetic model of `--preset` (q4_k_m) into a temporary
folder (tiny-v3 on CPU; v2-lite with DeepSeek-V2-Lite.yaml on the GPU machine). The engine runs
the streams' decodes in one batched forward, so reading the weights (the experts above all) is
shared: the target is >= 2.5x one stream's aggregate at 4 streams (balance-serve: 2.3x).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from serve_process import ServerProcess, free_port, synthetic_model

from server.bench import BenchOptions, run_bench


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf-path", default=None)
    ap.add_argument("--preset", default="tiny-v3", help="synthetic model when no --gguf-path")
    ap.add_argument("--optimize-rules", default="cpu.yaml")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--requests-per-stream", type=int, default=2)
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    path = args.gguf_path or synthetic_model(args.preset, tmp.name)
    port = free_port()
    try:
        # NOTE: the server's own warm-up compiles the CPU kernels before /health answers.
        server = ServerProcess([sys.executable, "-m", "cli", "serve", "--gguf-path", path,
                                "--optimize-rules", args.optimize_rules, "--port", str(port),
                                "--max-batch-size", "8", "--log-level", "warning"],
                               "hybrid", port, timeout=600)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    url = server.url
    try:
        # An unmeasured round first: the first requests pay one-time costs (allocator growth,
        # lazy imports) that would flatter every ratio against one stream.
        run_bench(BenchOptions(url, 2, args.prompt_len, args.gen_len, 2), progress=False)
        base, rows = None, []
        print(f"{'streams':>7}  {'agg tok/s':>9}  {'vs 1':>5}  {'TTFT p50':>9}  {'ITL p50':>8}")
        for c in (1, 2, 4, 8):
            r = run_bench(BenchOptions(url, c, args.prompt_len, args.gen_len,
                                       c * args.requests_per_stream), progress=False)
            base = base or r.aggregate_tokens_per_s
            print(f"{c:>7}  {r.aggregate_tokens_per_s:>9.1f}  {r.aggregate_tokens_per_s / base:>4.2f}x"
                  f"  {r.ttft_p50_s * 1e3:>7.0f}ms  {r.itl_p50_s * 1e3:>6.1f}ms", flush=True)
            rows.append({"streams": c, "aggregate_tokens_per_s": r.aggregate_tokens_per_s,
                         "ratio": r.aggregate_tokens_per_s / base, "ttft_p50_s": r.ttft_p50_s,
                         "itl_p50_s": r.itl_p50_s})
        at4 = next(row["ratio"] for row in rows if row["streams"] == 4)
        print(f"aggregate at 4 streams: {at4:.2f}x one stream (target >= 2.5x: "
              f"{'met' if at4 >= 2.5 else 'NOT met'})")
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    finally:
        server.stop()
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
