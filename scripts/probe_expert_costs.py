"""What one expert costs on each fast-mode path, by its number of tokens, and where the AMX
threshold should sit.

Part 1: `--experts` experts each given exactly n tokens (every token routed to all of them), run
all on AMX bf16 tiles (threshold 1) and all on the int8 VNNI kernels, at 1 thread and at
`--threads`: prints thread-milliseconds per expert (ms x threads / experts). AMX's is nearly
flat in n (its dequantization), VNNI's grows with each 4 tokens; they cross near the threshold
(amx_bf16_moe.MIN_TOKENS). Part 2: T tokens routed top-k over `--resident` experts, at several
thresholds (`none`: every expert on VNNI). Needs a CPU with AMX for the AMX rows.
Every row also gives phase 1's share of the call (gate/up; the rest is down), from the kernel's
cycle stamps. `--hot` adds part 1 rows that give every call the same experts (`--hot-experts`
of them, cache-resident when they fit): against the rotating (cold) rows, what the products
cost without waiting for memory.

    python scripts/probe_expert_costs.py --threads 16
    python scripts/probe_expert_costs.py --shape lite --threads 2 --resident 16 --tokens 32
    python scripts/probe_expert_costs.py --threads 16 --resident 256 --hot --per-expert 1,4,8
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numba
import numpy as np
from bench_cpu_moe import SHAPES

from cpu_kernels.amx.amx_bf16_moe import TILE_CONFIG_BF16, amx_bf16_moe_kernel
from cpu_kernels.fast.packed import pack
from cpu_kernels.fast.packed_moe import packed_moe
from cpu_kernels.fast.tile_set import KQUANT_TILES
from cpu_kernels.formats.random_blocks import random_experts
from cpu_kernels.simd.amx import HAS_AMX


def make_call(packed, threads: int):
    """call(x, ids, weights, out, min_tokens): the MoE, min_tokens None = all on VNNI.
    `call.stamps`: the last call's cycle stamps (entry, exit, end of phase 1)."""
    stamps = np.empty(3, np.int64)

    def call(x, ids, weights, out, min_tokens):
        pk = packed
        args = (pk.gate.qtype, pk.gate.data, pk.up.qtype, pk.up.data, pk.down.qtype,
                pk.down.data, x, ids, weights, math.inf, out, stamps)
        if min_tokens is None:
            packed_moe(*args, threads)
        else:
            amx_bf16_moe_kernel(KQUANT_TILES, *args, TILE_CONFIG_BF16, min_tokens, threads)
    call.stamps = stamps
    return call


def median_ms(call, x, routes, min_tokens, repeats: int) -> tuple[float, float]:
    """Median ms of `repeats` calls over routes[1:] (routes[0] warms up; a single route is
    reused), and phase 1's median share of the kernel's cycles."""
    weights = np.ones(routes[0].shape, np.float32)
    out = np.empty_like(x)
    call(x, routes[0], weights, out, min_tokens)
    timed = routes[1:] or routes
    times, shares = [], []
    for r in range(repeats):
        t = time.perf_counter()
        call(x, timed[r % len(timed)], weights, out, min_tokens)
        times.append(time.perf_counter() - t)
        s = call.stamps
        shares.append((s[2] - s[0]) / max(s[1] - s[0], 1))
    return float(np.median(times)) * 1e3, float(np.median(shares))


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
    p.add_argument("--hot", action="store_true", help="part 1 also on the same experts each call")
    p.add_argument("--hot-experts", type=int, default=1, help="experts of the hot rows")
    p.add_argument("--json", help="write the rows to this file")
    args = p.parse_args()
    hidden, inter, _, top_k, gu_type, down_type = SHAPES[args.shape]
    resident = max(args.resident, 2 * args.experts)
    rng = np.random.default_rng(0)
    packed = pack(random_experts(rng, resident, hidden, inter, gu_type, gu_type,
                                down_type)).packed
    rows = []
    paths = (("amx", 1), ("vnni", None)) if HAS_AMX else (("vnni", None),)
    placements = ("cold", "hot") if args.hot else ("cold",)
    for n in [int(v) for v in args.per_expert.split(",")]:
        x = (rng.standard_normal((n, hidden)) * 0.5).astype(np.float32)
        for placement in placements:
            e = args.experts if placement == "cold" else args.hot_experts
            starts = range(0, resident - e + 1, e) if placement == "cold" else [0]
            routes = [np.tile(np.arange(e0, e0 + e), (n, 1)).astype(np.int64) for e0 in starts]
            for path, min_tokens in paths:
                for threads in sorted({1, args.threads}):
                    numba.set_num_threads(threads)
                    ms, p1 = median_ms(make_call(packed, threads), x, routes, min_tokens,
                                       args.repeats)
                    rows.append({"part": 1, "n": n, "placement": placement, "path": path,
                                 "threads": threads, "ms": ms, "phase1_share": round(p1, 3),
                                 "thread_ms_per_expert": ms * threads / e})
                    print(f"n={n:3d} {placement} {path:4s} threads={threads:2d} {ms:8.2f} ms   "
                          f"thread-ms per expert {ms * threads / e:7.2f}   phase 1 {p1:4.0%}",
                          flush=True)
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
            ms, p1 = median_ms(call, x, routes, min_tokens, args.repeats)
            rows.append({"part": 2, "tokens": num_tokens, "min_tokens": th, "ms": ms,
                         "phase1_share": round(p1, 3)})
            print(f"T={num_tokens:5d} threshold {th:>4s} {ms:8.2f} ms   phase 1 {p1:4.0%}",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
