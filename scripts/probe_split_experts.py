"""How much sooner a MoE layer's routed experts are read when the GPU takes a share of the used
experts over PCIe while the CPU computes the rest (GPU machine). The bound behind splitting a
decode step's experts (docs/serving.md, "The memory has bandwidth beyond the cores'"), measured
before any engine wiring: per layer, a kernel gathers the GPU's share of the experts' packed
bytes from page-locked host memory into device memory while packed_moe runs the other experts
on the CPU; the layer takes the longer of the two.

    python scripts/probe_split_experts.py [--layers 8] [--experts 64] [--tokens 1,16]
        [--shares 0,0.25,0.33,0.4] [--steps 10] [--threads 15] [--json out.json]

Rows: per token count and share, the median step over all layers (ms), the CPU's and the
GPU's own time a layer, and the step against share 0. V2-Lite's shapes (H 2048, I 1408, Q4_K
gate/up, Q8_0 down, 6 experts a token). The GPU only copies (its products on the gathered
experts take tens of microseconds on top).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numba
import numpy as np
import torch
import triton
import triton.language as tl

from cpu_kernels.fast.packed import pack
from cpu_kernels.fast.packed_moe import packed_moe
from cpu_kernels.formats import qtypes as qt
from cpu_kernels.formats.random_blocks import random_experts
from hybrid.engine.prefill.host_pinning import HostRegistration

HIDDEN, INTER, TOP_K = 2048, 1408, 6


@triton.jit
def _gather_kernel(src_ptr, which_ptr, dst_ptr, words, BLOCK: tl.constexpr):
    chunk = tl.program_id(0)
    slot = tl.program_id(1)
    row = tl.load(which_ptr + slot)
    if row >= 0:
        offs = chunk.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < words
        v = tl.load(src_ptr + row * words + offs, mask=mask, volatile=True)
        tl.store(dst_ptr + slot.to(tl.int64) * words + offs, v, mask=mask)


def gather(src: torch.Tensor, which: torch.Tensor, dst: torch.Tensor) -> None:
    """dst[s] = src[which[s]] (src [E, B] host, B a multiple of 4; dst [S, B] device)."""
    words = src.shape[1] // 4
    block = 2048
    _gather_kernel[(triton.cdiv(words, block), dst.shape[0])](
        src.view(torch.int32), which, dst.view(torch.int32), words, BLOCK=block, num_warps=4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--tokens", default="1,16")
    ap.add_argument("--shares", default="0,0.25,0.33,0.4")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=15)
    ap.add_argument("--json")
    a = ap.parse_args()
    numba.set_num_threads(a.threads)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    layers = [pack(random_experts(rng, a.experts, HIDDEN, INTER, qt.Q4_K, qt.Q4_K,
                                  qt.Q8_0)).packed for _ in range(a.layers)]
    mats = [(pk.gate, pk.up, pk.down) for pk in layers]
    hosts = [[m.data.reshape(a.experts, -1) for m in ms] for ms in mats]
    registration = HostRegistration([h for hs in hosts for h in hs])
    src = [[torch.from_numpy(h) for h in hs] for hs in hosts]
    expert_bytes = sum(h.shape[1] for h in hosts[0])
    print(f"{a.layers} layers x {a.experts} experts in {time.perf_counter() - t0:.0f} s, "
          f"{expert_bytes / 1e6:.2f} MB an expert, pinned: {registration.ok}", flush=True)
    stream = torch.cuda.Stream()
    rows = []
    for n in [int(t) for t in a.tokens.split(",")]:
        x = rng.standard_normal((n, HIDDEN), dtype=np.float32)
        w = np.full((n, TOP_K), 1.0 / TOP_K, np.float32)
        out = np.zeros((n, HIDDEN), np.float32)
        stamps = np.zeros(2, np.int64)
        most = max(1, round(0.5 * min(a.experts, n * TOP_K)))
        dst = [torch.empty(most, h.shape[1], dtype=torch.uint8, device="cuda")
               for h in hosts[0]]
        for share in [float(s) for s in a.shares.split(",")]:
            steps, cpu_ms, gpu_ms = [], [], []
            for step in range(a.steps + 1):
                ids = np.stack([rng.choice(a.experts, TOP_K, replace=False)
                                for _ in range(n)]).astype(np.int64)
                used = np.unique(ids)
                gpu = used[:int(share * used.size + 0.5)]  # the lowest-numbered share
                cpu_ids = np.where(np.isin(ids, gpu), -1, ids)
                which = torch.full((most,), -1, dtype=torch.long)
                which[:gpu.size] = torch.from_numpy(gpu)
                which = which.cuda()
                torch.cuda.synchronize()
                t = time.perf_counter()
                cpu_t = gpu_t = 0.0
                for layer, ms in enumerate(mats):
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    with torch.cuda.stream(stream):
                        start.record(stream)
                        if gpu.size:
                            for s, d in zip(src[layer], dst):
                                gather(s, which, d)
                        end.record(stream)
                    c = time.perf_counter()
                    packed_moe(ms[0].qtype, ms[0].data, ms[1].qtype, ms[1].data, ms[2].qtype,
                               ms[2].data, x, cpu_ids, w, float("inf"), out, stamps,
                               a.threads)
                    cpu_t += time.perf_counter() - c
                    end.synchronize()
                    gpu_t += start.elapsed_time(end) / 1e3
                if step:  # the first is a warm-up
                    steps.append(time.perf_counter() - t)
                    cpu_ms.append(cpu_t / a.layers * 1e3)
                    gpu_ms.append(gpu_t / a.layers * 1e3)
            row = {"tokens": n, "share": share, "step_ms": statistics.median(steps) * 1e3,
                   "cpu_layer_ms": statistics.median(cpu_ms),
                   "gpu_layer_ms": statistics.median(gpu_ms)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    print("\n| tokens | share | step ms | CPU ms a layer | GPU ms a layer | against share 0 |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        base = next(b for b in rows if b["tokens"] == r["tokens"] and b["share"] == 0.0)
        print(f"| {r['tokens']} | {r['share']:g} | {r['step_ms']:.2f} | {r['cpu_layer_ms']:.3f} "
              f"| {r['gpu_layer_ms']:.3f} | {base['step_ms'] / r['step_ms']:.2f}x faster |")


if __name__ == "__main__":
    main()
