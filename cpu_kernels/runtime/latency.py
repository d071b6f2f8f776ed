"""Latency of the MoE entry points, from the kernels' cycle stamps (benchmark helpers).

`pool_latency`: the wake-up latency of a MoEPool.

Per job, in microseconds (the slowest group where there are several):
    wake    submit() began -> a group's thread took the job from its queue
    prep    -> its kernel started (routing, activation quantization, buffers, numba dispatch)
    kernel  first kernel start -> last kernel end
    back    last kernel end -> wait() returned in the submitting thread
    total   submit() began -> wait() returned
and `sync`: the same call through the synchronous moe_forward, in the caller's thread.
`gap_s` leaves the pool idle between jobs, as GPU work between two MoE layers would. Every job
routes to the same experts: the kernel times are cache-warm, the overheads are the point.
"""

from __future__ import annotations

import time

import numpy as np

from cpu_kernels.moe import check_inputs, moe_forward, run_moe
from cpu_kernels.runtime.placement import PlacedExperts
from cpu_kernels.runtime.pool import MoEPool
from cpu_kernels.simd.clock import cycles_per_us, now_cycles

FIELDS = ("wake", "prep", "kernel", "back", "total")


def pool_latency(pool: MoEPool, placed: PlacedExperts, x: np.ndarray, topk_ids: np.ndarray,
                 topk_weights: np.ndarray, repeats: int = 100, gap_s: float = 0.0
                 ) -> dict[str, float]:
    """Median microseconds of each FIELDS stage over `repeats` jobs (after 3 warm-up jobs)."""
    rate = cycles_per_us()
    out = np.empty_like(x)
    rows = []
    for i in range(repeats + 3):
        if gap_s:
            time.sleep(gap_s)  # the benchmark's idle time, not part of the measured path
        job = pool.submit(x, topk_ids, topk_weights, placed, out)
        job.wait()
        back = now_cycles()
        s, t0 = job.stamps, job.submitted
        if i >= 3:
            rows.append((s[:, 0].max() - t0, (s[:, 1] - s[:, 0]).max(), s[:, 2].max() - s[:, 1].min(),
                         back - s[:, 2].max(), back - t0))
    med = np.median(np.array(rows, np.float64), axis=0) / rate
    res = dict(zip(FIELDS, (round(float(v), 1) for v in med)))
    mode = "fast" if placed.fast else "exact"
    times = []
    for _ in range(repeats):
        if gap_s:
            time.sleep(gap_s)
        t = time.perf_counter()
        moe_forward(x, topk_ids, topk_weights, placed.experts, out, mode=mode)
        times.append(time.perf_counter() - t)
    res["sync"] = round(float(np.median(times)) * 1e6, 1)
    return res


def call_overhead(experts: PlacedExperts, x: np.ndarray, topk_ids: np.ndarray,
                  topk_weights: np.ndarray, repeats: int = 100) -> dict[str, float]:
    """Median microseconds of a synchronous call outside its kernel: `enter` from the call to
    the kernel's first instruction, `leave` from its last to the return; and `kernel`.

    The call is run_moe, what moe_forward runs after checking its inputs (`check`: that part).
    """
    rate = cycles_per_us()
    out = np.empty_like(x)
    stamps = np.empty(2, np.int64)
    sl = experts.slices[0]
    rows = []
    for i in range(repeats + 3):
        t0 = now_cycles()
        run_moe(x, topk_ids, topk_weights, experts.experts, sl.packed, sl.i_lo, out, experts.fast,
                stamps, sl.i_hi)
        t1 = now_cycles()
        if i >= 3:
            rows.append((stamps[0] - t0, stamps[1] - stamps[0], t1 - stamps[1]))
    enter, kernel, leave = np.median(np.array(rows, np.float64), axis=0) / rate
    t = time.perf_counter()
    for _ in range(repeats):
        check_inputs(x, topk_ids, topk_weights, experts.experts, out)
    check = (time.perf_counter() - t) / repeats * 1e6
    return {"check": round(check, 1), "enter": round(float(enter), 1),
            "kernel": round(float(kernel), 1), "leave": round(float(leave), 1)}
