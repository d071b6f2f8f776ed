"""Benchmark the CPU routed-expert MoE kernels (cpu_kernels.moe_forward) against read bandwidth.

DeepSeek-V3 (H 7168, I 2048, 256 experts, top-8) and V2-Lite (H 2048, I 1408, 64 experts, top-6)
shapes with Q4_K_M-like types (V3: Q4_K gate/up, Q6_K down; Lite: I=1408 is no multiple of 256, so
Q5_0 gate/up and Q8_0 down, llama.cpp's fallbacks), random valid blocks made in-process. Prints ms
per layer (the median call), GB/s of distinct expert weights read and the percentage of the read
bandwidth measured in the same run. `fast` mode runs on the packed copy (`cpu_kernels.fast.packed.pack`,
timed once per shape as load-time work), with experts of >= 12 tokens on AMX bf16 tiles where the
CPU has AMX; `fast-vnni` is fast mode with AMX off (int8 VNNI kernels alone), for the two side by
side. `--resident` caps the experts held in memory (routing draws from those), so the script fits
small machines (the default, 64, puts 4x the tokens of a 256-expert V3 on each expert; the V3 shape
itself is `--resident 256`, 15 GB with its packed copy); `--quick` is a short run for 2-core CI
machines. Then, at T=1, the per-call overhead of the synchronous call (outside its kernel) and the
wake-up latency of a MoEPool with `--pool-threads` threads (submit -> kernel start, kernel end ->
wait() returns), in microseconds, from cycle stamps the kernels write. Where kt-kernel's extension
is found (`--kt-root`, KT_KERNEL_ROOT), its llamafile (Q4_K_M) and AMX int4/int8 MoEs run on the
same shapes and token counts as extra modes (kt_kernel_peer.py).

    python scripts/bench_cpu_moe.py --quick
    python scripts/bench_cpu_moe.py --shapes v3 --tokens 1,8,128 --threads 16 --json rows.json
    python scripts/bench_cpu_moe.py --shapes v3 --modes fast,kt-llamafile --kt-root .kt
"""

from __future__ import annotations

import argparse
import json
import time
from collections import deque
from collections.abc import Callable

import numba
import numpy as np
from kt_kernel_peer import MODES as KT_MODES
from kt_kernel_peer import KtPeer, load_extension

from cpu_kernels.fast.packed import pack
from cpu_kernels.formats import qtypes as qt
from cpu_kernels.formats.random_blocks import random_experts
from cpu_kernels.moe import moe_forward
from cpu_kernels.runtime.bandwidth import read_bandwidth
from cpu_kernels.runtime.latency import call_overhead, pool_latency
from cpu_kernels.runtime.pool import MoEPool

SHAPES = {
    # name: (hidden, inter, num_experts, top_k, gate/up type, down type)
    "v3": (7168, 2048, 256, 8, qt.Q4_K, qt.Q6_K),
    "lite": (2048, 1408, 64, 6, qt.Q5_0, qt.Q8_0),
    # V2-Lite with Q4_K gate/up (their rows are H = 2048 long); down rows of 1408 take Q8_0
    "lite-q4k": (2048, 1408, 64, 6, qt.Q4_K, qt.Q8_0),
    # the routed experts of Q2_K mixes (llama.cpp's Q2_K, unsloth's Q2_K mixes)
    "v3-q2k": (7168, 2048, 256, 8, qt.Q2_K, qt.Q3_K),
    # unsloth's dynamic R1/V3 experts: UD-IQ1_S's later layers, UD-IQ1_M's
    "v3-ud-iq1_s": (7168, 2048, 256, 8, qt.IQ1_S, qt.IQ1_S),
    "v3-ud-iq1_m": (7168, 2048, 256, 8, qt.IQ1_M, qt.IQ2_XXS),
    # one row per i-quant, every matrix in it (v3-iq4_nl: IQ4_NL, the fallback type, alone)
    **{f"v3-{qt.type_name(t).lower()}": (7168, 2048, 256, 8, t, t) for t in qt.TABLE_CODED},
}


WARMUP_S = 0.25
WARMUP_CAP_S = 10.0


def bench_latency(name: str, mode: str, experts, pool: MoEPool, rng: np.random.Generator
                  ) -> dict:
    """T=1: overhead of the synchronous call, and a pool's wake-up latency (microseconds)."""
    hidden, top_k = experts.hidden_size, min(SHAPES[name][3], experts.num_experts)
    x = (rng.standard_normal((1, hidden)) * 0.5).astype(np.float32)
    ids = rng.choice(experts.num_experts, top_k, replace=False)[None]
    weights = rng.random(ids.shape).astype(np.float32)
    placed = pool.place(experts, mode)
    row = {"shape": name, "mode": mode, "pool_threads": sum(g.num_threads for g in pool.groups),
           "groups": len(pool.groups)}
    row.update({f"call_{k}_us": v for k, v in call_overhead(placed, x, ids, weights, 30).items()})
    for gap in (0.0, 0.002):
        lat = pool_latency(pool, placed, x, ids, weights, repeats=30, gap_s=gap)
        row.update({f"pool{'_idle' if gap else ''}_{k}_us": v for k, v in lat.items()})
    print(f"{name:8s} {mode:5s} T=1 call: check {row['call_check_us']:.0f} + enter "
          f"{row['call_enter_us']:.0f} + kernel {row['call_kernel_us']:.0f} + leave "
          f"{row['call_leave_us']:.0f} us | pool ({row['pool_threads']} thr, {row['groups']} "
          f"group): submit->kernel {row['pool_wake_us'] + row['pool_prep_us']:.0f} "
          f"(wake {row['pool_wake_us']:.0f} + prep {row['pool_prep_us']:.0f}), kernel end->wait "
          f"{row['pool_back_us']:.0f}; after 2 ms idle: {row['pool_idle_wake_us'] + row['pool_idle_prep_us']:.0f}"
          f", {row['pool_idle_back_us']:.0f} us", flush=True)
    return row


