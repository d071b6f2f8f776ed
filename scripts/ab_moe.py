"""A/B versions of the fast MoE kernels in one process, on the same packed experts.

The GPU machine's hosts differ from call to call (read bandwidth 86-140 GB/s), so a change is
judged only against the old code timed in the same process, call after call. `new` is
cpu_kernels itself; any other version NAME is a copy of cpu_kernels/ under the package name
cpu_kernels_NAME (on PYTHONPATH), e.g. made from a git revision:

    python scripts/ab_moe.py --make-base HEAD~1          # writes .ab/cpu_kernels_base
    PYTHONPATH=.ab python scripts/ab_moe.py --threads 16 --tokens 32,128,512,1024

Each row: the median of `--repeats` calls per version, the versions alternating call by call,
all through the AMX kernel entry (amx_bf16_moe_kernel, MIN_TOKENS of each version) where the
CPU has AMX, else the VNNI one; each version's time over the first's, and whether its output is
bit-identical to the first's (else the largest relative difference). The packed layout must be
the same in all versions.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import os
import subprocess
import time

import numba
import numpy as np
from bench_cpu_moe import SHAPES, routings

from cpu_kernels.fast.packed import pack
from cpu_kernels.formats.random_blocks import random_experts

BASE_DIR = ".ab"


def make_base(rev: str) -> None:
    """.ab/cpu_kernels_base: cpu_kernels/ at `rev`, its imports renamed."""
    dest = os.path.join(BASE_DIR, "cpu_kernels_base")
    subprocess.run(["rm", "-rf", dest], check=True)
    os.makedirs(dest)
    files = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "cpu_kernels/"],
                           check=True, capture_output=True, text=True).stdout.split()
    for path in files:
        text = subprocess.run(["git", "show", f"{rev}:{path}"], check=True, capture_output=True,
                              text=True).stdout
        out = os.path.join(dest, os.path.relpath(path, "cpu_kernels"))
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w") as f:
            f.write(text.replace("cpu_kernels", "cpu_kernels_base"))
    print(f"{dest}: cpu_kernels at {rev} ({len(files)} files)")


def _module(pkg: str, nested: str, flat: str):
    """A kernel module of `pkg` by its name in folders, or in the flat layout of older trees."""
    try:
        return importlib.import_module(f"{pkg}.{nested}")
    except ModuleNotFoundError:
        return importlib.import_module(f"{pkg}.{flat}")


def kernel_call(pkg: str, packed, threads: int):
    """call(x, ids, weights, out) through package `pkg`'s fast MoE kernel."""
    amx = _module(pkg, "amx.amx_bf16_moe", "amx_bf16_moe")
    vnni = _module(pkg, "fast.packed_moe", "packed_moe")
    has_amx = _module(pkg, "simd.amx", "amx").HAS_AMX
    stamps = np.empty(2, np.int64)
    pk = packed
    # trees with the clamped SwiGLU take its limit after the weights (inf: plain SwiGLU)
    limit = (math.inf,) if importlib.util.find_spec(f"{pkg}.exact.swiglu") else ()

    def call(x, ids, weights, out):
        args = (pk.gate.qtype, pk.gate.data, pk.up.qtype, pk.up.data, pk.down.qtype,
                pk.down.data, x, ids, weights, *limit, out, stamps)
        if has_amx and hasattr(vnni, "TileSet"):  # the tile set first
            amx.amx_bf16_moe_kernel(vnni.tile_family(*args[0:6:2]), *args, amx.TILE_CONFIG_BF16,
                                    amx.MIN_TOKENS, threads)
        elif has_amx:
            amx.amx_bf16_moe_kernel(*args, amx.TILE_CONFIG_BF16, amx.MIN_TOKENS, threads)
        elif hasattr(vnni, "packed_moe"):  # the Python entry that picks the tile family
            vnni.packed_moe(*args, threads)
        elif hasattr(vnni, "tile_family"):  # the i-quants' first tiles: the family first
            vnni.packed_moe_kernel(vnni.tile_family(*args[0:6:2]), *args, threads)
        else:
            vnni.packed_moe_kernel(*args, threads)
    return call


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--make-base", metavar="REV", help="write .ab/cpu_kernels_base from REV")
    p.add_argument("--shape", default="v3", choices=list(SHAPES))
    p.add_argument("--resident", type=int, default=64)
    p.add_argument("--tokens", default="32,128,512")
    p.add_argument("--threads", type=int, default=numba.config.NUMBA_NUM_THREADS)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--versions", default="base,new", help="first one is the reference")
    args = p.parse_args()
    if args.make_base:
        make_base(args.make_base)
        return
    numba.set_num_threads(args.threads)
    hidden, inter, num_experts, top_k, gu_type, down_type = SHAPES[args.shape]
    resident = min(args.resident, num_experts)
    rng = np.random.default_rng(0)
    t = time.perf_counter()
    packed = pack(random_experts(rng, resident, hidden, inter, gu_type, gu_type,
                                 down_type)).packed
    print(f"{args.shape}: {resident} experts made and packed in {time.perf_counter() - t:.0f} s",
          flush=True)
    names = args.versions.split(",")
    calls = {k: kernel_call("cpu_kernels" if k == "new" else f"cpu_kernels_{k}", packed,
                            args.threads) for k in names}
    print(f"{'T':>5s} " + " ".join(f"{k + ' ms':>12s}" for k in names) + "  each / "
          f"{names[0]}, outputs", flush=True)
    for num_tokens in [int(v) for v in args.tokens.split(",")]:
        x = (rng.standard_normal((num_tokens, hidden)) * 0.5).astype(np.float32)
        routes = routings(rng, num_tokens, resident, top_k, args.repeats + 1)
        weights = rng.random(routes[0].shape).astype(np.float32)
        outs = {k: np.empty_like(x) for k in calls}
        for k, call in calls.items():  # warm-up (compiles on first use)
            for ids in routes[:2]:
                call(x, ids, weights, outs[k])
        times = {k: [] for k in calls}
        for ids in routes[1:]:
            for k, call in calls.items():
                t = time.perf_counter()
                call(x, ids, weights, outs[k])
                times[k].append(time.perf_counter() - t)
        ms = {k: float(np.median(times[k])) * 1e3 for k in names}
        ref = outs[names[0]]
        notes = []
        for k in names[1:]:
            same = np.array_equal(outs[k], ref)
            rel = np.abs(outs[k] - ref).max() / np.abs(ref).max()
            notes.append(f"{k} {ms[k] / ms[names[0]]:.3f} "
                         + ("same" if same else f"rel diff {rel:.1e}"))
        print(f"{num_tokens:5d} " + " ".join(f"{ms[k]:12.2f}" for k in names) + "  "
              + ", ".join(notes), flush=True)


if __name__ == "__main__":
    main()
