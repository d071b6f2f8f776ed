"""Does a long prompt's work on a green context (a CUDA context holding only part of the SMs)
leave a decode step's small kernels their speed?

A decode step beside a prompt's layers (docs/long-prompts.md, mixed traffic) cost ~10 ms more
per layer of the prompt. One explanation: its ~260 small kernels each wait for an SM behind the
prompt's long blocks, since stream priority does not preempt running blocks. What the probe
found is in docs/long-prompts.md ("The copy engine"). This times, on a high-priority
stream, a chain of small kernels shaped like a decode step's (GEMVs and element-wise ops, then
a host sync):
- alone;
- beside a loop of the prompt's kernels (cuBLAS fp16 GEMMs of a layer's shapes at 8192 tokens
  and our prefill attention kernel) on a low-priority stream of the same context;
- beside the same loop on the stream of a green context of all SMs but `--spare` SMs, for each
  `--spare`;
and compares the loop's results on the green context against the same work on the primary one
(Triton's kernels and cuBLAS must run there at all).

    python scripts/probe_green_context.py [--spare 8,16,32] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_kernels.mla_prefill_expanded import mla_prefill_expanded

TOKENS, HIDDEN, HEADS = 8192, 2048, 16


def prompt_operands(dev):
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(TOKENS, HIDDEN, device=dev, generator=g).half()
    w = [torch.randn(n, HIDDEN, device=dev, generator=g).half() * 0.02
         for n in (3072, 2 * 1408 * 8, 4096)]
    q = torch.randn(TOKENS, HEADS, 192, device=dev, generator=g) * 0.1
    kv = (torch.randn(TOKENS, HEADS, 256, device=dev, generator=g) * 0.3).half()
    kr = torch.randn(TOKENS, 64, device=dev, generator=g).half()
    meta = torch.tensor([[0, TOKENS, TOKENS, 0]], device=dev)
    return x, w, q, kv, kr, meta


def prompt_layer(ops) -> torch.Tensor:
    """One prompt layer's heavy kernels: three GEMMs and the attention -> a checksum tensor."""
    x, w, q, kv, kr, meta = ops
    ys = [x @ wi.t() for wi in w]
    o = torch.empty(TOKENS, HEADS, 128, device=x.device)
    mla_prefill_expanded(q, kv[..., :128], kr, kv[..., 128:], meta, 0.07, TOKENS, o)
    return torch.stack([y.float().sum() for y in ys] + [o.sum()])


def decode_step(dev, ws, v) -> float:
    """~260 small kernels (26 layers x 10: GEMVs and element-wise ops), then a sync -> ms."""
    t0 = time.perf_counter()
    h = v
    for _ in range(26):
        for w in ws:
            h = torch.tanh(w @ h) * 0.5 + h
    torch.cuda.current_stream(dev).synchronize()
    return 1e3 * (time.perf_counter() - t0)


def time_decode(dev, stream, ws, v, n=40) -> float:
    with torch.cuda.stream(stream):
        times = [decode_step(dev, ws, v) for _ in range(n)]
    return statistics.median(times[5:])


def beside(dev, decode_stream, ws, v, run_load) -> float:
    """The decode chain's median ms while `run_load(stop)` keeps the prompt's loop busy on
    another thread."""
    stop = threading.Event()
    t = threading.Thread(target=run_load, args=(stop,))
    t.start()
    time.sleep(0.3)  # the loop is queued deep by now
    try:
        return time_decode(dev, decode_stream, ws, v)
    finally:
        stop.set()
        t.join()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spare", default="8,16,32")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda", torch.cuda.current_device())
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    decode_stream = torch.cuda.Stream(dev, priority=-1)
    ws = [torch.randn(2048, 2048, device=dev).half() * 0.02 for _ in range(4)]
    v = torch.randn(2048, 1, device=dev).half()
    ops = prompt_operands(dev)
    want = prompt_layer(ops)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        prompt_layer(ops)
    torch.cuda.synchronize()
    layer_ms = 1e3 * (time.perf_counter() - t0) / 5
    rows = {"sms": sms, "torch": torch.__version__, "prompt_layer_ms": layer_ms,
            "decode_alone_ms": time_decode(dev, decode_stream, ws, v)}

    low = torch.cuda.Stream(dev, priority=0)

    def load_on(stream, setup=None, teardown=None):
        def run(stop):
            torch.cuda.set_device(dev)
            if setup is not None:
                setup()
            try:
                with torch.cuda.stream(stream):
                    while not stop.is_set():
                        prompt_layer(ops)
                        stream.synchronize()  # a few layers queued, as the job keeps
            finally:
                if teardown is not None:
                    teardown()
        return run

    rows["decode_beside_same_context_ms"] = beside(dev, decode_stream, ws, v, load_on(low))
    green_rows = {}
    for spare in (int(s) for s in args.spare.split(",") if s):
        row = {}
        try:
            from torch.cuda.green_contexts import GreenContext

            ctx = GreenContext.create(num_sms=sms - spare, device_id=dev.index or 0)
            gstream = ctx.Stream()
            got = {}

            def check(ctx=ctx, gstream=gstream, got=got):
                with torch.cuda.stream(gstream):
                    got["sum"] = prompt_layer(ops)
                    t1 = time.perf_counter()
                    for _ in range(5):
                        prompt_layer(ops)
                    gstream.synchronize()
                    got["ms"] = 1e3 * (time.perf_counter() - t1) / 5

            for label, setup, teardown in (("no set_context", None, None),
                                           ("set_context", ctx.set_context, ctx.pop_context)):
                try:
                    th = threading.Thread(target=lambda s=setup, t=teardown: (
                        torch.cuda.set_device(dev), s and s(), check(), t and t()))
                    th.start()
                    th.join()
                    torch.cuda.synchronize()
                    diff = ((got["sum"] - want).abs().max() / want.abs().max()).item()
                    row[label] = {"rel_diff": diff, "prompt_layer_ms": got["ms"]}
                    row[label]["decode_beside_ms"] = beside(
                        dev, decode_stream, ws, v, load_on(gstream, setup, teardown))
                except Exception as e:  # noqa: BLE001 - a probe: report and go on
                    row[label] = {"error": f"{type(e).__name__}: {e}"[:300]}
                    torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        green_rows[spare] = row
    rows["green"] = green_rows
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(json.dumps(rows, indent=1))
    print(f"| case | decode chain ms | prompt layer ms |\n|---|---|---|\n"
          f"| alone | {rows['decode_alone_ms']:.2f} | {layer_ms:.2f} |\n"
          f"| beside, same context | {rows['decode_beside_same_context_ms']:.2f} | |")
    for spare, row in green_rows.items():
        for label, r in row.items():
            if isinstance(r, dict) and "decode_beside_ms" in r:
                print(f"| beside, green ctx {sms - spare} SMs, {label} (rel. diff {r['rel_diff']:.1e}) | "
                      f"{r['decode_beside_ms']:.2f} | {r['prompt_layer_ms']:.2f} |")
            else:
                print(f"| green ctx {sms - spare} SMs, {label} | {r} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
