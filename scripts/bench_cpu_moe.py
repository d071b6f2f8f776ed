"""Benchmark the CPU routed-expert MoE kernels (cpu_kernels.moe_forward) against read bandwidth.

DeepSeek-V3 (H 7168, I 2048, 256 experts, top-8) and V2-Lite (H 2048, I 1408, 64 experts, top-6)
shapes with Q4_K_M-like types (V3: Q4_K gate/up, Q6_K down; Lite: I=1408 is no multiple of 256, so
Q5_0 gate/up and Q8_0 down, llama.cpp's fallbacks), random valid blocks made in-process. Prints ms
per layer, GB/s of distinct expert weights read and the percentage of the read bandwidth measured in
the same run. `fast` mode runs on the packed copy (`ExpertWeights.pack()`, timed once per shape as
load-time work). `--resident` caps the experts held in memory (routing draws from those), so the
script fits small machines; `--quick` is a short run for 2-core CI machines.

    python scripts/bench_cpu_moe.py --quick
    python scripts/bench_cpu_moe.py --shapes v3 --tokens 1,8,128 --threads 16 --json rows.json
"""

from __future__ import annotations

import argparse
import json
import time

import numba
import numpy as np
from numba import njit, prange

from cpu_kernels import qtypes as qt
from cpu_kernels.moe import moe_forward
from cpu_kernels.random_blocks import random_experts

SHAPES = {
    # name: (hidden, inter, num_experts, top_k, gate/up type, down type)
    "v3": (7168, 2048, 256, 8, qt.Q4_K, qt.Q6_K),
    "lite": (2048, 1408, 64, 6, qt.Q5_0, qt.Q8_0),
}


@njit(parallel=True, fastmath=True, cache=True)
def _sum_chunks(buf: np.ndarray, part: np.ndarray) -> None:
    # buf: [P, L] float32  part: [P]
    for p in prange(buf.shape[0]):
        s = np.float32(0.0)
        for j in range(buf.shape[1]):
            s += buf[p, j]
        part[p] = s


def read_bandwidth(nbytes: int, repeats: int = 3) -> float:
    """Best GB/s of a multithreaded float32 sum over a buffer bigger than the caches."""
    buf = np.ones((64, nbytes // 256), np.float32)
    part = np.empty(64, np.float32)
    _sum_chunks(buf, part)
    best = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        _sum_chunks(buf, part)
        best = max(best, buf.nbytes / (time.perf_counter() - t) / 1e9)
    return best


def bench_shape(name: str, tokens: list[int], resident: int, mode: str, repeats: int,
                bandwidth: float, rng: np.random.Generator) -> list[dict]:
    hidden, inter, num_experts, top_k, gu_type, down_type = SHAPES[name]
    resident = min(resident, num_experts)
    experts = random_experts(rng, resident, hidden, inter, gu_type, gu_type, down_type)
    if mode == "fast":
        t = time.perf_counter()
        experts.pack()
        print(f"{name}: packed {resident} experts in {time.perf_counter() - t:.1f} s", flush=True)
    rows = []
    for num_tokens in tokens:
        x = (rng.standard_normal((num_tokens, hidden)) * 0.5).astype(np.float32)
        out = np.empty_like(x)
        routes = [np.stack([rng.choice(resident, min(top_k, resident), replace=False)
                            for _ in range(num_tokens)]) for _ in range(repeats + 1)]
        weights = rng.random(routes[0].shape).astype(np.float32)
        moe_forward(x, routes[0], weights, experts, out, mode=mode)  # compile / warm
        t = time.perf_counter()
        moe_forward(x, routes[1], weights, experts, out, mode=mode)
        # large T: fewer repeats, about a second per row at most
        reps = max(1, min(repeats, int(1.0 / max(time.perf_counter() - t, 1e-6))))
        t = time.perf_counter()
        for ids in routes[1:reps + 1]:
            moe_forward(x, ids, weights, experts, out, mode=mode)
        ms = (time.perf_counter() - t) / reps * 1e3
        distinct = np.mean([np.unique(ids).size for ids in routes[1:reps + 1]])
        gbs = distinct * experts.expert_nbytes() / (ms / 1e3) / 1e9
        rows.append({"shape": name, "mode": mode, "tokens": num_tokens,
                     "threads": numba.get_num_threads(), "resident_experts": resident,
                     "distinct_experts": float(distinct), "ms": round(ms, 3),
                     "weight_gbs": round(gbs, 2), "pct_bandwidth": round(100 * gbs / bandwidth, 1),
                     "bandwidth_gbs": round(bandwidth, 2)})
        r = rows[-1]
        print(f"{name:5s} {mode:5s} T={num_tokens:5d} thr={r['threads']:2d} experts={distinct:6.1f}"
              f"  {ms:9.2f} ms  {gbs:6.2f} GB/s  {r['pct_bandwidth']:5.1f}% of {bandwidth:.1f}",
              flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    """The rows again as one markdown table (the last thing printed)."""
    print("\n| shape | mode | T | threads | experts | ms/layer | GB/s weights | % of read BW |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['mode']} | {r['tokens']} | {r['threads']} | "
              f"{r['distinct_experts']:.1f} | {r['ms']:.2f} | {r['weight_gbs']:.1f} | "
              f"{r['pct_bandwidth']:.0f}% of {r['bandwidth_gbs']:.0f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="v3,lite", help="comma list of " + ",".join(SHAPES))
    p.add_argument("--tokens", default="1,2,4,8,32,128,512,1024")
    p.add_argument("--modes", default="exact,fast")
    p.add_argument("--exact-tokens", default="1,8",
                   help="token counts also run in exact mode (its kernels are scalar: slow)")
    p.add_argument("--threads", type=int, default=numba.config.NUMBA_NUM_THREADS)
    p.add_argument("--resident", type=int, default=64, help="experts held in memory per shape")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--bandwidth-mb", type=int, default=1024, help="buffer for the read test")
    p.add_argument("--quick", action="store_true", help="small run for 2-core machines")
    p.add_argument("--json", help="write the rows to this file")
    args = p.parse_args()
    if args.quick:
        args.tokens, args.resident, args.repeats, args.bandwidth_mb = "1,8", 16, 3, 512
    numba.set_num_threads(args.threads)
    bandwidth = read_bandwidth(args.bandwidth_mb << 20)
    print(f"read bandwidth {bandwidth:.2f} GB/s with {args.threads} threads")
    rng = np.random.default_rng(0)
    rows = []
    for name in args.shapes.split(","):
        for mode in args.modes.split(","):
            tokens = [int(t) for t in args.tokens.split(",")]
            if mode == "exact":
                tokens = [t for t in tokens if str(t) in args.exact_tokens.split(",")]
            rows += bench_shape(name, tokens, args.resident, mode, args.repeats, bandwidth, rng)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
