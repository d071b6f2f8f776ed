"""Routed experts on the GPU (gpu_kernels.moe_grouped) for one MoE layer, beside the time to
copy that layer's expert blocks over PCIe: the numbers that decide, per layer and chunk, whether
streaming a layer's experts to the GPU beats running them on the CPU (issue 16).

    python scripts/bench_gpu_experts.py [--shapes v2-lite,v3] [--tokens 1,64,512,2048]

Per shape and token count: the grouped launches' time (median of do_bench, routing uniform at
random, top-k distinct), TFLOP/s of the products, and GB/s of the expert bytes the tokens touch;
then the layer's blocks copied from pinned host memory (GB/s, ms). Weights are random blocks of
a few experts repeated to the layer's count on the device (the values do not change the time).

    python scripts/bench_gpu_experts.py --stream [--shapes v3] [--tokens 512,2048,8192]
        [--stream-memory-gib 24,4]

times the streamed path as a prefill step runs it (hybrid/engine/prefill/expert_stream.py): the layer's
blocks in (page-locked) host memory, copied unit by unit while the previous ones compute, fp16
products; per layer in steady state (hybrid.engine.prefill.prefill_setup.streamed_layer_ms, median of
three), beside the plain copy of the same bytes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cpu_kernels.formats.random_blocks import random_rows
from gpu_kernels import qtypes as qt
from gpu_kernels.moe_grouped import moe_experts
from gpu_kernels.qformat import GpuQuant, to_planes

# name: (experts, top-k, hidden, intermediate, gate/up type, down type) at Q4_K_M (V2-Lite's
# down rows of 1408 are not whole Q6_K blocks: llama.cpp falls back to Q8_0)
SHAPES = {"v2-lite": (64, 6, 2048, 1408, qt.Q4_K, qt.Q8_0),
          "v3": (256, 8, 7168, 2048, qt.Q4_K, qt.Q6_K)}
DISTINCT = 4  # experts of random blocks, repeated to the layer's count


def expert_tensor(qtype: int, experts: int, rows: int, cols: int, seed: int) -> GpuQuant:
    raw = random_rows(np.random.default_rng(seed), qtype, DISTINCT * rows, cols, 0.02)
    one = to_planes(torch.from_numpy(raw.copy()).cuda(), qtype, DISTINCT * rows, cols)
    reps = -(-experts // DISTINCT)
    planes = tuple(p.repeat(reps, *([1] * (p.dim() - 1)))[:experts * rows].contiguous()
                   for p in one.planes)
    return GpuQuant(qtype, experts * rows, cols, planes)


def routing(tokens: int, k: int, experts: int) -> torch.Tensor:
    return torch.rand(tokens, experts, device="cuda").topk(k, dim=1).indices


def bench_shape(name: str, token_counts: list[int]) -> list[dict]:
    e, k, h, inter, gate_t, down_t = SHAPES[name]
    gate = expert_tensor(gate_t, e, inter, h, 1)
    up = expert_tensor(gate_t, e, inter, h, 2)
    down = expert_tensor(down_t, e, h, inter, 3)
    layer_bytes = gate.nbytes + up.nbytes + down.nbytes
    rows = []
    for t in token_counts:
        ids = routing(t, k, e)
        w = torch.rand(t, k, device="cuda")
        x = torch.randn(t, h, device="cuda")
        ms = triton.testing.do_bench(
            lambda x=x, ids=ids, w=w: moe_experts(x, ids, w, (gate, up), down, e),
            return_mode="median")
        touched = torch.unique(ids).numel()
        flops = 2 * t * k * 3 * h * inter
        rows.append({"shape": name, "tokens": t, "ms": ms, "TFLOPS": flops / ms / 1e9,
                     "GB_s": layer_bytes * touched / e / ms / 1e6,
                     "experts_touched": touched})
        print(f"{name:8} {t:5} tokens: {ms:8.3f} ms  {flops / ms / 1e9:6.1f} TFLOP/s  "
              f"{rows[-1]['GB_s']:6.0f} GB/s of touched experts ({touched}/{e})", flush=True)
    host = torch.empty(layer_bytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(layer_bytes, dtype=torch.uint8, device="cuda")
    copy_ms = triton.testing.do_bench(lambda: dev.copy_(host, non_blocking=True),
                                      return_mode="median")
    rows.append({"shape": name, "copy_ms": copy_ms, "layer_GB": layer_bytes / 1e9,
                 "pcie_GB_s": layer_bytes / copy_ms / 1e6})
    print(f"{name:8} layer {layer_bytes / 1e9:.2f} GB over PCIe from pinned memory: "
          f"{copy_ms:.1f} ms ({layer_bytes / copy_ms / 1e6:.1f} GB/s)", flush=True)
    return rows


# grouped_matmul tilings for many tokens: (rows per program, weights per K step, warps,
# stages), each in tf32x3 and in fp16
SWEEP = [None, (64, 64, 4, 1), (64, 128, 8, 1), (128, 64, 8, 1), (128, 128, 8, 1),
         (64, 128, 4, 2)]


def sweep(name: str, token_counts: list[int]) -> list[dict]:
    e, k, h, inter, gate_t, down_t = SHAPES[name]
    gate = expert_tensor(gate_t, e, inter, h, 1)
    up = expert_tensor(gate_t, e, inter, h, 2)
    down = expert_tensor(down_t, e, h, inter, 3)
    rows = []
    for t in token_counts:
        ids, w = routing(t, k, e), torch.rand(t, k, device="cuda")
        x = torch.randn(t, h, device="cuda")
        line = []
        for tiles in SWEEP:
            for fp16 in (False, True):
                ms = triton.testing.do_bench(
                    lambda x=x, ids=ids, w=w, tiles=tiles, fp16=fp16: moe_experts(
                        x, ids, w, (gate, up), down, e, tiles=tiles, fp16=fp16),
                    return_mode="median")
                rows.append({"shape": name, "tokens": t, "tiles": tiles, "fp16": fp16,
                             "ms": ms})
                line.append(f"{tiles or 'default'}{' fp16' if fp16 else ''}: {ms:.1f}")
        print(f"sweep {name} {t} tokens (ms): " + "  ".join(line), flush=True)
    return rows


def dense(name: str, token_counts: list[int]) -> list[dict]:
    """The grouped launches in fp16 tiles (decoding each weight tile per block of pairs) against
    decoding the layer's weights once into fp16 and grouped fp16 GEMMs (gpu_kernels/moe_dense.py),
    the decode's time apart and included."""
    from gpu_kernels.moe_dense import dense_rows, moe_experts_dense

    e, k, h, inter, gate_t, down_t = SHAPES[name]
    gate = expert_tensor(gate_t, e, inter, h, 1)
    up = expert_tensor(gate_t, e, inter, h, 2)
    down = expert_tensor(down_t, e, h, inter, 3)
    decode_ms = triton.testing.do_bench(lambda: [dense_rows(m) for m in (gate, up, down)],
                                        return_mode="median")
    rows = []
    for t in token_counts:
        ids, w = routing(t, k, e), torch.rand(t, k, device="cuda")
        x = torch.randn(t, h, device="cuda")
        tiled = triton.testing.do_bench(
            lambda x=x, ids=ids, w=w: moe_experts(x, ids, w, (gate, up), down, e, fp16=True),
            return_mode="median")
        both = triton.testing.do_bench(
            lambda x=x, ids=ids, w=w: moe_experts_dense(x, ids, w, (gate, up), down, e),
            return_mode="median")
        gemm = both - decode_ms
        a = moe_experts(x, ids, w, (gate, up), down, e, fp16=True)
        b = moe_experts_dense(x, ids, w, (gate, up), down, e)
        diff = float((a - b).norm() / a.norm())
        flops = 2 * t * k * 3 * h * inter
        rows.append({"shape": name, "tokens": t, "tiled_ms": tiled, "decode_ms": decode_ms,
                     "dense_gemm_ms": gemm, "dense_ms": both, "rel_diff": diff,
                     "dense_TFLOPS": flops / gemm / 1e9})
        print(f"{name:8} {t:5} tokens: fp16 tiles {tiled:7.2f} ms; decoded once {decode_ms:5.2f}"
              f" + GEMMs {gemm:6.2f} ms ({flops / gemm / 1e9:5.0f} TFLOP/s) = "
              f"{tiled / both:4.1f}x faster; rel diff {diff:.1e}", flush=True)
    return rows


