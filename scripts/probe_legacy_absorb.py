"""The legacy kv_b's key-half absorption at decode (qmatmul_t on Q4_K and Q6_K rows), the
codes-as-they-lie kernels (qmatmul_t_kquant.py, the default) against qmatmul_t's gathered-tile
body, GPU us per call inside a CUDA graph, weights rotated past the L2 cache (GPU machine).

    python scripts/probe_legacy_absorb.py [--sweep] [--json out.json]

Rows: V3's 128 heads and V2-Lite's 16 (128 key rows, 128 value rows a head, 512 columns),
1-8 tokens, both types. --sweep times qmatmul_t_kquant's tiles at one token.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_gpu_kernels import graph_ms, rotating_weights

from gpu_kernels import qtypes as qt
from gpu_kernels.qmatmul import gathered_tiles, qmatmul_t, qmatmul_t_ref

NOPE, V, C = 128, 128, 512
SWEEP = [(32, 1, 4), (16, 1, 4), (8, 1, 4), (64, 1, 4), (32, 2, 4), (16, 2, 2), (32, 1, 2),
         (8, 1, 1), (16, 1, 1), (128, 1, 8), (32, 4, 8)]


def time_absorb(ws: list, heads: int, m: int, tiles=None, fast: bool = True) -> float:
    """us per call; fast: the default path (or qmatmul_t_kquant's `tiles`), else the gathered
    body with its decode tiles."""
    from gpu_kernels.qmatmul_t_kquant import qmatmul_t_kquant

    x = torch.randn(m, heads, NOPE, device="cuda")
    y = torch.empty(m, heads, C, device="cuda")
    i = [0]

    def call():
        i[0] = (i[0] + 1) % len(ws)
        if fast and tiles is not None:
            qmatmul_t_kquant(x, ws[i[0]], NOPE, 0, NOPE + V, y, tiles=tiles)
        else:
            qmatmul_t(x, ws[i[0]], in_rows=NOPE, gstride=NOPE + V, out=y,
                      tiles=None if fast else gathered_tiles(ws[0], heads, NOPE, m))
    return graph_ms(call) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    print("| type | heads | tokens | gathered tiles, us | codes as they lie, us | speed-up | "
          "rel err |")
    print("|---|---|---|---|---|---|---|")
    for qtype, heads in ((q, h) for q in (qt.Q4_K, qt.Q6_K) for h in (128, 16)):
        ws = rotating_weights(qtype, heads * (NOPE + V), C)
        for m in (1, 2, 4, 8):
            old = time_absorb(ws, heads, m, fast=False)
            new = time_absorb(ws, heads, m)
            x = torch.randn(m, heads, NOPE, device="cuda")
            ref = qmatmul_t_ref(x, ws[0], NOPE, 0, NOPE + V)
            got = qmatmul_t(x, ws[0], in_rows=NOPE, gstride=NOPE + V)
            err = ((got - ref).norm() / ref.norm()).item()
            rows.append({"type": qt.name(qtype), "heads": heads, "tokens": m,
                         "gathered_us": old, "kquant_us": new, "rel_err": err})
            print(f"| {qt.name(qtype)} | {heads} | {m} | {old:.2f} | {new:.2f} | "
                  f"{old / new:.2f}x | {err:.1e} |", flush=True)
        if args.sweep:
            line = []
            for t in SWEEP:
                us = time_absorb(ws, heads, 1, tiles=t)
                rows.append({"type": qt.name(qtype), "heads": heads, "tokens": 1, "tiles": t,
                             "kquant_us": us})
                line.append(f"{t}: {us:.2f}")
            print(f"sweep, {qt.name(qtype)}, {heads} heads, 1 token, us: " + "  ".join(line),
                  flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
