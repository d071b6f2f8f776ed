"""How long numba takes to start a parallel region on this machine, alone and beside other
threads: why the CPU experts' driver must not start its region while another thread runs Python.

    python scripts/probe_region_start.py [--threads 15,8] [--calls 300]

Each call of a parallel function stamps its entry, its serial part's end and every worker's
first instruction in the prange (the TSC, cpu_kernels.simd.clock), after 1 ms idle. Rows: alone
at each thread count; beside a Python thread spinning (it holds the GIL, which numba's gufunc
wrapper takes to start a region: numba/np/ufunc/parallel.py's build_gufunc_kernel); beside a
thread launching CUDA work (where there is a GPU). Medians in microseconds from the entry.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numba
import numpy as np
from numba import njit, prange

from cpu_kernels.simd.clock import cycles, cycles_per_us


@njit(parallel=True, nogil=True)
def region(starts: np.ndarray, threads: int) -> None:
    # starts: [threads + 2] int64: entry, the serial part's end, each worker's first stamp
    starts[0] = cycles()
    scratch = np.empty((6, 1408), np.float32)  # as the driver's serial part allocates
    starts[1] = cycles()
    for w in prange(threads):
        starts[2 + w] = cycles() + np.int64(scratch.shape[0]) * 0


def measure(threads: int, calls: int) -> dict[str, float]:
    numba.set_num_threads(threads)
    starts = np.zeros(threads + 2, np.int64)
    per_us = cycles_per_us()
    serial, first, last = [], [], []
    for _ in range(calls):
        time.sleep(0.001)
        region(starts, threads)
        serial.append((starts[1] - starts[0]) / per_us)
        first.append((starts[2:].min() - starts[0]) / per_us)
        last.append((starts[2:].max() - starts[0]) / per_us)
    return {"serial": statistics.median(serial), "first_worker": statistics.median(first),
            "last_worker": statistics.median(last),
            "last_worker_p90": sorted(last)[int(0.9 * calls)]}


def beside(work: Callable[[threading.Event], None], threads: int, calls: int) -> dict:
    stop = threading.Event()
    thread = threading.Thread(target=work, args=(stop,))
    thread.start()
    try:
        return measure(threads, calls)
    finally:
        stop.set()
        thread.join()


def python_spin(stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        n += 1


def cuda_launches(stop: threading.Event) -> None:
    import torch

    a = torch.zeros(1024, device="cuda")
    while not stop.is_set():
        for _ in range(50):
            a.add_(1)
        torch.cuda.synchronize()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default=None, help="default: numba's count")
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()
    counts = [int(t) for t in args.threads.split(",")] if args.threads else \
        [numba.config.NUMBA_NUM_THREADS]
    region(np.zeros(counts[0] + 2, np.int64), 1)  # compile
    rows = [(f"alone, {t} threads", measure(t, args.calls)) for t in counts]
    rows.append((f"beside a Python thread spinning, {counts[0]} threads",
                 beside(python_spin, counts[0], args.calls)))
    try:
        import torch

        if torch.cuda.is_available():
            rows.append((f"beside a thread launching CUDA work, {counts[0]} threads",
                         beside(cuda_launches, counts[0], args.calls)))
    except ImportError:
        pass
    print(f"numba {numba.__version__}, threading layer {numba.threading_layer()}; medians, us")
    print("| row | serial part | first worker | last worker | last worker p90 |\n"
          "|---|---|---|---|---|")
    for name, r in rows:
        print(f"| {name} | {r['serial']:.1f} | {r['first_worker']:.1f} | {r['last_worker']:.1f} "
              f"| {r['last_worker_p90']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
