"""Where streamed experts are copied from (issue 16 item 3): host-to-device GB/s from a file's
memory map (the GGUF's experts as the CPU kernels read them), three ways, in one run:

    pageable    copy_ from the map as it is (the driver stages through its own pinned buffers)
    registered  the map's pages registered with cudaHostRegister (hybrid/engine/prefill/host_pinning.py)
                and copied directly by the copy engine; registration time reported too
    ring        a pinned ring of RING_SLOTS buffers of RING_MB each: host threads copy the map
                into a free slot, the copy engine takes it from there (a second copy in RAM of
                only the ring's size)

    python scripts/probe_pinned_source.py [--gb 4] [--threads 1,4,8]

The file is written under /tmp and read once before timing (the page cache holds it, as it
holds a served GGUF). Prints one row per way; --json writes them.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hybrid.engine.prefill.host_pinning import HostRegistration

RING_SLOTS, RING_MB = 4, 64
REPEATS = 3


def timed(fn) -> float:
    """Best of REPEATS, seconds (after one untimed run)."""
    fn()
    best = float("inf")
    for _ in range(REPEATS):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best


def ring_copy(src: np.ndarray, dev: torch.Tensor, threads: int) -> None:
    slot_bytes = RING_MB << 20
    slots = ring_copy.slots  # pinned [RING_SLOTS, slot_bytes]
    events = [torch.cuda.Event() for _ in range(RING_SLOTS)]
    stream = torch.cuda.current_stream()
    chunks = range(0, src.size, slot_bytes)
    with ThreadPoolExecutor(threads) as pool:
        for i, at in enumerate(chunks):
            s = i % RING_SLOTS
            events[s].synchronize()  # the copy engine is done with this slot
            n = min(slot_bytes, src.size - at)
            dst, part = slots[s].numpy()[:n], -(-n // threads)
            pieces = [(dst[j:j + part], src[at + j:at + min(j + part, n)])
                      for j in range(0, n, part)]
            list(pool.map(lambda p: np.copyto(*p), pieces))
            dev[at:at + n].copy_(slots[s][:n], non_blocking=True)
            events[s].record(stream)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=4.0)
    ap.add_argument("--threads", default="1,4,8")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    nbytes = int(args.gb * 1e9) // 4096 * 4096
    path = Path(tempfile.mkdtemp()) / "experts.bin"
    with open(path, "wb") as f:
        block = np.random.default_rng(0).integers(0, 256, 64 << 20, np.uint8).tobytes()
        f.writelines(block[:min(len(block), nbytes - at)] for at in range(0, nbytes, len(block)))
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    int(mm[::4096].sum())  # into the page cache
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the map is read-only; nothing writes
        src = torch.from_numpy(np.asarray(mm))
    rows = [{"way": "pageable", "s": timed(lambda: dev.copy_(src, non_blocking=True))}]
    t = time.perf_counter()
    reg = HostRegistration([mm])
    reg_s = time.perf_counter() - t
    if reg.ok:
        rows.append({"way": "registered", "s": timed(lambda: dev.copy_(src, non_blocking=True)),
                     "register_s": reg_s})
    reg.release()
    ring_copy.slots = torch.empty(RING_SLOTS, RING_MB << 20, dtype=torch.uint8, pin_memory=True)
    for threads in (int(t) for t in args.threads.split(",")):
        rows.append({"way": f"ring, {threads} threads",
                     "s": timed(lambda threads=threads: ring_copy(mm, dev, threads))})
    ok = bool(torch.equal(dev[:1 << 20].cpu(), torch.from_numpy(np.array(mm[:1 << 20]))))
    for r in rows:
        r["GB_s"] = nbytes / r["s"] / 1e9
    print(f"{nbytes / 1e9:.2f} GB from a memory-mapped file to the GPU (bytes arrive intact: {ok})")
    print("| way | GB/s | ms | registration s |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['way']} | {r['GB_s']:.1f} | {r['s'] * 1e3:.0f} | "
              f"{r.get('register_s', ''):{'.2f' if 'register_s' in r else ''}} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    path.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
