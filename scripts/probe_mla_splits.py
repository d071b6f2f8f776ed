"""One decode row's MLA attention (gpu_kernels.mla_decode: split kernel + merge) at the split
count an eager step picks for its length against the one a captured graph bakes in (sized for
the longest sequence the cache holds), GPU time per call inside a CUDA graph (GPU machine).

    python scripts/probe_mla_splits.py [--heads 16] [--lens 128,512,2048,8192] [--graph-splits 64]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_kernels.mla_decode import choose_splits, mla_decode, mla_decode_ref

CALLS = 20  # calls captured in one graph
REPLAYS = 20


def time_call(fn) -> float:
    """GPU us per fn() call, replayed in a graph of CALLS calls."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(CALLS):
            fn()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(REPLAYS):
        g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / (CALLS * REPLAYS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--lens", default="128,512,2048,8192")
    ap.add_argument("--graph-splits", type=int, default=64)
    ap.add_argument("--page-size", type=int, default=64)
    args = ap.parse_args()
    dev, h, c, r, ps = torch.device("cuda"), args.heads, 512, 64, args.page_size
    print("| tokens | splits (eager) | us | splits (graph) | us | max err vs ref |")
    print("|---|---|---|---|---|---|")
    for n in (int(x) for x in args.lens.split(",")):
        pages = -(-n // ps)
        cache = torch.randn(pages * ps + 1, c + r, device=dev).bfloat16()
        table = torch.randperm(pages, device=dev, dtype=torch.int32)[None]
        lens = torch.tensor([n], device=dev, dtype=torch.int32)
        q, qr = torch.randn(1, h, c, device=dev), torch.randn(1, h, r, device=dev)
        out = torch.empty(1, h, c, device=dev)
        row = [str(n)]
        ref = mla_decode_ref(q, qr, cache, table, lens, ps, 0.07)
        err = 0.0
        for splits in (choose_splits(1, h, n), args.graph_splits):
            args_ = (q, qr, cache, table, lens, ps, 0.07, splits)
            us = time_call(lambda a=args_: mla_decode(*a, out=out))  # noqa: B023 (out: reused)
            err = max(err, (out - ref).abs().max().item())
            row += [str(splits), f"{us:.1f}"]
        print("| " + " | ".join(row + [f"{err:.1e}"]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
