"""The GPU kernels alone, on the GPU machine: quantized products' weight bandwidth against the
device's copy bandwidth measured in the same run, and the paged MLA decode attention.

    python scripts/bench_gpu_kernels.py [--json out.json]
    python scripts/bench_gpu_kernels.py --prefill    # MLA prefill attention against torch
    python scripts/bench_gpu_kernels.py --prefill-sweep  # the expanded kernel's tiles
    python scripts/bench_gpu_kernels.py --sparse     # V3.2's sparse decode against dense MLA

Weights rotate over copies totalling > 3x the L2 cache, so every call reads them from HBM.
Calls are timed inside a CUDA graph of 20 calls (as the engine replays them: launching a Triton
kernel from Python costs more than a small kernel runs), median of triton.testing.do_bench.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cpu_kernels.formats.random_blocks import random_rows
from gpu_kernels.mla_decode import choose_splits, mla_decode
from gpu_kernels.qformat import to_planes
from gpu_kernels.qmatmul import qmatmul, qmatmul_t
from gpu_kernels.qtypes import block_size

SHAPES = [  # name, rows, cols: V3's and V2-Lite's decode products
    ("v3 q_b", 24576, 1536), ("v3 o_proj", 7168, 16384), ("v3 shexp gate_up", 4096, 7168),
    ("v2l q_proj", 3072, 2048), ("v2l shexp gate_up", 5632, 2048), ("v2l o_proj", 2048, 2048),
]
TYPES = {"Q4_K": 12, "Q6_K": 14, "Q8_0": 8, "Q5_0": 6, "Q2_K": 10, "Q3_K": 11, "Q5_K": 13,
         "Q4_0": 2, "BF16": 30}


SWEEP = [(4, 512, 4, 1), (4, 512, 4, 3), (2, 512, 2, 1), (2, 512, 2, 3), (4, 1024, 4, 1),
         (8, 1024, 8, 2), (4, 256, 4, 4), (2, 1024, 2, 1)]
# products with many rows (heads, dense MLPs): more rows per program
LARGE = [("v2l head", 102400, 2048), ("v2l dense gate_up", 21888, 2048),
         ("v3 dense gate_up", 36864, 7168), ("v3 o_proj", 7168, 16384)]
SWEEP_LARGE = [(2, 1024, 2, 1), (1, 1024, 1, 1), (1, 2048, 2, 1), (2, 2048, 2, 1),
               (2, 1024, 4, 1), (2, 1024, 1, 1), (1, 512, 1, 3), (2, 2048, 4, 2)]


# V3's attention products at one token: (name, rows, cols, groups, rows per group, row0,
# group stride); legacy kv_b's key half goes through qmatmul_t (the "t" entry)
V3_ATTENTION = [("v3 q_b", 24576, 1536, 1, 24576, 0, 0),
                ("v3 q_a+kv_a", 2112, 7168, 1, 2112, 0, 0),
                ("v3 o_proj", 7168, 16384, 1, 7168, 0, 0),
                ("v3 k_b absorb", 65536, 128, 128, 512, 0, 512),
                ("v3 v_b", 16384, 512, 128, 128, 0, 128),
                ("v3 legacy kv_b v", 32768, 512, 128, 128, 128, 256)]
SWEEP_V3 = [(2, 1024, 1, 1), (2, 512, 1, 1), (1, 512, 1, 1), (4, 512, 2, 1), (4, 1024, 2, 1),
            (8, 512, 4, 1), (4, 256, 1, 1), (8, 256, 2, 1), (2, 512, 2, 1), (16, 128, 4, 1)]
# qmatmul_t (legacy kv_b's absorption): rows per step, columns per program, warps
SWEEP_T = [(32, 64, 4), (16, 64, 4), (64, 64, 4), (128, 64, 4), (32, 32, 4), (32, 128, 4),
           (32, 64, 2), (64, 32, 2), (128, 32, 4), (32, 64, 8), (128, 64, 8), (64, 128, 8)]


def graph_ms(fn, calls: int = 20) -> float:
    """Milliseconds per call of fn() (each call may differ), replayed as one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return triton.testing.do_bench(g.replay, return_mode="median") / calls


def tile_sweep(label: str, tiles: list, measure, rows: list, **row) -> None:
    """GB/s of measure(t) for each tile t: a row each (with `row`'s fields), one printed line."""
    line = []
    for t in tiles:
        gbs = measure(t)
        rows.append({**row, "tiles": t, "GB_s": gbs})
        line.append(f"{t}: {gbs:.0f}")
    print(f"{label} " + "  ".join(line), flush=True)


