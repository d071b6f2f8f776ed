"""What bounds a decode product's weight bandwidth (GPU machine): stripped-down Q4_K products.

    python scripts/probe_gemv_limits.py [--json out.json]

Each probe reads a Q4_K matrix's planes as qmatmul does at one token and keeps a part of the
work, so the differences place the time:
- read: the packed nibbles only, summed as integers (the load structure's ceiling);
- x32 / x16: nibbles times x (fp32 / fp16 x), no scales;
- full: qmatmul itself (scales, mins, fp32 x).
Tiles: rows per program, bytes of each row per K step, warps. Timed as bench_gpu_kernels.py
(CUDA graphs of 20 calls over rotating copies larger than L2).
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_gpu_kernels import (
    bench_product,
    graph_ms,
    report_copy_bandwidth,
    rotating_weights,
    tile_sweep,
)

from gpu_kernels import qtypes as qt


@triton.jit
def _probe(qs_p, x_p, y_p, K2, BN: tl.constexpr, SB: tl.constexpr, MODE: tl.constexpr):
    """MODE 0: sum of bytes; 1: nibbles times x (x's dtype as stored)."""
    n = tl.program_id(0) * BN + tl.arange(0, BN)  # [BN]
    c = tl.arange(0, SB)[None, :]  # [1, SB]
    row = qs_p + n.to(tl.int64)[:, None] * K2
    if MODE == 0:
        acc = tl.zeros((BN, SB), dtype=tl.int32)
    else:
        acc = tl.zeros((BN, SB), dtype=tl.float32)
    for k0 in range(0, K2, SB):
        b = tl.load(row + k0 + c, mask=k0 + c < K2, other=0).to(tl.int32)  # [BN, SB]
        if MODE == 0:
            acc += b
        else:
            byte = k0 + c
            col = (byte // 32) * 64 + byte % 32  # the low nibble's column
            xl = tl.load(x_p + col, mask=byte < K2, other=0.0).to(tl.float32)
            xh = tl.load(x_p + col + 32, mask=byte < K2, other=0.0).to(tl.float32)
            acc += (b & 15).to(tl.float32) * xl + (b >> 4).to(tl.float32) * xh
    tl.store(y_p + n, tl.sum(acc, axis=1).to(tl.float32))


SHAPES = [("v3 o_proj", 7168, 16384), ("v3 q_b", 24576, 1536), ("v3 q_a+kv_a", 2112, 7168),
          ("v3 dense gate_up", 36864, 7168)]
TILES = [(1, 512, 1), (2, 512, 1), (2, 1024, 1), (4, 512, 2), (4, 1024, 4), (8, 512, 4),
         (2, 2048, 2), (4, 2048, 4), (8, 1024, 8), (16, 512, 8)]


def probe(ws: list, mode: str, tiles: tuple[int, int, int]) -> float:
    """GB/s of the whole matrix's bytes (all planes, as qmatmul reads) for one probe."""
    bn, sb, warps = tiles
    one = ws[0]
    k2 = one.cols // 2
    x = torch.randn(one.cols, device="cuda", dtype=torch.float16 if mode == "x16" else
                    torch.float32)
    y = torch.empty(one.rows, device="cuda")
    i = [0]

    def call():
        i[0] = (i[0] + 1) % len(ws)
        _probe[(one.rows // bn,)](ws[i[0]].planes[0], x, y, k2, BN=bn, SB=sb,
                                  MODE=0 if mode == "read" else 1, num_warps=warps)
    return one.planes[0].numel() / graph_ms(call) / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    copy = report_copy_bandwidth()
    rows = []
    for name, n, k in SHAPES:
        ws = rotating_weights(qt.Q4_K, n, k)
        full_gbs = bench_product(ws, 1)["GB_s"]
        rows.append({"shape": name, "probe": "full", "GB_s": full_gbs})
        print(f"{name:17} full (qmatmul): {full_gbs:.0f} GB/s", flush=True)
        for mode in ("read", "x32", "x16"):
            tile_sweep(f"{name:17} {mode:4}", TILES, partial(probe, ws, mode),
                       rows, shape=name, probe=mode)
    if args.json:
        Path(args.json).write_text(json.dumps({"copy_GB_s": copy, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
