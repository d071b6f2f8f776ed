"""Paged MLA decode side by side, on the GPU machine: ours (gpu_kernels.mla_decode, Triton)
against flashinfer's BatchMLAPagedAttentionWrapper (fa2 and, on Hopper, fa3) on the same cache,
pages and queries, in one run.

    python scripts/bench_mla_peer.py [--json out.json] [--backends fa2,fa3]

Both read our cache layout ([slots + 1, 576] bf16 rows, 64-token pages, pages shuffled);
flashinfer through strided views of it (gpu_kernels/mla_decode_flashinfer.py). Times: the
kernel calls replayed inside one CUDA graph of 20 calls (as the engine replays a decode step),
median of triton.testing.do_bench; flashinfer's host-side plan (once per step, shared by every
layer) timed apart. Error: max |out - float64 reference| / max |reference|.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_gpu_kernels import graph_ms  # kernel calls replayed as one CUDA graph

from gpu_kernels.mla_decode import choose_splits, mla_decode, mla_decode_ref
from gpu_kernels.mla_decode_flashinfer import FlashInferMLADecode, available

PAGE, C, R, SCALE = 64, 512, 64, 0.07
# (heads, lengths of the batch's sequences): V2-Lite's 16 heads and V3's 128
CASES = [(16, [512]), (16, [4096]), (16, [32768]), (16, [1024] * 8), (16, [2048] * 32),
         (16, [300, 7000, 50, 2048, 1, 900, 15000, 64]),
         (128, [512]), (128, [4096]), (128, [32768]), (128, [2048] * 8), (128, [4096] * 16),
         (128, [300, 7000, 50, 2048, 1, 900, 15000, 64])]


def make_case(heads: int, lens: list[int]):
    b = len(lens)
    per = [triton.cdiv(n, PAGE) for n in lens]
    width = max(per)
    pages = sum(per) + 1
    cache = (torch.randn(pages * PAGE + 1, C + R, device="cuda") * 0.5).bfloat16()
    order = torch.randperm(pages, device="cuda").int()
    table = torch.zeros(b, width, dtype=torch.int32, device="cuda")
    at = 0
    for i, k in enumerate(per):
        table[i, :k] = order[at:at + k]
        at += k
    q = torch.randn(b, heads, C, device="cuda") * 0.1
    qr = torch.randn(b, heads, R, device="cuda") * 0.1
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    return cache, table, q, qr, seq


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).abs().max() / ref.abs().max())


def bench_case(heads: int, lens: list[int], backends: list[str]) -> dict:
    cache, table, q, qr, seq = make_case(heads, lens)
    ref = mla_decode_ref(q, qr, cache, table, seq, PAGE, SCALE)
    splits = choose_splits(len(lens), heads, max(lens))
    out = torch.empty(len(lens), heads, C, device="cuda")
    ours = graph_ms(lambda: mla_decode(q, qr, cache, table, seq, PAGE, SCALE, splits, out=out))
    mla_decode(q, qr, cache, table, seq, PAGE, SCALE, splits, out=out)
    row = {"heads": heads, "lens": lens, "read_MB": sum(lens) * (C + R) * 2 / 1e6,
           "ours_us": ours * 1e3, "ours_err": rel_err(out, ref)}
    for name in backends:
        try:
            fi = FlashInferMLADecode(torch.device("cuda"), heads, C, R, PAGE, SCALE,
                                     backend=name)
            t0 = time.perf_counter()
            fi.plan(table, seq)
            fi.run(q, qr, cache, out=out)  # first plan/run may compile (JIT)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            row[f"{name}_err"] = rel_err(out, ref)
            plans = []
            for _ in range(20):
                t0 = time.perf_counter()
                fi.plan(table, seq)
                plans.append(time.perf_counter() - t0)
            row[f"{name}_plan_us"] = sorted(plans)[len(plans) // 2] * 1e6
            row[f"{name}_us"] = graph_ms(lambda fi=fi: fi.run(q, qr, cache, out=out)) * 1e3
            row[f"{name}_first_s"] = first
        except Exception as e:  # noqa: BLE001 (a backend this GPU or build lacks: say so, go on)
            row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return row


SWEEP_CASES = [(128, [4096]), (128, [32768]), (128, [2048] * 8),
               (128, [300, 7000, 50, 2048, 1, 900, 15000, 64]), (16, [4096]), (16, [32768]),
               (16, [512]), (16, [1024] * 8), (128, [512]), (16, [2048] * 32)]
# ours: (heads per program, tokens per block, warps, GPU fill factor of the split count,
# product precision)
SWEEP = [(32, 64, 8, 2, "tf32"), (16, 32, 4, 2, "tf32"), (32, 64, 8, 2, "bf16x2"),
         (16, 32, 4, 2, "bf16x2"), (16, 64, 8, 2, "bf16x2"), (64, 64, 8, 2, "bf16x2"),
         (32, 32, 4, 2, "bf16x2"), (64, 32, 8, 2, "bf16x2"), (32, 128, 8, 2, "bf16x2"),
         (16, 64, 4, 2, "bf16x2"), (64, 64, 4, 2, "bf16x2"), (32, 64, 4, 2, "bf16x2")]


def sweep() -> list[dict]:
    """Our kernel's tile and split choices on the cases where flashinfer led."""
    rows = []
    for heads, lens in SWEEP_CASES:
        cache, table, q, qr, seq = make_case(heads, lens)
        ref = mla_decode_ref(q, qr, cache, table, seq, PAGE, SCALE)
        out = torch.empty(len(lens), heads, C, device="cuda")
        line = []
        for bh, bs, warps, fill, prec in SWEEP:
            kw = {"heads_per_program": bh, "block_tokens": bs, "num_warps": warps,
                  "precision": prec}
            splits = choose_splits(len(lens), heads, max(lens), heads_per_program=bh, fill=fill)
            args = (q, qr, cache, table, seq, PAGE, SCALE, splits)
            try:
                us = graph_ms(lambda a=args, kw=kw, o=out: mla_decode(*a, out=o, **kw)) * 1e3
                mla_decode(*args, out=out, **kw)
                err = rel_err(out, ref)
            except Exception as e:  # noqa: BLE001 (a tile that does not fit: say so, go on)
                us, err = float("nan"), str(e)[:80]
            rows.append({"heads": heads, "lens": lens, "bh": bh, "bs": bs, "warps": warps,
                         "fill": fill, "precision": prec, "splits": splits, "us": us,
                         "err": err})
            line.append(f"{bh}/{bs}/{warps}/{fill}/{prec}: {us:.1f}")
        print(f"sweep H={heads} B={len(lens)} tokens={sum(lens)}: " + "  ".join(line),
              flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--backends", default="fa2,fa3")
    ap.add_argument("--sweep", action="store_true",
                    help="only our kernel's tile, split and precision choices "
                         "(heads/tokens/warps/fill/precision)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    if args.sweep:
        rows = sweep()
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return 0
    backends = args.backends.split(",") if available() else []
    if not available():
        print("flashinfer is not importable: ours only")
    rows = []
    for heads, lens in CASES:
        row = bench_case(heads, lens, backends)
        rows.append(row)
        errs = {k: v for k, v in row.items() if k.endswith("_error")}
        print(json.dumps(row if errs else {k: v for k, v in row.items() if k != "lens"}),
              flush=True)
    print(f"\n{'H':>4} {'B':>3} {'tokens':>7} | {'ours us':>8} {'GB/s':>5} {'err':>7} | " +
          " | ".join(f"{n + ' us':>8} {'GB/s':>5} {'err':>7} {'plan us':>7} {'x ours':>6}"
                     for n in backends))
    for row in rows:
        mb = row["read_MB"]
        line = (f"{row['heads']:4} {len(row['lens']):3} {sum(row['lens']):7} | "
                f"{row['ours_us']:8.1f} {mb / row['ours_us'] * 1e3:5.0f} {row['ours_err']:7.1e}")
        for n in backends:
            if f"{n}_us" in row:
                us = row[f"{n}_us"]
                line += (f" | {us:8.1f} {mb / us * 1e3:5.0f} {row[f'{n}_err']:7.1e} "
                         f"{row[f'{n}_plan_us']:7.0f} {row['ours_us'] / us:6.2f}")
            else:
                line += f" | {'failed':>8}"
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