def report_copy_bandwidth() -> float:
    """copy_bandwidth(), printed: the line every sweep's GB/s compare against."""
    copy = copy_bandwidth()
    print(f"device copy: {copy:.0f} GB/s (read + write)", flush=True)
    return copy


def copy_bandwidth() -> float:
    """GB/s of a device-to-device copy, bytes read plus written."""
    a = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), return_mode="median")
    return 2 * a.numel() / ms / 1e6


def weights(qtype: int, rows: int, cols: int, copies: int):
    rng = np.random.default_rng(0)
    raw = torch.from_numpy(random_rows(rng, qtype, rows, cols, 0.02).copy()).cuda()
    w = to_planes(raw, qtype, rows, cols)
    return [w] + [type(w)(w.qtype, w.rows, w.cols, tuple(p.clone() for p in w.planes))
                  for _ in range(copies - 1)]


def rotating_weights(qtype: int, rows: int, cols: int) -> list:
    one = weights(qtype, rows, cols, 1)[0]
    return weights(qtype, rows, cols, max(2, int(3 * 50e6 / one.nbytes) + 1))


def bench_product(ws: list, m: int, tiles: tuple[int, ...] | None = None) -> dict:
    one, copies = ws[0], len(ws)
    rows, cols = one.rows, one.cols
    x = torch.randn(m, cols, device="cuda")
    out = torch.empty(m, rows, device="cuda")
    i = [0]

    def call():
        i[0] = (i[0] + 1) % copies
        qmatmul(x, ws[i[0]], out=out, tiles=tiles)
    ms = graph_ms(call)
    return {"ms": ms, "GB_s": one.nbytes / ms / 1e6}


def bench_grouped(ws: list, spec: tuple, tiles: tuple[int, ...] | None = None,
                  transposed: bool = False) -> dict:
    """One token through a grouped product (MLA's per-head matrices), as bench_product."""
    _, n_rows, cols, groups, n, row0, gstride = spec
    one, copies = ws[0], len(ws)
    x = torch.randn(1, groups, n if transposed else cols, device="cuda")
    i = [0]

    def call():
        i[0] = (i[0] + 1) % copies
        if transposed:  # the other half of each group's rows: rows [0, n)
            qmatmul_t(x, ws[i[0]], in_rows=n, gstride=gstride, tiles=tiles)
        else:
            qmatmul(x, ws[i[0]], out_rows=n, row0=row0, gstride=gstride, tiles=tiles)
    ms = graph_ms(call)
    read = one.nbytes * groups * n / n_rows  # the rows the groups read
    return {"ms": ms, "GB_s": read / ms / 1e6}


def sweep_v3(tname: str) -> list[dict]:
    """Tile sweeps of V3's attention products at one token (GB/s of the weights read)."""
    rows = []
    for spec in V3_ATTENTION:
        name, n_rows, cols = spec[:3]
        if cols % block_size(TYPES[tname]):
            continue  # a file stores such rows in a type with smaller blocks
        ws = rotating_weights(TYPES[tname], n_rows, cols)
        line = []
        for tiles in SWEEP_V3:
            res = bench_grouped(ws, spec, tiles)
            rows.append({"type": tname, "shape": name, "tiles": tiles, **res})
            line.append(f"{tiles[:3]}: {res['GB_s']:.0f}")
        print(f"sweep GB/s {tname:5} {name:17} " + " ".join(line), flush=True)
        if name == "v3 legacy kv_b v":
            line = []
            for tiles in SWEEP_T:
                res = bench_grouped(ws, spec, tiles, transposed=True)
                rows.append({"type": tname, "shape": "v3 legacy kv_b absorb (t)", "tiles": tiles,
                             **res})
                line.append(f"{tiles}: {res['GB_s']:.0f}")
            print(f"sweep GB/s {tname:5} legacy absorb (t) " + " ".join(line), flush=True)
    return rows


