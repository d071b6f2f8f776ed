"""Does work on the model's stream wait for the expert stream's host-to-device copies?

Issue 16's inter-token latency: the first step of each layered prompt chunk showed 15-17 ms of
GPU time on the model stream between two events with nothing queued between them but
ExpertStream.begin (two ~300 MB copies queued on its own copy stream). This queues the same
copies from page-locked host memory on a side stream and times, on the "model" stream:
- `empty`: two events with nothing between them;
- `matmul`: a 4096^3 fp32 matmul (a few ms) between them;
- `small_h2d`: a 4 KiB copy from pageable memory between them (as ForwardBatch.build does);
- `small_h2d_pinned`: the same from pinned memory;
each with the model stream being the default (legacy) stream and a stream of its own.

    python scripts/probe_stream_overlap.py [--mb 300] [--source anon|file] [--json out.json]

`--source file` copies from a read-only file map (the GGUF's, or the packed cache's).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hybrid.engine.prefill.expert_stream import _host_tensor
from hybrid.engine.prefill.host_pinning import HostRegistration


def timed(model: torch.cuda.Stream, copy: torch.cuda.Stream, host: np.ndarray,
          slot: torch.Tensor, what: str, copies: int) -> dict:
    a = torch.randn(4096, 4096, device=slot.device)
    small = torch.zeros(512, dtype=torch.int64)
    small_pinned = small.pin_memory()
    torch.cuda.synchronize()
    start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    copied = torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(model):
        start.record()
        freed = torch.cuda.Event()
        freed.record()
        with torch.cuda.stream(copy):
            copy.wait_event(freed)  # as ExpertStream._copy: the slot's last reader done
            for _ in range(copies):
                slot.copy_(_host_tensor(host), non_blocking=True)
            copied.record()
        mid.record()
        if what == "matmul":
            a @ a
        elif what == "small_h2d":
            small.to(slot.device)
        elif what == "small_h2d_pinned":
            small_pinned.to(slot.device, non_blocking=True)
        end.record()
    torch.cuda.synchronize()
    return {"case": what, "model_ms": round(mid.elapsed_time(end), 3),
            "copies_ms": round(start.elapsed_time(copied), 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=300)
    ap.add_argument("--copies", type=int, default=2)
    ap.add_argument("--source", choices=["anon", "file"], default="anon")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.source == "file":  # the GGUF's (or the packed cache's) read-only file map
        path = Path(tempfile.mkdtemp()) / "experts.bin"
        np.ones(args.mb << 20, np.uint8).tofile(path)
        buf = np.memmap(path, np.uint8, mode="r")
    else:
        buf = np.ones(args.mb << 20, np.uint8)
    registration = HostRegistration([buf])
    host = buf  # a numpy array, made a tensor per copy as ExpertStream does
    slot = torch.empty(args.mb << 20, dtype=torch.uint8, device="cuda")
    copy = torch.cuda.Stream()
    rows = []
    for name, model in (("default stream", torch.cuda.default_stream()),
                        ("own stream", torch.cuda.Stream())):
        for what in ("empty", "matmul", "small_h2d", "small_h2d_pinned", "empty"):
            for _ in range(3):
                row = timed(model, copy, host, slot, what, args.copies)
            rows.append({"model_stream": name, "registered": registration.ok, **row})
    print(f"source {args.source}, page-locked: {registration.ok}")
    print("| model stream | between the events | model ms | copies ms |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['model_stream']} | {r['case']} | {r['model_ms']} | {r['copies_ms']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
