"""Loading at scale: cold start (fast mode packs the experts and writes the packed cache), warm
start (maps the cache), and packing in memory every start, each in a fresh process.

    python scripts/bench_load.py --preset v3 --layers 6 --quant q4_k_m,ud-iq1_s \\
        [--optimize-rules DeepSeek-V3] [--models /tmp/models] [--json out.json]

Per start: seconds to build the model from the file (load_with_rules: reading, packing, and
the GPU's share; not the engine's kernel warm-up), GB/s of GGUF bytes, the process's peak RSS
(ru_maxrss), its RSS once loaded and once every expert byte the kernels read was paged in
(steady state: a mapped cache is lazy until read), beside the routed experts' GGUF bytes and the
rest's; that steady RSS split into the process's own memory (anonymous) and mapped file pages
(the packed cache, GGUF pages still held), and the RSS before loading (Python, torch, CUDA). `--drop-caches` empties the page cache before each start where
the process may (root), so "cold" includes the disk read. The last lines extrapolate the
packing time to a full 61-layer V3 (58 MoE layers) from the per-MoE-layer time measured.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STARTS = ("cold", "warm", "no-cache")


def child(path: str, rules: str, cache: bool) -> dict:
    import psutil
    import torch

    from hybrid.rules.load import load_with_rules

    base = psutil.Process().memory_info().rss
    # without a GPU the rule file's GPU placements land on the CPU, as GGUF blocks
    device_map = None if torch.cuda.is_available() else {"cuda": "cpu"}
    t = time.perf_counter()
    loaded = load_with_rules(path, rules, device_map, packed_cache=cache)
    seconds = time.perf_counter() - t
    gguf = loaded.gguf
    experts = sum(info.nbytes for name, (info, _) in gguf.tensor_infos.items() if "_exps." in name)
    rss = psutil.Process().memory_info().rss
    # steady state: what the kernels read, paged in (a memory-mapped cache is lazy until then)
    for arr in _expert_arrays(loaded.model):
        flat = arr.reshape(-1)
        int(flat[::4096].sum())
    return {"seconds": seconds, "gguf_bytes": gguf.total_bytes, "expert_bytes": experts,
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "rss": rss, "rss_touched": psutil.Process().memory_info().rss, "rss_base": base,
            **_rss_split()}


def _rss_split() -> dict:
    """Resident anonymous and file-backed bytes (Linux /proc/self/status; empty elsewhere)."""
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return {}
    kb = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in lines)
          if k in ("RssAnon", "RssFile")}
    return {"rss_anon": kb.get("RssAnon", 0), "rss_file": kb.get("RssFile", 0)}


def compile_packers() -> None:
    """Compile the pack kernels here, so no timed start pays numba's one-time compile (~10 s
    for the parallel packer; later processes load it from numba's cache)."""
    import numpy as np

    from cpu_kernels.fast.packed import PACKED_GEOMETRY, PackedMatrix
    from cpu_kernels.formats import qtypes as qt
    from cpu_kernels.formats.random_blocks import random_matrix

    rng = np.random.default_rng(0)
    for qtype in PACKED_GEOMETRY:
        PackedMatrix.of(random_matrix(rng, qtype, (1, 8, qt.BLOCK_GEOMETRY[qtype][0] * 8)))


def _expert_arrays(model) -> list:
    from hybrid.ops.experts import ExpertsOp

    out = []
    for op in model.modules():
        if isinstance(op, ExpertsOp) and op.backend == "cpu":
            w = op.cpu_weights
            parts = (w.packed.gate, w.packed.up, w.packed.down) if w.packed else (w.gate, w.up,
                                                                                   w.down)
            out += [p.data if w.packed else p.blocks for p in parts]
    return out


