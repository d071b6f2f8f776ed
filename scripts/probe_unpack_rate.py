"""How fast fast mode's packed experts become the GPU kernels' planes on the device: one
V2-Lite layer's 64 experts (gate Q4_K 1408 x 2048, down Q8_0 2048 x 1408; random bytes, whose
values do not change the rate) through gpu_kernels/packed_unpack.py's kernel and through its
reference (packed_planes.planes_from_packed's torch ops), medians of `--repeats` timings of 20.

    python scripts/probe_unpack_rate.py [--experts 64] [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_kernels import qtypes as qt
from gpu_kernels.packed_planes import GEOMETRY, planes_from_packed
from gpu_kernels.packed_unpack import unpack

TENSORS = [("gate", qt.Q4_K, 1408, 2048), ("down", qt.Q8_0, 2048, 1408)]  # rows, cols


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    for name, qtype, r, c in TENSORS:
        block, size = GEOMETRY[qtype]
        data = torch.randint(0, 256, (a.experts, r // 8, c // block * size), dtype=torch.uint8,
                             device="cuda")
        for how, fn in (("kernel", unpack), ("reference", planes_from_packed)):
            for _ in range(3):  # compiled and warm
                fn(data, qtype, r, c)
            times = []
            for _ in range(a.repeats):
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(20):
                    fn(data, qtype, r, c)
                torch.cuda.synchronize()
                times.append((time.perf_counter() - t) / 20)
            dt = statistics.median(times)
            rows.append({"tensor": f"{name} {qt.name(qtype)}", "how": how, "ms": dt * 1e3,
                         "GB_s": data.numel() / dt / 1e9, "MB": data.numel() / 1e6})
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    print("| tensor | MB packed | kernel ms | GB/s | reference ms | GB/s |")
    print("|---|---|---|---|---|---|")
    for k, ref in zip(rows[::2], rows[1::2]):
        print(f"| {k['tensor']} | {k['MB']:.0f} | {k['ms']:.3f} | {k['GB_s']:.0f} "
              f"| {ref['ms']:.3f} | {ref['GB_s']:.0f} |")


if __name__ == "__main__":
    main()
