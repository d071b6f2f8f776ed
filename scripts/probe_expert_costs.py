"""What one expert costs on each fast-mode path, by its number of tokens, and where the AMX
threshold should sit.

Part 1: `--experts` experts each given exactly n tokens (every token routed to all of them), run
all on AMX bf16 tiles (threshold 1) and all on the int8 VNNI kernels, at 1 thread and at
`--threads`: prints thread-milliseconds per expert (ms x threads / experts). AMX's is nearly
flat in n (its dequantization), VNNI's grows with each 4 tokens; they cross near the threshold
(amx_bf16_moe.MIN_TOKENS). Part 2: T tokens routed top-k over `--resident` experts, at several
thresholds (`none`: every expert on VNNI). Needs a CPU with AMX for the AMX rows.

    python scripts/probe_expert_costs.py --threads 16
    python scripts/probe_expert_costs.py --shape lite --threads 2 --resident 16 --tokens 32
"""

from __future__ import annotations

import argparse
import json
import time

import numba
import numpy as np
from bench_cpu_moe import SHAPES

from cpu_kernels.amx import HAS_AMX
from cpu_kernels.amx_bf16_moe import TILE_CONFIG_BF16, amx_bf16_moe_kernel
from cpu_kernels.packed_moe import packed_moe_kernel
from cpu_kernels.random_blocks import random_experts


def make_call(packed, threads: int):
    """call(x, ids, weights, out, min_tokens): the MoE, min_tokens None = all on VNNI."""
    stamps = np.empty(2, np.int64)

    def call(x, ids, weights, out, min_tokens):
        pk = packed
        args = (pk.gate.qtype, pk.gate.data, pk.up.qtype, pk.up.data, pk.down.qtype,
                pk.down.data, x, ids, weights, out, stamps)
        if min_tokens is None:
            packed_moe_kernel(*args, threads)
        else:
            amx_bf16_moe_kernel(*args, TILE_CONFIG_BF16, min_tokens, threads)
    return call


def median_ms(call, x, routes, min_tokens, repeats: int) -> float:
    """Median of `repeats` calls over routes[1:] (routes[0] warms up)."""
    weights = np.ones(routes[0].shape, np.float32)
    out = np.empty_like(x)
    call(x, routes[0], weights, out, min_tokens)
    times = []
    for r in range(repeats):
        t = time.perf_counter()
        call(x, routes[1 + r % (len(routes) - 1)], weights, out, min_tokens)
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="v3", choices=[s for s in SHAPES if s != "v3-q2k"])
    p.add_argument("--threads", type=int, default=numba.config.NUMBA_NUM_THREADS)
    p.add_argument("--resident", type=int, default=64, help="experts held in memory")
    p.add_argument("--experts", type=int, default=8, help="experts per call in part 1")
    p.add_argument("--per-expert", default="1,2,4,8,12,16,24,32", help="part 1's n values")
    p.add_argument("--tokens", default="32,128", help="part 2's T values")
    p.add_argument("--thresholds", default="none,8,12,16", help="part 2's thresholds")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", help="write the rows to this file")
    args = p.parse_args()
    hidden, inter, _, top_k, gu_type, down_type = SHAPES[args.shape]
    resident = max(args.resident, 2 * args.experts)
    rng = np.random.default_rng(0)
    packed = random_experts(rng, resident, hidden, inter, gu_type, gu_type, down_type).pack().packed
    rows = []
    paths = (("amx", 1), ("vnni", None)) if HAS_AMX else (("vnni", None),)
    for n in [int(v) for v in args.per_expert.split(",")]:
        x = (rng.standard_normal((n, hidden)) * 0.5).astype(np.float32)
        e = args.experts
        routes = [np.tile(np.arange(e0, e0 + e), (n, 1)).astype(np.int64)
                  for e0 in range(0, resident - e + 1, e)]
        for path, min_tokens in paths:
            for threads in sorted({1, args.threads}):
                numba.set_num_threads(threads)
                ms = median_ms(make_call(packed, threads), x, routes, min_tokens, args.repeats)
                rows.append({"part": 1, "n": n, "path": path, "threads": threads, "ms": ms,
                             "thread_ms_per_expert": ms * threads / e})
                print(f"n={n:3d} {path:4s} threads={threads:2d} {ms:8.2f} ms   thread-ms per "
                      f"expert {ms * threads / e:7.2f}", flush=True)
    numba.set_num_threads(args.threads)
    call = make_call(packed, args.threads)
    for num_tokens in [int(v) for v in args.tokens.split(",")]:
        x = (rng.standard_normal((num_tokens, hidden)) * 0.5).astype(np.float32)
        k = min(top_k, resident)
        routes = [np.stack([rng.choice(resident, k, replace=False) for _ in range(num_tokens)])
                  .astype(np.int64) for _ in range(4)]
        for th in args.thresholds.split(","):
            min_tokens = None if th == "none" else int(th)
            if min_tokens is not None and not HAS_AMX:
                continue
            ms = median_ms(call, x, routes, min_tokens, args.repeats)
            rows.append({"part": 2, "tokens": num_tokens, "min_tokens": th, "ms": ms})
            print(f"T={num_tokens:5d} threshold {th:>4s} {ms:8.2f} ms", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
