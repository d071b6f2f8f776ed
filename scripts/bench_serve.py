"""Start `hybrid serve` on a model, run `hybrid bench` at concurrency 1, 2, 4, 8, and print the
aggregate generated tokens/s relative to one stream (measured in this one run).

    python scripts/bench_serve.py [--gguf-path P] [--optimize-rules R] [--gen-len 64]

Without --gguf-path it writes a synthetic tiny-v3 (q4_k_m) into a temporary folder. NOTE: the
engine of this slice interleaves requests token by token (one forward per request), so the
ratio stays near 1x until batched forwards (continuous batching) land.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from server.bench import BenchOptions, run_bench


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf-path", default=None)
    ap.add_argument("--optimize-rules", default="cpu.yaml")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--requests-per-stream", type=int, default=2)
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    path = args.gguf_path
    if path is None:
        path = str(Path(tmp.name) / "tiny-v3.gguf")
        subprocess.run([sys.executable, "-m", "server.cli", "make-model", "--preset", "tiny-v3",
                        "--quant", "q4_k_m", "--out", path], check=True, capture_output=True)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "server.cli", "serve", "--gguf-path", path,
                               "--optimize-rules", args.optimize_rules, "--port", str(port),
                               "--max-batch-size", "8", "--log-level", "warning"])
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                print("error: the server did not start", file=sys.stderr)
                return 1
            time.sleep(0.5)
        base = None
        print(f"{'streams':>7}  {'agg tok/s':>9}  {'vs 1':>5}  {'TTFT p50':>9}  {'ITL p50':>8}")
        for c in (1, 2, 4, 8):
            r = run_bench(BenchOptions(url, c, args.prompt_len, args.gen_len,
                                       c * args.requests_per_stream), progress=False)
            base = base or r.aggregate_tokens_per_s
            print(f"{c:>7}  {r.aggregate_tokens_per_s:>9.1f}  {r.aggregate_tokens_per_s / base:>4.2f}x"
                  f"  {r.ttft_p50_s * 1e3:>7.0f}ms  {r.itl_p50_s * 1e3:>6.1f}ms", flush=True)
    finally:
        server.terminate()
        server.wait(30)
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
