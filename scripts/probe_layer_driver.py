"""What the CPU side of a decode step costs per MoE layer, driver against driver, under a fake
GPU: a thread that raises each layer's ready flag `--gap-us` after the previous layer's done flag
(the GPU's attention between two MoE layers), as the CUDA graph does.

Drivers, interleaved step by step on the same layers and routings:
- phases: drive_layers(one_region=False), packed_moe_kernel per layer (4 parallel regions a layer);
- region: drive_layers(one_region=True): one parallel region a step, spin barriers.
Prints per driver the median step's CPU time (step minus the gaps) and per layer (us), the
used experts' bytes over it (GB/s) and that against the read bandwidth measured in the same run
(runtime/bandwidth.py: the floor). A plain parallel read of the same bytes, layer by layer, was
tried as the floor and ran slower than the kernel (18 streams a thread), so it is not one.

    python scripts/probe_layer_driver.py [--layers 26] [--experts 8] [--tokens 1,4]
        [--gap-us 0,150] [--steps 30] [--threads 15] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import numba
import numpy as np
from numba import njit

from cpu_kernels.fast.packed import pack
from cpu_kernels.formats import qtypes as qt
from cpu_kernels.formats.random_blocks import random_experts
from cpu_kernels.runtime.bandwidth import read_bandwidth
from cpu_kernels.runtime.handshake import store_release, wait_equal
from cpu_kernels.runtime.layer_driver import drive_layers, of_tuples
from cpu_kernels.simd.clock import cycles, cycles_per_us


@njit(nogil=True, cache=True)
def fake_gpu(ready, done, seq, gap_cycles, timeout):
    for layer in range(ready.shape[0]):
        if layer > 0 and not wait_equal(done, layer - 1, seq, timeout):
            return
        start = cycles()
        while cycles() - start < gap_cycles:
            pass
        store_release(ready, layer, seq)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=26)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--tokens", default="1,4")
    ap.add_argument("--gap-us", default="0,150")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=15)
    ap.add_argument("--json")
    a = ap.parse_args()
    numba.set_num_threads(a.threads)
    rng = np.random.default_rng(0)
    hidden, inter, top_k = 2048, 1408, 6
    t0 = time.perf_counter()
    per_layer = []
    for _ in range(a.layers):
        pk = pack(random_experts(rng, a.experts, hidden, inter, qt.Q4_K, qt.Q4_K, qt.Q8_0)).packed
        per_layer.append((pk.gate.qtype, pk.gate.data, pk.up.qtype, pk.up.data, pk.down.qtype,
                          pk.down.data, float("inf")))
    per_layer = tuple(per_layer)
    layers = of_tuples(per_layer)
    expert_bytes = sum(per_layer[0][2 * m + 1][0].nbytes for m in range(3))
    print(f"made {a.layers} layers x {a.experts} experts in {time.perf_counter() - t0:.1f} s; "
          f"{expert_bytes / 1e6:.2f} MB an expert", flush=True)
    bw = read_bandwidth(1 << 30)
    cpu_us = cycles_per_us()
    timeout = int(10e6 * cpu_us)
    rows, seq = [], 0

    def run(name, ready, done, n, x, ids, w):
        out = np.zeros((n, hidden), np.float32)
        stamps = np.zeros((a.layers, 2), np.int64)
        return drive_layers(ready, done, seq, n, x, ids, w, out, layers, timeout, stamps,
                            one_region=name == "region")

    for n in (int(v) for v in a.tokens.split(",")):
        x = rng.standard_normal((n, hidden)).astype(np.float32)
        w = rng.random((n, top_k)).astype(np.float32)
        for gap in (float(v) for v in a.gap_us.split(",")):
            times = {"phases": [], "region": []}
            counts = []
            for step in range(a.steps + 3):
                ids = np.stack([rng.choice(a.experts, top_k, replace=False)
                                for _ in range(n)]).astype(np.int64)
                counts.append(len(np.unique(ids)))
                for name, samples in times.items():
                    seq += 1
                    ready = np.zeros(a.layers, np.int64)
                    if step == 0:  # compile (and warm) the driver with every flag raised
                        ready[:] = seq
                        run(name, ready, np.zeros(a.layers, np.int64), n, x, ids, w)
                        seq += 1
                    done = np.zeros(a.layers, np.int64)
                    gpu = threading.Thread(target=fake_gpu, args=(ready, done, seq,
                                                                  int(gap * cpu_us), timeout))
                    gpu.start()
                    t = time.perf_counter()
                    got = run(name, ready, done, n, x, ids, w)
                    dt = time.perf_counter() - t
                    gpu.join()
                    assert got == a.layers, (name, got)
                    if step >= 3:
                        samples.append(dt * 1e6 - a.layers * gap)
            used_bytes = statistics.mean(counts) * expert_bytes * a.layers
            for name, ts in times.items():
                med = statistics.median(ts)
                rows.append({"driver": name, "tokens": n, "gap_us": gap, "step_cpu_us": med,
                                 "layer_us": med / a.layers, "gbps": used_bytes / med / 1e3,
                                 "of_bandwidth": used_bytes / med / 1e3 / bw})
                print(rows[-1], flush=True)
    print(f"\nread bandwidth {bw:.1f} GB/s, {a.threads} threads, layers {a.layers}, numba's "
          f"{numba.threading_layer()} layer")
    print("| driver | tokens | gap us | CPU us a step | us a layer | GB/s | of bandwidth |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['driver']} | {r['tokens']} | {r['gap_us']:.0f} | {r['step_cpu_us']:.0f} | "
              f"{r['layer_us']:.1f} | {r['gbps']:.1f} | {r['of_bandwidth']:.0%} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"bandwidth": bw, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
