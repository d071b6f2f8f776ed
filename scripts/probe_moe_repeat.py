"""Whether the CPU experts give the same bits for the same input, call after call, on every
thread count and token count a server step meets (a race between threads would show as a
rare difference), and how far fast mode (AMX or VNNI) lies from the float64 reference.

    python scripts/probe_moe_repeat.py [--repeats 12] [--threads 15]

V2-Lite's expert shapes by default (64 experts of 2048 x 1408, top 6; Q4_K gate/up, Q8_0
down, as `make-model --preset v2-lite --quant q4_k_m` writes them). Prints a line per token
count and exits 1 if any repeat differed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cpu_kernels.formats import qtypes as qt
from cpu_kernels.formats.random_blocks import random_experts
from cpu_kernels.formats.reference import moe_forward_ref, rel_error
from cpu_kernels.moe import moe_forward

TOKENS = (1, 2, 3, 4, 8, 12, 16, 20, 33, 64, 100, 257, 512, 1024)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--threads", type=int, default=0, help="0: numba's default")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=1408)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=6)
    args = ap.parse_args()
    if args.threads:
        numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    experts = random_experts(rng, args.experts, args.hidden, args.inter, qt.Q4_K, qt.Q4_K,
                             qt.Q8_0)
    differed = 0
    for n in TOKENS:
        x = (rng.standard_normal((n, args.hidden)) * 0.5).astype(np.float32)
        # skewed routing (a few hot experts), as trained routers give
        p = rng.dirichlet(np.full(args.experts, 0.3))
        ids = np.stack([rng.choice(args.experts, args.top_k, replace=False, p=p)
                        for _ in range(n)]).astype(np.int64)
        w = rng.random(ids.shape).astype(np.float32)
        ref = moe_forward_ref(x, ids, w, experts)
        for use_amx in (True, False):
            outs = []
            t0 = time.perf_counter()
            for _ in range(args.repeats):
                out = np.full_like(x, np.nan)
                moe_forward(x, ids, w, experts, out, mode="fast", use_amx=use_amx)
                outs.append(out)
            ms = (time.perf_counter() - t0) / args.repeats * 1e3
            bad = sum(not np.array_equal(o, outs[0]) for o in outs[1:])
            differed += bad
            errs = [rel_error(o, ref) for o in outs]
            print(f"T={n:5} {'amx ' if use_amx else 'vnni'}: {bad} of {args.repeats - 1} "
                  f"repeats differ; rel error vs float64 max {max(errs):.2e}; {ms:.1f} ms a call",
                  flush=True)
    print(f"threads {numba.get_num_threads()}: {differed} differing repeats")
    return 1 if differed else 0


if __name__ == "__main__":
    sys.exit(main())