STREAM_REPEATS = 5


def host_layer(name: str) -> tuple:
    """The layer's expert tensors in host memory as QuantMatrix stacks (DISTINCT experts' random
    blocks tiled to the layer's count)."""
    from cpu_kernels.formats.weights import QuantMatrix

    e, _, h, inter, gate_t, down_t = SHAPES[name]

    def stack(qtype: int, rows: int, cols: int, seed: int) -> QuantMatrix:
        raw = random_rows(np.random.default_rng(seed), qtype, DISTINCT * rows, cols, 0.02)
        reps = -(-e // DISTINCT)
        full = np.tile(raw.reshape(DISTINCT, -1), (reps, 1))[:e]
        return QuantMatrix.from_raw(qtype, (e, rows, cols), full)

    return stack(gate_t, inter, h, 1), stack(gate_t, inter, h, 2), stack(down_t, h, inter, 3)


def stream_rows(name: str, token_counts: list[int], budgets_gib: list[float],
                packed: bool = False) -> list[dict]:
    from hybrid.engine.prefill.expert_stream import ExpertStream
    from hybrid.engine.prefill.prefill_setup import streamed_layer_ms

    e, k, h, *_ = SHAPES[name]
    parts = host_layer(name)
    if packed:  # fast mode's source (packing a V3 layer takes minutes on one core)
        from cpu_kernels.fast.packed import PackedMatrix

        parts = tuple(PackedMatrix.of(m) for m in parts)
    layer_bytes = sum(m.nbytes for m in parts)
    rows = []
    for gib in budgets_gib:
        stream = ExpertStream([parts], torch.device("cuda"), int(gib * 2**30), fp16=True)
        dev = torch.empty(layer_bytes, dtype=torch.uint8, device="cuda")
        src = [torch.from_numpy((m.data if packed else m.blocks).reshape(-1)) for m in parts]

        def copy(dev=dev, src=src):
            at = 0
            for t in src:
                dev[at:at + t.numel()].copy_(t, non_blocking=True)
                at += t.numel()
        copy_ms = triton.testing.do_bench(copy, return_mode="median")
        for t in token_counts:
            ids, w = routing(t, k, e), torch.rand(t, k, device="cuda")
            x = torch.randn(t, h, device="cuda")
            ms = float(np.median([streamed_layer_ms(stream, x, ids, w, STREAM_REPEATS)
                                  for _ in range(3)]))
            rows.append({"shape": name, "packed": packed, "stream_memory_gib": gib, "tokens": t,
                         "stream_ms": ms, "copy_ms": copy_ms, "vs_copy": ms / copy_ms,
                         "pinned": stream.pinned, "units": -(-e // stream.experts_per_unit),
                         "layer_GB": layer_bytes / 1e9})
            print(f"{name:8} streamed{' packed' if packed else ''}, {gib:g} GiB ({rows[-1]['units']} units a layer, "
                  f"{'page-locked' if stream.pinned else 'pageable'}), {t:5} tokens: "
                  f"{ms:7.1f} ms a layer = {ms / copy_ms:.2f}x its copy ({copy_ms:.1f} ms, "
                  f"{layer_bytes / copy_ms / 1e6:.1f} GB/s)", flush=True)
        stream.registration.release()
        del stream, dev
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="v2-lite,v3")
    ap.add_argument("--tokens", default="1,8,64,512,2048")
    ap.add_argument("--json", default=None)
    ap.add_argument("--sweep", action="store_true", help="only the tiling sweep, then stop")
    ap.add_argument("--stream", action="store_true", help="only the streamed rows, then stop")
    ap.add_argument("--dense", action="store_true",
                    help="only fp16 tiles against weights decoded once (moe_dense.py), then stop")
    ap.add_argument("--packed", action="store_true",
                    help="stream fast mode's packed copy (unpacked on the GPU) instead")
    ap.add_argument("--stream-memory-gib", default="24,4",
                    help="GPU memory budgets of the streamed rows (GiB, comma-separated)")
    args = ap.parse_args()
    counts = [int(t) for t in args.tokens.split(",")]
    if args.dense:
        rows = [r for shape in args.shapes.split(",") for r in dense(shape, counts)]
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return 0
    if args.stream:
        budgets = [float(g) for g in args.stream_memory_gib.split(",")]
        rows = [r for shape in args.shapes.split(",")
                for r in stream_rows(shape, counts, budgets, args.packed)]
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return 0
    if args.sweep:
        rows = [r for shape in args.shapes.split(",") for r in sweep(shape, counts)]
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return 0
    rows = []
    for shape in args.shapes.split(","):
        rows += bench_shape(shape, counts)
        torch.cuda.empty_cache()  # the last layer's blocks
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
