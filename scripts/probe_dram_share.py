"""Do the GPU's reads of host memory over PCIe add to what the CPU's cores read, or share it?
(GPU machine.) The question behind splitting a decode step's routed experts between the CPU
kernels and the GPU reading the other experts' pinned bytes.

    python scripts/probe_dram_share.py [--gib 4] [--threads 16] [--seconds 3]

Rows, GB/s of each side, alone and at once:
- cpu: numba's threads summing a float32 buffer (cpu_kernels.runtime.bandwidth's sum);
- copy: the copy engine moving a pinned buffer to the device (cudaMemcpyAsync);
- zero-copy: a Triton kernel summing the pinned buffer in place (mapped host memory read by the
  SMs over PCIe: what a kernel reading experts' bytes where they lie would do).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numba
import numpy as np
import torch
import triton
import triton.language as tl

from cpu_kernels.runtime.bandwidth import sum_chunks


@triton.jit
def _sum_kernel(src, out, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for i in range(ITERS):
        offs = (pid * ITERS + i).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(src + offs, mask=offs < n, other=0, volatile=True)
    tl.atomic_add(out, tl.sum(acc))


class Side:
    """One reader run in a loop on its own thread until stopped: bytes read and seconds."""

    def __init__(self, name: str, once) -> None:
        self.name, self.once, self.bytes, self.seconds = name, once, 0, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        t = time.perf_counter()
        while not self._stop.is_set():
            self.bytes += self.once()
        self.seconds = time.perf_counter() - t

    def start(self) -> Side:
        self._thread.start()
        return self

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.bytes / self.seconds / 1e9


def readers(gib: float) -> dict:
    n = int(gib * (1 << 30))
    cpu_buf = np.ones((64, n // 256), np.float32)
    part = np.empty(64, np.float32)
    sum_chunks(cpu_buf, part)
    pinned = torch.ones(n // 4, dtype=torch.int32).pin_memory()
    dev = torch.empty(n // 4, dtype=torch.int32, device="cuda")
    out = torch.zeros(1, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    block, iters = 1024, 64
    grid = (triton.cdiv(pinned.numel(), block * iters),)

    def cpu() -> int:
        sum_chunks(cpu_buf, part)
        return cpu_buf.nbytes

    def copy() -> int:
        with torch.cuda.stream(stream):
            dev.copy_(pinned, non_blocking=True)
        stream.synchronize()
        return pinned.numel() * 4

    def zero_copy() -> int:
        with torch.cuda.stream(stream):
            _sum_kernel[grid](pinned, out, pinned.numel(), BLOCK=block, ITERS=iters,
                              num_warps=4)
        stream.synchronize()
        return pinned.numel() * 4

    for f in (copy, zero_copy):
        f()
    return {"cpu": cpu, "copy": copy, "zero-copy": zero_copy}


def run(sides: dict, names: tuple[str, ...], seconds: float) -> dict:
    running = [Side(n, sides[n]).start() for n in names]
    time.sleep(seconds)
    return {s.name: s.stop() for s in running}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.threads:
        numba.set_num_threads(args.threads)
    sides = readers(args.gib)
    rows = []
    for names in (("cpu",), ("copy",), ("zero-copy",), ("cpu", "copy"), ("cpu", "zero-copy"),
                  ("cpu",), ("cpu", "copy")):
        got = run(sides, names, args.seconds)
        rows.append({"together": list(names), **got, "sum": sum(got.values())})
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print("\n| run | cpu GB/s | copy GB/s | zero-copy GB/s | sum |\n|---|---|---|---|---|")
    for r in rows:
        cells = [f"{r[k]:.1f}" if k in r else "" for k in ("cpu", "copy", "zero-copy")]
        print(f"| {' + '.join(r['together'])} | {' | '.join(cells)} | {r['sum']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
