"""Q4_K (or Q6_K) decode products on integer activations against qmatmul's fp32 ones (GPU
machine).

    python scripts/probe_int_products.py [--qtype Q6_K] [--tokens 1,8] [--json out.json]

For V3's and V2-Lite's products at 1 and 8 tokens: qmatmul (fp32 x) with its default tiles,
then qdot_i8.qmatmul_i8 on x quantized to int16 (dp2a) and int8 (dp4a) over a tile sweep
(rows per program, 64-chunks per K step, warps); GB/s of the weights' bytes, timed as
bench_gpu_kernels.py (CUDA graphs over rotating copies larger than L2). quantize_x is timed
apart (it runs once per input, shared by the products that read it). Q6_K's kernel is
qdot_i8_q6k.py (its tiles: halves of 128 columns per K step), over its shapes: the heads and
the ffn_down / kv_b of Q4_K_M's "more bits" layers.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_gpu_kernels as bench

from gpu_kernels import qtypes as qt
from gpu_kernels.qdot_i8 import qmatmul_i8, quantize_x
from gpu_kernels.qdot_i8_q6k import qmatmul_i8_q6k

SHAPES = [("v3 o_proj", 7168, 16384), ("v3 q_b", 24576, 1536), ("v3 q_a+kv_a", 2112, 7168),
          ("v3 shexp gate_up", 4096, 7168), ("v2l q_proj", 3072, 2048),
          ("v2l shexp gate_up", 5632, 2048)]
Q6K_SHAPES = [("v2l head", 102400, 2048), ("v2l shexp down", 2048, 2816),
              ("v3 shexp down", 7168, 2048),
              ("v2l kv_b", 4096, 512), ("v3 dense down", 7168, 18432)]
TILES = [(4, 4, 1), (4, 8, 1), (8, 4, 1), (2, 8, 1), (8, 8, 2), (16, 4, 2), (4, 16, 2),
         (8, 8, 4), (16, 8, 4), (1, 16, 1), (2, 4, 1), (4, 2, 1)]


def bench_i8(ws: list, m: int, bits: int, tiles: tuple[int, int, int]) -> float:
    one = ws[0]
    xq = quantize_x(torch.randn(m, one.cols, device="cuda"), bits)
    out = torch.empty(m, one.rows, device="cuda")
    product = qmatmul_i8_q6k if one.qtype == qt.Q6_K else qmatmul_i8
    i = [0]

    def call():
        i[0] = (i[0] + 1) % len(ws)
        product(xq, ws[i[0]], out=out, tiles=tiles)
    return one.nbytes / bench.graph_ms(call) / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--tokens", default="1,8")
    ap.add_argument("--qtype", default="Q4_K", choices=["Q4_K", "Q6_K"])
    args = ap.parse_args()
    qtype = qt.Q6_K if args.qtype == "Q6_K" else qt.Q4_K
    copy = bench.report_copy_bandwidth()
    rows = []
    for name, n, k in Q6K_SHAPES if qtype == qt.Q6_K else SHAPES:
        ws = bench.rotating_weights(qtype, n, k)
        for m in (int(t) for t in args.tokens.split(",")):
            fp32 = bench.bench_product(ws, m)["GB_s"]
            x = torch.randn(m, k, device="cuda")
            q_us = 1e3 * bench.graph_ms(lambda x=x: quantize_x(x, 16))
            rows.append({"shape": name, "m": m, "kind": "fp32", "GB_s": fp32, "quant_us": q_us})
            print(f"{name:18} m={m} fp32 {fp32:.0f} GB/s  quantize_x {q_us:.1f} us", flush=True)
            for bits in (16, 8):
                bench.tile_sweep(f"{name:18} m={m} x{bits:<2}", TILES,
                           partial(bench_i8, ws, m, bits), rows,
                           shape=name, m=m, kind=f"x{bits}")
    if args.json:
        Path(args.json).write_text(json.dumps({"copy_GB_s": copy, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