def make_row(name: str, label: str, num_tokens: int, distinct: float, ms: float,
             ms_mean: float, calls: int, expert_nbytes: int, resident: int,
             bandwidth: float) -> dict:
    """One result row, printed as it comes; GB/s counts the GGUF bytes of the distinct experts."""
    gbs = distinct * expert_nbytes / (ms / 1e3) / 1e9
    r = {"shape": name, "mode": label, "tokens": num_tokens, "threads": numba.get_num_threads(),
         "resident_experts": resident, "distinct_experts": float(distinct), "ms": round(ms, 3),
         "ms_mean": round(ms_mean, 3), "calls": calls, "weight_gbs": round(gbs, 2),
         "pct_bandwidth": round(100 * gbs / bandwidth, 1), "bandwidth_gbs": round(bandwidth, 2)}
    print(f"{name:5s} {label:12s} T={num_tokens:5d} thr={r['threads']:2d} experts={distinct:6.1f}"
          f"  {ms:9.2f} ms  {gbs:6.2f} GB/s  {r['pct_bandwidth']:5.1f}% of {bandwidth:.1f}",
          flush=True)
    return r


def routings(rng: np.random.Generator, num_tokens: int, resident: int, top_k: int,
             count: int) -> list[np.ndarray]:
    """`count` random routings [T, K] over the resident experts (distinct experts per token)."""
    return [np.stack([rng.choice(resident, min(top_k, resident), replace=False)
                      for _ in range(num_tokens)]) for _ in range(count)]


def bench_kt(name: str, tokens: list[int], experts, mode: str, peer: KtPeer, repeats: int,
             bandwidth: float, rng: np.random.Generator) -> list[dict]:
    """kt-kernel's rows on the same shape (kt_kernel_peer.py): mean of queued calls."""
    hidden, inter, _, top_k, _, _ = SHAPES[name]
    resident = experts.num_experts
    top_k = min(top_k, resident)
    try:
        moe = (peer.llamafile(experts, top_k) if mode == "kt-llamafile"
               else peer.amx(mode, resident, hidden, inter, top_k, rng))
    except (RuntimeError, ValueError, TypeError) as e:  # e.g. a quant type kt lacks
        print(f"{name}: {mode} not run: {type(e).__name__}: {e}", flush=True)
        return []
    rows = []
    for num_tokens in tokens:
        x = (rng.standard_normal((num_tokens, hidden)) * 0.5).astype(np.float32)
        routes = routings(rng, num_tokens, resident, top_k, repeats)
        weights = rng.random(routes[0].shape).astype(np.float32)
        times, calls = [], 0
        for ids in routes:
            ms, n = peer.ms_per_call(moe, x, ids, weights, min_seconds=0.5 / repeats)
            times.append(ms)
            calls += n
        distinct = np.mean([np.unique(ids).size for ids in routes])
        rows.append(make_row(name, mode, num_tokens, distinct, float(np.median(times)),
                             float(np.mean(times)), calls, experts.expert_nbytes(), resident,
                             bandwidth))
    return rows