def bench_attention(batch: int, heads: int, length: int, block: int | None = None,
                    precision: str | None = None) -> dict:
    page, c, r = 64, 512, 64
    pages = batch * (length // page + 1)
    cache = torch.randn(pages * page + 1, c + r, device="cuda").bfloat16()
    table = torch.randperm(pages, device="cuda")[: pages].reshape(batch, -1).int()
    q = torch.randn(batch, heads, c, device="cuda") * 0.1
    qr = torch.randn(batch, heads, r, device="cuda") * 0.1
    lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    splits = choose_splits(batch, heads, length)
    kw = {k: v for k, v in (("block_tokens", block), ("precision", precision)) if v}
    ms = graph_ms(lambda: mla_decode(q, qr, cache, table, lens, page, 0.07, splits, **kw))
    read = batch * length * (c + r) * 2
    return {"us": ms * 1e3, "GB_s": read / ms / 1e6, "splits": splits}


PREFILL = [(16, 512, 512), (16, 512, 2048), (16, 2048, 2048), (16, 8192, 8192),
           (128, 512, 2048), (128, 2048, 2048), (128, 8192, 8192)]  # heads, chunk, keys


def bench_prefill(heads: int, q_len: int, kv_len: int) -> dict:
    """One chunk's attention (keys: the chunk's prefix + its own), DeepSeek's dims: the
    absorbed kernel (mla_prefill) against the expanded one (mla_prefill_expanded, the engine's
    path for chunks), alone and with the kv_b product that makes its keys and values."""
    from gpu_kernels.mla_prefill import mla_prefill
    from gpu_kernels.mla_prefill_expanded import mla_prefill_expanded

    c, r, nope, v = 512, 64, 128, 128
    cache = torch.randn(kv_len + 64, c + r, device="cuda").bfloat16()
    slots = torch.randperm(kv_len + 64, device="cuda")[:kv_len]
    q = torch.randn(q_len, heads, c, device="cuda") * 0.1
    qr = torch.randn(q_len, heads, r, device="cuda") * 0.1
    meta = torch.tensor([[0, q_len, kv_len, 0]], device="cuda")
    out = torch.empty_like(q)
    ms = graph_ms(lambda: mla_prefill(q, qr, cache, meta, slots, 0.07, q_len, out), calls=3)
    w_kv = torch.randn(heads * (nope + v), c, device="cuda") * 0.05
    qx = torch.randn(q_len, heads, nope + r, device="cuda") * 0.1
    o = torch.empty(q_len, heads, v, device="cuda")

    def expanded(kv=None):
        rows = cache[slots]
        if kv is None:
            kv = (rows[:, :c].float() @ w_kv.t()).view(-1, heads, nope + v)
        mla_prefill_expanded(qx, kv[..., :nope], rows[:, c:], kv[..., nope:], meta, 0.07,
                             q_len, o)
    kv = (cache[slots][:, :c].float() @ w_kv.t()).view(-1, heads, nope + v)
    kernel_ms = graph_ms(lambda: expanded(kv), calls=3)
    full_ms = graph_ms(expanded, calls=3)
    pairs = heads * q_len * (kv_len - q_len / 2)  # causal
    return {"us": ms * 1e3, "TFLOPS": 2 * pairs * (2 * c + r) / ms / 1e9,
            "expanded_us": full_ms * 1e3, "expanded_kernel_us": kernel_ms * 1e3,
            "expanded_TFLOPS": 2 * pairs * (nope + r + v) / kernel_ms / 1e9}


PREFILL_SWEEP = [(16, 8192, 8192), (16, 2048, 8192), (128, 2048, 2048)]  # heads, chunk, keys
EXPANDED_TILES = [("tf32", None), ("fp16", None)] + [
    ("fp16", t) for t in ((128, 64, 8, 2), (128, 32, 8, 3), (64, 64, 4, 1), (128, 128, 8, 1))]


def prefill_sweep(heads: int, q_len: int, kv_len: int) -> dict:
    """The expanded kernel alone (keys and values made once), per (precision, tiles):
    TFLOP/s of its causal products, one printed line."""
    from triton.runtime.errors import OutOfResources

    from gpu_kernels.mla_prefill_expanded import mla_prefill_expanded

    r, nope, v = 64, 128, 128
    kv = torch.randn(kv_len, heads, nope + v, device="cuda") * 0.3
    k_rope = torch.randn(kv_len, r, device="cuda").bfloat16()
    q = torch.randn(q_len, heads, nope + r, device="cuda") * 0.1
    meta = torch.tensor([[0, q_len, kv_len, 0]], device="cuda")
    o = torch.empty(q_len, heads, v, device="cuda")
    flop = 2 * heads * q_len * (kv_len - q_len / 2) * (nope + r + v)
    res, line = {}, []
    kv16 = kv.half()
    for (prec, tiles), keys in [(t, k) for t in EXPANDED_TILES for k in ("f32", "f16")]:
        if keys == "f16" and prec != "fp16":
            continue
        k = kv16 if keys == "f16" else kv
        label = f"{prec} {tiles} {keys} keys"
        try:
            ms = graph_ms(lambda k=k, prec=prec, tiles=tiles: mla_prefill_expanded(
                q, k[..., :nope], k_rope, k[..., nope:], meta, 0.07, q_len, o, prec, tiles),
                calls=3)
        except OutOfResources as e:  # a tile that does not fit (shared memory): skipped
            line.append(f"{label}: {type(e).__name__}")
            continue
        res[label] = ms * 1e3
        line.append(f"{label}: {ms * 1e3:.0f} us {flop / ms / 1e9:.0f} TF")
    print(f"expanded H={heads} chunk={q_len} keys={kv_len}:\n  " + "\n  ".join(line), flush=True)
    return {"heads": heads, "q_len": q_len, "kv_len": kv_len, "us": res}


SPARSE = [(b, n) for b in (1, 8) for n in (1024, 8192, 32768, 131072)]  # batch, context


def bench_sparse(batch: int, length: int, topk: int = 2048) -> dict:
    """One decode step's attention of a layer at V3.2's dims over `length` cached tokens: dense
    MLA (every key) against the sparse path (the indexer's scores over every key, the top-k,
    MLA over those), and the sparse path's parts."""
    from gpu_kernels.mla_index import index_scores_paged, sparse_mla_decode, top_slots

    page, c, r, heads, ih, idim = 64, 512, 64, 128, 64, 128
    pages = batch * -(-length // page)
    cache = torch.randn(pages * page + 1, c + r, device="cuda").bfloat16()
    keys = torch.randn(pages * page + 1, idim, device="cuda").bfloat16()
    table = torch.randperm(pages, device="cuda").reshape(batch, -1).int()
    q = torch.randn(batch, heads, c, device="cuda") * 0.1
    qr = torch.randn(batch, heads, r, device="cuda") * 0.1
    iq = torch.randn(batch, ih, idim, device="cuda")
    iw = torch.randn(batch, ih, device="cuda")
    lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    capacity = table.shape[1] * page
    dense = graph_ms(lambda: mla_decode(q, qr, cache, table, lens, page, 0.07,
                                        choose_splits(batch, heads, length)))
    splits = choose_splits(batch, heads, min(topk, length))
    sparse = graph_ms(lambda: sparse_mla_decode(q, qr, cache, iq, iw, keys, table, lens, page,
                                                topk, capacity, 0.07, splits))
    scores = index_scores_paged(iq, iw, keys, table, lens, page, capacity)
    score_ms = graph_ms(lambda: index_scores_paged(iq, iw, keys, table, lens, page, capacity))
    pick_ms = graph_ms(lambda: top_slots(scores, table, lens, page, topk))
    return {"dense_us": dense * 1e3, "sparse_us": sparse * 1e3, "index_us": score_ms * 1e3,
            "topk_us": pick_ms * 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--types", default="Q4_K,Q6_K,Q8_0")
    ap.add_argument("--sweep", action="store_true",
                    help="decode tile configurations (rows, step, warps) at M=1 first")
    ap.add_argument("--sweep-v3", action="store_true",
                    help="only the tile sweep of V3's attention products, then stop")
    ap.add_argument("--sweep-large", action="store_true",
                    help="only the tile sweep of products with many rows, then stop")
    ap.add_argument("--prefill", action="store_true",
                    help="only MLA prefill attention (absorbed against expanded), then stop")
    ap.add_argument("--prefill-sweep", action="store_true",
                    help="only the expanded prefill kernel's tiles, per precision, then stop")
    ap.add_argument("--sparse", action="store_true",
                    help="only V3.2's sparse decode attention against dense MLA, then stop")
    args = ap.parse_args()
    if args.sparse:
        rows = []
        for batch, length in SPARSE:
            res = bench_sparse(batch, length)
            rows.append({"batch": batch, "context": length, **res})
            print(f"decode attention B={batch} context={length:6}: dense {res['dense_us']:8.1f} "
                  f"us, sparse {res['sparse_us']:7.1f} us (indexer {res['index_us']:6.1f}, "
                  f"top-k {res['topk_us']:6.1f})", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps({"sparse": rows}, indent=1))
        return 0
    copy = copy_bandwidth()
    print(f"device copy: {copy:.0f} GB/s (read + write)", flush=True)
    rows = []
    if args.prefill_sweep:
        rows = [prefill_sweep(*shape) for shape in PREFILL_SWEEP]
        if args.json:
            Path(args.json).write_text(json.dumps({"prefill_sweep": rows}, indent=1))
        return 0
    if args.prefill:
        for heads, q_len, kv_len in PREFILL:
            res = bench_prefill(heads, q_len, kv_len)
            rows.append({"heads": heads, "q_len": q_len, "kv_len": kv_len, **res})
            print(f"mla_prefill H={heads:3} chunk={q_len:4} keys={kv_len:5}: absorbed "
                  f"{res['us']:8.1f} us ({res['TFLOPS']:.0f} TFLOPS); expanded "
                  f"{res['expanded_us']:8.1f} us with kv_b, kernel {res['expanded_kernel_us']:8.1f}"
                  f" us ({res['expanded_TFLOPS']:.0f} TFLOPS): {res['us'] / res['expanded_us']:.1f}x",
                  flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps({"prefill": rows}, indent=1))
        return 0
    if args.sweep_v3:
        for tname in args.types.split(","):
            rows += sweep_v3(tname)
        if args.json:
            Path(args.json).write_text(json.dumps({"copy_GB_s": copy, "products": rows}))
        return 0
    if args.sweep_large:
        for tname in args.types.split(","):
            for name, n, k in LARGE:
                ws = rotating_weights(TYPES[tname], n, k)
                line = []
                for tiles in SWEEP_LARGE:
                    res = bench_product(ws, 1, tiles)
                    rows.append({"type": tname, "shape": name, "m": 1, "tiles": tiles, **res})
                    line.append(f"{tiles[:3]}{'p' + str(tiles[3]) if tiles[3] > 1 else ''}: "
                                f"{res['GB_s']:.0f}")
                print(f"sweep GB/s {tname:5} {name:17} " + " ".join(line), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps({"copy_GB_s": copy, "products": rows}))
        return 0
    if args.sweep:
        for tname in args.types.split(","):
            for name, n, k in (SHAPES[1], SHAPES[3], SHAPES[5]):
                ws = rotating_weights(TYPES[tname], n, k)
                line = []
                for tiles in SWEEP:
                    res = bench_product(ws, 1, tiles)
                    rows.append({"type": tname, "shape": name, "m": 1, "tiles": tiles, **res})
                    line.append(f"{tiles}: {res['ms'] * 1e3:.1f}us")
                print(f"sweep {tname:5} {name:16} " + "  ".join(line), flush=True)
    for tname in args.types.split(","):
        for name, n, k in SHAPES:
            ws = rotating_weights(TYPES[tname], n, k)
            for m in (1, 8, 16):
                res = bench_product(ws, m)
                rows.append({"type": tname, "shape": name, "m": m, **res})
                print(f"{tname:5} {name:18} m={m:2}: {res['ms'] * 1e3:7.1f} us "
                      f"{res['GB_s']:6.0f} GB/s ({res['GB_s'] / copy:.0%} of copy)", flush=True)
    att = []
    if args.sweep:
        for b, h, length in ((1, 16, 4096), (1, 128, 4096), (8, 128, 2048)):
            line = []
            for block in (16, 32):
                for prec in ("tf32", "tf32x3", "ieee"):
                    res = bench_attention(b, h, length, block, prec)
                    att.append({"batch": b, "heads": h, "len": length, "block": block,
                                "precision": prec, **res})
                    line.append(f"{block}/{prec}: {res['us']:.1f}us")
            print(f"sweep mla B={b} H={h} len={length}: " + "  ".join(line), flush=True)
    for b, h, length in ((1, 16, 1024), (1, 16, 8192), (8, 16, 2048), (1, 128, 4096),
                         (16, 128, 2048)):
        res = bench_attention(b, h, length)
        att.append({"batch": b, "heads": h, "len": length, **res})
        print(f"mla_decode B={b:2} H={h:3} len={length:5}: {res['us']:7.1f} us "
              f"{res['GB_s']:6.0f} GB/s of cache, {res['splits']} splits", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"copy_GB_s": copy, "products": rows,
                                               "attention": att}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