def _drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def run_start(path: str, rules: str, cache_dir: str, cache: bool, drop: bool) -> dict:
    dropped = _drop_caches() if drop else False
    env = dict(os.environ, HYBRID_PACKED_CACHE_DIR=cache_dir)
    proc = subprocess.run([sys.executable, __file__, "--child", path, "--optimize-rules", rules,
                           *([] if cache else ["--no-cache"])], env=env, capture_output=True,
                          text=True, check=True)
    for line in proc.stderr.splitlines():  # e.g. the cache's "disk is short: packing in memory"
        if "packed-expert cache" in line or "warning" in line.lower():
            print(f"  ({line.strip()})", flush=True)
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "page_cache_dropped": dropped}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--no-cache", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--preset", default="v3")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--quant", default="q4_k_m,ud-iq1_s")
    ap.add_argument("--optimize-rules", default="DeepSeek-V3",
                    help="rule file (its CPU experts run fast; GPU placements go to the CPU, "
                         "in their GGUF blocks, on a machine without one)")
    ap.add_argument("--models", default=None, help="folder for the synthetic models")
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the model files this run writes")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.optimize_rules, not args.no_cache)))
        return 0
    from hybrid.rules.planner import with_experts_mode
    from hybrid.synth.make_model import MakeModelOptions, make_model
    from hybrid.synth.presets import get_preset
    from hybrid.synth.vocab import get_vocab

    folder = Path(args.models or tempfile.mkdtemp())
    folder.mkdir(parents=True, exist_ok=True)
    rules = str(with_experts_mode(args.optimize_rules, "fast", folder))
    t = time.perf_counter()
    compile_packers()
    print(f"pack kernels compiled (once per machine, numba's cache): "
          f"{time.perf_counter() - t:.1f} s", flush=True)
    preset = get_preset(args.preset, args.layers)
    rows = []
    for quant in args.quant.split(","):
        path = folder / f"{preset.name}-{args.layers}-{quant}.gguf"
        made = not path.exists()
        if made:
            t = time.perf_counter()
            make_model(MakeModelOptions(preset, quant, "legacy", vocab="deepseek"),
                       get_vocab("deepseek", preset.vocab_size), path)
            print(f"make-model {path.name}: {time.perf_counter() - t:.0f} s", flush=True)
        with tempfile.TemporaryDirectory(dir=folder) as cache_dir:
            for start in STARTS:
                r = run_start(str(path), rules, cache_dir, start != "no-cache", args.drop_caches)
                r.update(quant=quant, start=start, gb_s=r["gguf_bytes"] / r["seconds"] / 1e9)
                rows.append(r)
                print(json.dumps(r), flush=True)
        if made and not args.keep:  # V3-sized files: the next quant's file and cache need the disk
            path.unlink()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    moe_layers = preset.num_layers - preset.first_k_dense
    print("\n| quant | start | s | GB/s | peak RSS GB | RSS loaded | RSS experts read "
          "(anon + file) | RSS before loading | experts GB | rest GB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['quant']} | {r['start']} | {r['seconds']:.1f} | {r['gb_s']:.2f} | "
              f"{r['peak_rss'] / 1e9:.2f} | {r['rss'] / 1e9:.2f} | {r['rss_touched'] / 1e9:.2f} "
              f"({r.get('rss_anon', 0) / 1e9:.2f} + {r.get('rss_file', 0) / 1e9:.2f}) | "
              f"{r['rss_base'] / 1e9:.2f} | {r['expert_bytes'] / 1e9:.2f} | "
              f"{(r['gguf_bytes'] - r['expert_bytes']) / 1e9:.2f} |")
    for quant in args.quant.split(","):
        by = {r["start"]: r for r in rows if r["quant"] == quant}
        extra = by["cold"]["seconds"] - by["warm"]["seconds"]
        per_layer = extra / moe_layers
        print(f"{quant}: packing and writing the cache took {extra:.1f} s beyond a warm start, "
              f"{by['cold']['expert_bytes'] / 1e9 / max(extra, 1e-3):.2f} GB/s of expert bytes; "
              f"~{per_layer * 58 / 60:.1f} min for a full V3's 58 MoE layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