def bench_shape(name: str, tokens: list[int], resident: int, mode: str, repeats: int,
                bandwidth: float, rng: np.random.Generator,
                make_pool: Callable[[], MoEPool] | None = None, peer: KtPeer | None = None
                ) -> tuple[list[dict], dict | None]:
    hidden, inter, num_experts, top_k, gu_type, down_type = SHAPES[name]
    resident = min(resident, num_experts)
    experts = random_experts(rng, resident, hidden, inter, gu_type, gu_type, down_type)
    if mode in KT_MODES:
        return bench_kt(name, tokens, experts, mode, peer, repeats, bandwidth, rng), None
    use_amx = mode != "fast-vnni"  # fast mode with AMX off: VNNI's rows in the same run
    mode = "fast" if mode == "fast-vnni" else mode
    label = mode if use_amx else "fast-vnni"
    if mode == "fast":
        t = time.perf_counter()
        pack(experts)
        print(f"{name}: packed {resident} experts in {time.perf_counter() - t:.1f} s", flush=True)
    rows = []
    for num_tokens in tokens:
        x = (rng.standard_normal((num_tokens, hidden)) * 0.5).astype(np.float32)
        out = np.empty_like(x)
        routes = routings(rng, num_tokens, resident, top_k, repeats + 1)
        weights = rng.random(routes[0].shape).astype(np.float32)
        # The first call compiles the kernels where numba's cache is cold (~3 min on a fresh
        # GPU machine): it runs before the warm-up's clock starts. Started before it, the clock
        # had run out after that one call, which left 1 timed call (reps below) right after
        # compiling: the first row of a fresh process read 19-34 ms against 2.0-2.6 (Nov 26).
        moe_forward(x, routes[0], weights, experts, out, mode=mode, use_amx=use_amx)
        # warm-up: calls for WARMUP_S at least, then until the last 8 calls' median is within
        # 25% of the fastest call so far (at most WARMUP_CAP_S). Right after packing, calls ran
        # several times slower for a while on the GPU machine: T=1 4-14 ms against 2.4-2.7
        # (Nov 23). (A phase slow from its very first call until the cap would still pass:
        # nothing here tells it from a slow kernel.)
        end, cap, warm = time.perf_counter() + WARMUP_S, time.perf_counter() + WARMUP_CAP_S, 0
        recent: deque[float] = deque(maxlen=8)
        best = float("inf")
        while True:
            t = time.perf_counter()
            moe_forward(x, routes[warm % len(routes)], weights, experts, out, mode=mode,
                        use_amx=use_amx)
            dt = time.perf_counter() - t
            recent.append(dt)
            best = min(best, dt)
            warm += 1
            settled = dt > 0.1 or (len(recent) == recent.maxlen
                                   and float(np.median(recent)) <= 1.25 * best)
            if t + dt >= cap or (t + dt >= end and settled):
                break
        if not settled:
            print(f"{name} T={num_tokens}: calls had not settled after {WARMUP_CAP_S:.0f} s of "
                  f"warm-up ({warm} calls)", flush=True)
        # large T: fewer repeats, about a second per row at most
        reps = max(1, min(repeats, int(1.0 / max(time.perf_counter() - t, 1e-6))))
        times = []
        for ids in routes[1:reps + 1]:
            t = time.perf_counter()
            moe_forward(x, ids, weights, experts, out, mode=mode, use_amx=use_amx)
            times.append(time.perf_counter() - t)
        ms = float(np.median(times)) * 1e3  # the median call (the mean is in the JSON)
        distinct = np.mean([np.unique(ids).size for ids in routes[1:reps + 1]])
        rows.append(make_row(name, label, num_tokens, distinct, ms,
                             float(np.mean(times)) * 1e3, reps, experts.expert_nbytes(),
                             resident, bandwidth))
    if make_pool is None or not use_amx:
        return rows, None
    # A pool lives only for its latency rows: its kernel threads would otherwise compete with
    # the next throughput rows (numba's own threads).
    with make_pool() as pool:
        return rows, bench_latency(name, mode, experts, pool, rng)


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
    p.add_argument("--modes", default="exact,fast",
                   help="exact, fast, fast-vnni (fast with AMX off: the VNNI kernels alone), and "
                        "with --kt-root: " + ", ".join(KT_MODES))
    p.add_argument("--kt-root", default=None,
                   help="folder with kt-kernel's kt_kernel/_kt_kernel_ext_amx*.so and "
                        "kt_kernel.libs/ (or KT_KERNEL_ROOT): adds its modes side by side")
    p.add_argument("--exact-tokens", default="1,8",
                   help="token counts also run in exact mode (its kernels are scalar: slow)")
    p.add_argument("--threads", type=int, default=numba.config.NUMBA_NUM_THREADS)
    p.add_argument("--pool-threads", type=int, default=None,
                   help="MoEPool threads for the latency rows (default: physical cores - 1)")
    p.add_argument("--numa-nodes", type=int, default=None, help="MoEPool NUMA groups override")
    p.add_argument("--no-latency", action="store_true", help="skip the T=1 latency rows")
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
    rows, latency = [], []
    make_pool = None if args.no_latency else (lambda: MoEPool(args.pool_threads, args.numa_nodes))
    modes = args.modes.split(",")
    ext = load_extension(args.kt_root)
    peer = KtPeer(ext, args.threads) if ext is not None else None
    if peer is None and any(m in KT_MODES for m in modes):
        print("kt-kernel not found (--kt-root / KT_KERNEL_ROOT): its modes are skipped")
        modes = [m for m in modes if m not in KT_MODES]
    elif peer is not None and not any(m in KT_MODES for m in modes):
        modes += list(KT_MODES)  # found: side by side by default
    for name in args.shapes.split(","):
        for mode in modes:
            tokens = [int(t) for t in args.tokens.split(",")]
            if mode == "exact":
                tokens = [t for t in tokens if str(t) in args.exact_tokens.split(",")]
            r, lat = bench_shape(name, tokens, args.resident, mode, args.repeats, bandwidth, rng,
                                 make_pool, peer)
            rows += r
            latency += [lat] if lat else []
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "latency": latency}, f, indent=1)


if __name__ == "__main__":
    main()
