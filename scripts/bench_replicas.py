"""Replicas against one: `hybrid cluster --replicas N` started as a user starts it (its defaults,
each replica one GPU where CUDA is), and the same streaming client at many streams, one
replica count after the other on one file, in one run.

    python scripts/bench_replicas.py [--gguf-path P | --preset tiny-v3] [--replicas 1,2]
        [--streams 16,32] [--gen-len 64] [--prompt-len 32] [--requests-per-stream 2]
        [--cluster-args "..."] [--with-serve] [--logs DIR] [--json out.json]

The first count listed is the base of the ratios. `--with-serve` first measures `hybrid serve`
with the same flags (one process, no Ray) beside them: what Ray Serve's hops cost one replica.
Each stream sends `--requests-per-stream` requests of distinct random token ids (no shared
prefix, so the router's affinity spreads them as it spreads users' distinct conversations). An unmeasured round at the most streams
runs first on each cluster: the first steps of a batch size pay one-time costs. The target of
issue 40: two replicas >= 1.8x one at 32 streams. Needs the `cluster` extra (ray[serve]).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

from serve_process import ServerProcess, free_port, synthetic_model

from server.bench import BenchOptions, run_bench


def _counts(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def measure(path: str, replicas: int, streams: list[int], args, log: str | None) -> dict:
    """One cluster of `replicas` on `path` (0: `hybrid serve` instead): its start-up seconds
    and, per stream count, the aggregate generated tok/s and the median TTFT and gap."""
    port = free_port()
    argv = [sys.executable, "-m", "cli", "cluster" if replicas else "serve", "--gguf-path", path,
            "--port", str(port), *shlex.split(args.cluster_args)]
    if replicas:
        argv += ["--replicas", str(replicas)]
    server = ServerProcess(argv, f"{replicas} replicas", port, log_path=log, timeout=900)
    row = {"replicas": replicas, "startup_s": server.startup_s, "streams": {}}
    try:
        most = max(streams)
        run_bench(BenchOptions(server.url, most, args.prompt_len, 8, most), progress=False)
        for s in streams:
            r = run_bench(BenchOptions(server.url, s, args.prompt_len, args.gen_len,
                                       s * args.requests_per_stream), progress=False)
            row["streams"][s] = {"aggregate_tok_s": r.aggregate_tokens_per_s,
                                 "ttft_p50_s": r.ttft_p50_s, "itl_p50_s": r.itl_p50_s}
            print(f"{replicas} replicas, {s} streams: {r.aggregate_tokens_per_s:.1f} tok/s, "
                  f"TTFT p50 {r.ttft_p50_s:.2f} s, ITL p50 {r.itl_p50_s * 1e3:.1f} ms",
                  flush=True)
    finally:
        server.stop()
    return row


def table(rows: list[dict], streams: list[int]) -> str:
    base = next(row for row in rows if row["replicas"])
    head = "| replicas | start-up s | " + " | ".join(f"{s} streams tok/s" for s in streams)
    lines = [head + " |", "|---" * (2 + len(streams)) + "|"]
    for row in rows:
        cells = []
        for s in streams:
            tok = row["streams"][s]["aggregate_tok_s"]
            cells.append(f"{tok:.1f} ({tok / base['streams'][s]['aggregate_tok_s']:.2f}x)")
        name = row["replicas"] or "serve, no Ray"
        lines.append(f"| {name} | {row['startup_s']:.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf-path", default=None)
    ap.add_argument("--preset", default="tiny-v3", help="synthetic q4_k_m model when no --gguf-path")
    ap.add_argument("--replicas", type=_counts, default=[1, 2])
    ap.add_argument("--streams", type=_counts, default=[16, 32])
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--requests-per-stream", type=int, default=2)
    ap.add_argument("--cluster-args", default="", help="more `hybrid cluster` flags")
    ap.add_argument("--with-serve", action="store_true",
                    help="measure `hybrid serve` (one process, no Ray) first, beside them")
    ap.add_argument("--logs", default=None, help="folder for each cluster's log")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    path = args.gguf_path or synthetic_model(args.preset, tmp.name)
    rows = []
    try:
        for n in [0] * args.with_serve + args.replicas:
            log = str(Path(args.logs) / f"cluster-{n}.log") if args.logs else None
            rows.append(measure(path, n, args.streams, args, log))
    finally:
        tmp.cleanup()
    if args.json:
        Path(args.json).write_text(json.dumps({"file": path, "rows": rows,
                                               "options": vars(args)}, indent=1))
    print(table(rows, args.streams))
    return 0


if __name__ == "__main__":
    sys.exit(main())
