"""hybrid and llama.cpp on the same GGUF in one run: decode and prefill tokens/s, and ratios.

    python scripts/bench_e2e.py [--gguf-path P | --preset v2-lite] [--optimize-rules R]
        [--mode fast] [--llama-bench PATH] [--threads 16] [--json out.json]

Without --gguf-path it writes a synthetic model of --preset (Q4_K_M recipe, legacy layout,
DeepSeek vocabulary). Rows:
- decode tok/s at 1 stream (with and without CUDA graphs) and aggregate at 4, 8, 16 streams;
  per step, the time the CPU experts took and the rest (the GPU's share);
- prefill tok/s of one prompt of 128, 512, 2048 tokens (time to its first token), as
  `--prefill-experts` chooses (default auto: streamed to the GPU or on the CPU per layer, by the
  cost model measured at start-up) and again with the CPU experts only; medians of
  `--prefill-rounds` runs, the first (cold) shown apart;
- `--itl-prompt N`: a running stream's inter-token latency while a prompt of N tokens
  prefills, against its idle value, and the time each step spent in Python's cyclic collector
  (`--gc both` times the row before and after freezing start-up's heap, as `hybrid serve` does;
  default `freeze`: every row after it);
- `--chat N`: the third turn of a chat whose history reaches ~N tokens (scripts/
  bench_prefix_cache.py's turns), time to first token with the prefix cache and without;
  every other row runs with the prefix cache off (their prompts repeat: they time prefill);
- `--decode-context N,M`: decode tok/s of one stream after a prompt of N (M) tokens, the
  context its every step attends to (DeepSeek-V3.2's indexer keeps that cost near flat);
- with --llama-bench, llama.cpp's `llama-bench -ngl 99 -ot exps=CPU -fa 1` on the same file
  (tg = decode, pp = prefill; tg at `-d N` for the --decode-context rows), and ours over theirs.
`--mode fast|exact` rewrites the rule file's experts mode (fast: int8/bf16 CPU experts).
`--defer K,..` adds one stream's decode with expert deferral at each k (ops.experts.set_deferral
in the same engine), round by round with k = 0 (`--defer-rounds`), medians per k: deferral's
effect is smaller than this shared host's drift between calls.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# the repository and scripts/ (its neighbours), also when another script runs this file
sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

from step_probe import StepProbe, slowest

from hybrid.engine.config import EngineConfig
from hybrid.engine.graphs import setup as graphs_setup
from hybrid.engine.heap import freeze_start_up_heap
from hybrid.engine.llm import LLM
from hybrid.engine.prefill.prefill_costs import ExpertPlacement
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.ops.experts import ExpertsOp, set_deferral


def build_model(preset: str, out: Path, layers: int | None = None) -> str:
    from hybrid.synth.make_model import MakeModelOptions, make_model
    from hybrid.synth.presets import get_preset
    from hybrid.synth.vocab import get_vocab

    p = get_preset(preset, layers)
    t = time.perf_counter()
    layout = "mla" if p.arch == "deepseek32" else "legacy"  # deepseek32: the MLA layout only
    (path,) = make_model(MakeModelOptions(p, "q4_k_m", layout, vocab="deepseek"),
                         get_vocab("deepseek", p.vocab_size), out / f"{preset}-q4_k_m.gguf")
    print(f"make-model {preset}: {time.perf_counter() - t:.0f} s", flush=True)
    return str(path)


def rules_with_mode(rules: str, mode: str | None, activations: str | None = None) -> str:
    """A copy of the rule file whose CPU experts run `mode` and whose GPU products take x in
    `activations` (None: unchanged)."""
    from hybrid.rules.planner import with_activations, with_experts_mode

    if mode is not None:
        rules = str(with_experts_mode(rules, mode, Path(tempfile.mkdtemp())))
    if activations is not None:
        rules = str(with_activations(rules, activations, Path(tempfile.mkdtemp())))
    return rules


class ExpertClock:
    """Times every CPU experts call (ExpertsOp.run_host) while installed: wall time from the
    call to its return, and the kernels' own time between their cycle stamps (the rest is the
    pool's wake-up and hand-back). Steps captured whole drive all layers from one call
    (HostExperts): there only the kernels' stamps count."""

    def __init__(self) -> None:
        from cpu_kernels.simd.clock import cycles_per_us
        from hybrid.engine.step.host_experts import HostExperts

        self.calls: list[float] = []
        self.kernels: list[float] = []
        self._orig = ExpertsOp.run_host
        self._orig_host = HostExperts.run
        rate = cycles_per_us()

        def host_run(host, seq, n):
            self._orig_host(host, seq, n)
            if host.one_call:
                d = (host.stamps[:, 1] - host.stamps[:, 0]) / rate * 1e-6
                self.kernels += d.tolist()
        HostExperts.run = host_run

        def timed(op, x, ids, w, out):
            t = time.perf_counter()
            if op.pool is None:
                self._orig(op, x, ids, w, out)
            elif op.pool.can_run_inline:
                stamps = np.empty(2, np.int64)
                op.pool.run_inline(x, ids, w, op.placed, out, stamps)
                self.kernels.append(float(stamps[1] - stamps[0]) / rate * 1e-6)
            else:
                job = op.pool.submit(x, ids, w, op.placed, out)
                job.wait()
                s = job.stamps
                self.kernels.append(float(s[:, 2].max() - s[:, 1].min()) / rate * 1e-6)
            self.calls.append(time.perf_counter() - t)
        ExpertsOp.run_host = timed

    @property
    def seconds(self) -> float:
        return sum(self.calls) or sum(self.kernels)

    def medians_us(self) -> dict:
        import statistics

        out = {"call_us": statistics.median(self.calls) * 1e6 if self.calls else 0.0}
        if self.kernels:
            out["kernel_us"] = statistics.median(self.kernels) * 1e6
        return out

    def close(self) -> None:
        from hybrid.engine.step.host_experts import HostExperts

        ExpertsOp.run_host = self._orig
        HostExperts.run = self._orig_host


def decode(llm: LLM, streams: int, prompt_len: int, gen: int) -> dict:
    params = SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True)
    reqs = [llm._submit([1000 + 7 * i + j for j in range(prompt_len)], params, lambda e: None)
            for i in range(streams)]
    while any(r.num_output_tokens == 0 for r in reqs):  # prefill, first tokens
        llm.worker.step()
    clock, steps = ExpertClock(), 0
    before = sum(r.num_output_tokens for r in reqs)
    t = time.perf_counter()
    try:
        while any(not r.is_finished for r in reqs):
            llm.worker.step()
            steps += 1
    finally:
        clock.close()
    dt = time.perf_counter() - t
    tokens = sum(r.num_output_tokens for r in reqs) - before
    return {"streams": streams, "tok_s": tokens / dt, "step_ms": dt / steps * 1e3,
            "experts_ms": clock.seconds / steps * 1e3,
            "gpu_share": 1 - clock.seconds / dt, **clock.medians_us()}


def prefill(llm: LLM, n: int) -> dict:
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    t = time.perf_counter()
    r = llm._submit([1000 + (j * 31) % 90000 for j in range(n)], params, lambda e: None)
    while not r.is_finished:
        llm.worker.step()
    dt = time.perf_counter() - t
    return {"tokens": n, "tok_s": n / dt, "ttft_s": dt}


def prefill_rows(llm: LLM, prompts: list[int], rounds: int) -> list[dict]:
    """prefill() of each length `rounds` times: the median, and the first run apart (the first
    prompt after start-up runs cold; llama-bench warms up before its rows)."""
    rows = []
    for n in prompts:
        runs = [prefill(llm, n) for _ in range(rounds)]
        ttft = statistics.median(r["ttft_s"] for r in runs)
        rows.append({"tokens": n, "tok_s": n / ttft, "ttft_s": ttft,
                     "rounds": [r["ttft_s"] for r in runs]})  # in order: the first is cold
    return rows


IDLE_GAPS = 128


def itl_during_prefill(llm: LLM, n: int) -> dict:
    """One stream decoding; its inter-token gaps idle, then while a prompt of n tokens
    prefills (every step to that prompt's first token)."""
    # enough tokens to outlast the prompt's steps; the stream is cancelled after them
    params = SamplingParams(temperature=0, max_tokens=IDLE_GAPS + 32 + 4096, ignore_eos=True)
    stream = llm._submit([1000 + j for j in range(32)], params, lambda e: None)
    stamps: list[float] = []
    runner = llm.engine.runner
    probe = StepProbe(runner)  # its rows: every step while the prompt prefills

    def step() -> None:
        before = stream.num_output_tokens
        row = probe.step(llm.worker.step)
        row["token"] = int(stream.num_output_tokens > before)
        if row["token"]:
            stamps.append(time.perf_counter())
        job = runner.job  # the layered chunk in flight (layered_prefill.py): MoE layers passed
        row["job_layers"] = -1 if job is None else runner.program.layers_passed(job.pieces)
    with probe:
        # idle gaps as many as a long prompt's steps (~110 for 8K tokens): their max is the
        # like-for-like reference for the busy max (this host's own stalls show in both)
        while len(stamps) < IDLE_GAPS + 32:
            step()
        idle = np.diff(stamps[-IDLE_GAPS - 1:])
        stamps.clear()
        probe.rows.clear()
        prompt = llm._submit([2000 + (j * 37) % 90000 for j in range(n)],
                             SamplingParams(temperature=0, max_tokens=1, ignore_eos=True),
                             lambda e: None)
        t = time.perf_counter()
        stamps.append(t)
        while not prompt.is_finished:
            step()
        ttft = time.perf_counter() - t
    stream.cancel()
    while llm.engine.has_work:
        llm.worker.step()
    busy = np.diff(stamps)
    return {"prompt": n, "idle_itl_ms": float(np.median(idle) * 1e3),
            "idle_max_itl_ms": float(idle.max() * 1e3),
            "idle_p90_itl_ms": float(np.percentile(idle, 90) * 1e3),
            "max_itl_ms": float(busy.max() * 1e3), "median_itl_ms": float(np.median(busy) * 1e3),
            "p90_itl_ms": float(np.percentile(busy, 90) * 1e3), "ttft_s": ttft,
            "gaps_ms": [round(float(g) * 1e3, 2) for g in busy],  # in order: where the max falls
            "gc_ms": round(sum(r["gc_ms"] for r in probe.rows), 2),
            "full_collections": sum(r["gc_generation"] == 2 for r in probe.rows),
            "frozen": gc.get_freeze_count(), "slowest": slowest(probe.rows), "probe": probe.rows}


def chat_turns(llm: LLM, history: int) -> dict:
    """TTFT of a 3-turn chat's turns (a long first message, short later ones) with the
    scheduler's prefix cache off, then on (a cache of its own, made here)."""
    from bench_prefix_cache import turns

    from hybrid.engine.scheduling.kv_pages import PrefixCache

    scheduler = llm.engine.scheduler
    first, message, answer = history - 140, 64, 16
    out = {"history": history}
    for name, cache in (("off", None), ("on", PrefixCache(scheduler.pages.page_size))):
        scheduler.cache = cache
        out[name] = turns(llm, first, message, answer, seed=len(out))
        if cache is not None:  # its pages back to the pool before it goes
            scheduler.pages.free(cache.evict(cache.num_pages))
    scheduler.cache = None
    return out


def _variants(before: dict | None = None) -> dict:
    """Triton's compiled variants of gpu_kernels now, or those new since `before`."""
    from gpu_kernels.jit_cache import compiled_variants, new_variants

    now = compiled_variants()
    return now if before is None else new_variants(before, now)


def llama_bench(binary: str, path: str, threads: int, prompts: list[int], gen: int,
                depths: list[int] = ()) -> dict:
    """llama-bench's rows: {"pp512": tok/s, ..., "tg64": tok/s, "tg64@d32768": tok/s}; the
    tg rows at a depth run once (each first fills its depth's context)."""
    base = [binary, "-m", path, "-ngl", "99", "-ot", "exps=CPU", "-fa", "1", "-t", str(threads),
            "-o", "json"]
    runs = [["-p", ",".join(map(str, prompts)), "-n", str(gen), "-r", "3"]]
    if depths:
        runs.append(["-p", "0", "-n", str(gen), "-d", ",".join(map(str, depths)), "-r", "1"])
    out = {}
    for extra in runs:
        print(" ".join(base + extra), flush=True)
        rows = json.loads(subprocess.run(base + extra, check=True, capture_output=True,
                                         text=True).stdout)
        for r in rows:
            key = f"tg{r['n_gen']}" if r["n_gen"] else f"pp{r['n_prompt']}"
            if r.get("n_depth"):
                key += f"@d{r['n_depth']}"
            out[key] = r["avg_ts"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf-path")
    ap.add_argument("--preset", default="v2-lite")
    ap.add_argument("--layers", type=int, default=None, help="layers of the synthetic model")
    ap.add_argument("--optimize-rules", default="DeepSeek-V2-Lite")
    ap.add_argument("--mode", choices=["fast", "exact"], default=None)
    ap.add_argument("--llama-bench", default=None, help="a llama-bench binary (CUDA build)")
    ap.add_argument("--llama-json", default=None,
                    help="llama.cpp's rows from an earlier run on this machine and file (a "
                         "JSON object with a 'llama' key, as --json writes): shown beside ours")
    ap.add_argument("--llama-only", action="store_true",
                    help="with --llama-bench: write llama.cpp's rows to --json and stop (a "
                         "machine lease too short for both sides)")
    ap.add_argument("--threads", type=int, default=None, help="CPU expert threads (both)")
    ap.add_argument("--decode-graph", choices=["step", "layers"], default="step",
                    help="CUDA graphs of the decode rows (the other kind is timed at 1 stream)")
    ap.add_argument("--streams", default="1,4,8,16")
    ap.add_argument("--prefill", default="128,512,2048")
    ap.add_argument("--prefill-rounds", type=int, default=3,
                    help="runs of each prefill row (the median; the first run shown apart)")
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--decode-context", default="",
                    help="also decode one stream after prompts of these lengths (comma list)")
    ap.add_argument("--prefill-experts", choices=["auto", "cpu", "stream"], default="auto")
    ap.add_argument("--itl-prompt", type=int, default=None,
                    help="also time a stream's inter-token latency while N tokens prefill")
    ap.add_argument("--gc", choices=["freeze", "off", "both"], default="freeze",
                    help="freeze start-up's heap as hybrid serve does (both: the ITL row first "
                         "without, then with)")
    ap.add_argument("--chat", type=int, default=None,
                    help="also time a chat's third turn with and without the prefix cache")
    ap.add_argument("--attention-backend", choices=["auto", "triton", "flashinfer"],
                    default="auto")
    ap.add_argument("--defer", default="",
                    help="also decode one stream with defer_experts at each k (comma list)")
    ap.add_argument("--defer-rounds", type=int, default=3,
                    help="rounds of the deferral rows (k = 0 and each --defer k per round)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.prefill_rounds < 1:
        ap.error("--prefill-rounds must be at least 1")
    path = args.gguf_path or build_model(args.preset, Path(tempfile.mkdtemp()), args.layers)
    prompts = [int(n) for n in args.prefill.split(",")]
    streams = [int(n) for n in args.streams.split(",")]
    contexts = [int(n) for n in args.decode_context.split(",") if n]
    result: dict = {"model": Path(path).name, "rules": args.optimize_rules, "mode": args.mode}
    if args.llama_bench:
        threads = args.threads or (os.cpu_count() or 2)
        result["llama"] = llama_bench(args.llama_bench, path, threads, prompts, args.gen,
                                      contexts)
        print("llama.cpp:", result["llama"], flush=True)
        if args.llama_only:
            if args.json:
                Path(args.json).write_text(json.dumps(result, indent=1))
            return 0
    elif args.llama_json:
        result["llama"] = json.loads(Path(args.llama_json).read_text())["llama"]
    t = time.perf_counter()
    # one more request than the decode rows' streams: the ITL row runs a stream and a prompt
    config = EngineConfig(max_batch_size=max(streams) + bool(args.itl_prompt),
                          chunk_size=max(prompts),
                          cache_lens=max(16 * 1024, max(prompts) * 2,
                                         max(contexts, default=0) + 2 * args.gen),
                          cpu_threads=args.threads,
                          decode_graph=args.decode_graph, prefill_experts=args.prefill_experts,
                          prefix_cache=False, attention_backend=args.attention_backend)
    llm = LLM(path, rules_with_mode(args.optimize_rules, args.mode), engine_config=config,
              status=lambda m: print("start-up:", m, flush=True))
    result["load_s"] = time.perf_counter() - t
    print(f"loaded in {result['load_s']:.1f} s", flush=True)
    if args.gc == "freeze":
        result["frozen"] = freeze_start_up_heap()
    runner = llm.engine.runner
    result["attention_backend"] = runner.attention.name
    costs = runner.placement.costs
    result["stream"] = None if runner.stream is None else {
        "pinned": runner.stream.pinned, "experts_per_unit": runner.stream.experts_per_unit,
        "crossover_tokens": costs.crossover() if costs else None,
        "stream_ms": costs.stream_ms if costs else None, "cpu_ms": costs.cpu_ms if costs else None}
    print("streamed experts:", result["stream"], flush=True)
    compiled = _variants()
    result["prefill"] = prefill_rows(llm, prompts, args.prefill_rounds)
    if args.itl_prompt and args.gc == "both":
        result["itl_unfrozen"] = [itl_during_prefill(llm, args.itl_prompt)
                                  for _ in range(2)]
        result["frozen"] = freeze_start_up_heap()
    if args.itl_prompt:
        result["itl"] = itl_during_prefill(llm, args.itl_prompt)
        if args.gc == "both":
            result["itl_frozen"] = [itl_during_prefill(llm, args.itl_prompt)]
    if runner.stream is not None and args.prefill_experts != "cpu":
        placement, runner.placement = runner.placement, ExpertPlacement("cpu", ())
        result["prefill_cpu"] = prefill_rows(llm, prompts, args.prefill_rounds)
        if args.itl_prompt:
            result["itl_cpu"] = itl_during_prefill(llm, args.itl_prompt)
        runner.placement = placement
    if args.chat:
        result["chat"] = chat_turns(llm, args.chat)
    result["expert_layers"] = dict(llm.engine.expert_layer_counts)
    result["compiled_while_timing"] = _variants(compiled)
    result["decode"] = [decode(llm, s, 32, args.gen) for s in streams]
    result["decode_context"] = [{"context": n, **decode(llm, 1, n, args.gen)} for n in contexts]
    graphs = runner.graphs
    if graphs is not None:
        other = "layers" if config.decode_graph == "step" else "step"
        runner.graphs = graphs_setup.capture(runner, other)
        result["decode_other_graph"] = {"decode_graph": other, **decode(llm, 1, 32, args.gen)}
        runner.graphs = None
        result["decode_eager"] = decode(llm, 1, 32, args.gen)
        runner.graphs = graphs
    ks = [int(k) for k in args.defer.split(",") if k]
    if ks:
        result["decode_defer"] = decode_deferred(llm, [0, *ks], args.defer_rounds, args.gen)
    print(json.dumps(result, indent=1), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    print_table(result)
    return 0


def decode_deferred(llm: LLM, ks: list[int], rounds: int, gen: int) -> list[dict]:
    """One stream's decode at each defer_experts k, the ks interleaved round by round in one
    engine; per k the median round by tok/s and every round's rate."""
    import statistics

    runs: dict[int, list[dict]] = {k: [] for k in ks}
    try:
        for _ in range(rounds):
            for k in ks:
                set_deferral(llm.engine.runner.model, k)
                runs[k].append(decode(llm, 1, 32, gen))
    finally:
        set_deferral(llm.engine.runner.model, 0)
    rows = []
    for k, done in runs.items():
        rates = [d["tok_s"] for d in done]
        median = statistics.median_low(rates)
        rows.append({"defer": k, **done[rates.index(median)], "rounds": rates})
    return rows


def print_table(r: dict) -> None:
    llama = r.get("llama", {})
    print(f"\n{r['model']}, {r['rules']}, experts {r['mode'] or 'as in the rules'}")
    print("| row | hybrid tok/s | llama.cpp tok/s | ratio | step ms | experts ms | GPU share | "
          "experts call / kernel us |")
    print("|---|---|---|---|---|---|---|---|")
    tg = llama.get(next((k for k in llama if k.startswith("tg") and "@" not in k), ""), None)
    for d in r["decode"]:
        peer = tg if d["streams"] == 1 else None
        print(f"| decode x{d['streams']} | {d['tok_s']:.1f} | {_f(peer)} | "
              f"{_ratio(d['tok_s'], peer)} | {d['step_ms']:.2f} | {d['experts_ms']:.2f} | "
              f"{d['gpu_share']:.0%} | {_calls(d)} |")
    for d in r.get("decode_context", []):
        peer = llama.get(next((k for k in llama if k.endswith(f"@d{d['context']}")), ""))
        print(f"| decode x1 at context {d['context']} | {d['tok_s']:.1f} | {_f(peer)} | "
              f"{_ratio(d['tok_s'], peer)} | {d['step_ms']:.2f} | {d['experts_ms']:.2f} | "
              f"{d['gpu_share']:.0%} | {_calls(d)} |")
    if len(r.get("decode_context", [])) > 1:
        first, last = r["decode_context"][0], r["decode_context"][-1]
        print(f"decode at context {last['context']} against {first['context']}: step "
              f"{last['step_ms'] / first['step_ms']:.2f}x the time")
    if "decode_other_graph" in r:
        d = r["decode_other_graph"]
        print(f"| decode x1, decode_graph={d['decode_graph']} | {d['tok_s']:.1f} | | | "
              f"{d['step_ms']:.2f} | {d['experts_ms']:.2f} | {d['gpu_share']:.0%} | "
              f"{_calls(d)} |")
    if "decode_eager" in r:
        d = r["decode_eager"]
        print(f"| decode x1, no CUDA graphs | {d['tok_s']:.1f} | | | {d['step_ms']:.2f} | "
              f"{d['experts_ms']:.2f} | {d['gpu_share']:.0%} | {_calls(d)} |")
    for d in r.get("decode_defer", []):
        rounds = " / ".join(f"{v:.1f}" for v in d["rounds"])
        print(f"| decode x1, defer_experts={d['defer']} (median of {rounds}) | {d['tok_s']:.1f} "
              f"| {_f(tg)} | {_ratio(d['tok_s'], tg)} | {d['step_ms']:.2f} | "
              f"{d['experts_ms']:.2f} | {d['gpu_share']:.0%} | {_calls(d)} |")
    cpu_rows = {p["tokens"]: p for p in r.get("prefill_cpu", [])}
    for p in r["prefill"]:
        peer = llama.get(f"pp{p['tokens']}")
        print(f"| prefill {p['tokens']} (TTFT {p['ttft_s']:.2f} s, first {p['rounds'][0]:.2f}) "
              f"| {p['tok_s']:.0f} | "
              f"{_f(peer)} | {_ratio(p['tok_s'], peer)} | | | | |")
        if p["tokens"] in cpu_rows:
            c = cpu_rows[p["tokens"]]
            print(f"| prefill {c['tokens']}, CPU experts only | {c['tok_s']:.0f} | {_f(peer)} "
                  f"| {_ratio(c['tok_s'], peer)} | | | | |")
    print(f"Triton variants compiled after start-up (prefill and ITL rows): "
          f"{r.get('compiled_while_timing') or 'none'}")
    if "chat" in r:
        c = r["chat"]
        print(f"| chat, third turn of {c['history']} tokens: TTFT prefix cache off / on | "
              f"{c['off'][2] * 1e3:.0f} / {c['on'][2] * 1e3:.0f} ms | | "
              f"{c['off'][2] / c['on'][2]:.1f}x | | | | |")
    labels = {"itl_unfrozen": ", heap not frozen", "itl": "", "itl_frozen": ", again",
              "itl_cpu": ", CPU experts"}
    for key, label in labels.items():
        for d in ([r[key]] if isinstance(r.get(key), dict) else r.get(key, [])):
            print(f"| decode ITL while {d['prompt']} tokens prefill{label} "
                  f"| idle {d['idle_itl_ms']:.1f} ms (max {d['idle_max_itl_ms']:.1f}), median {d['median_itl_ms']:.1f}, p90 "
                  f"{d['p90_itl_ms']:.1f}, max {d['max_itl_ms']:.1f} (TTFT {d['ttft_s']:.2f} s; "
                  f"collector {d['gc_ms']:.1f} ms, {d['full_collections']} full) | | | | | | |")
            for row in d["slowest"][:2]:
                print("slow step:", json.dumps(row))


def _calls(d: dict) -> str:
    return f"{d.get('call_us', 0):.0f} / {d.get('kernel_us', 0):.0f}"


def _f(v: float | None) -> str:
    return "" if v is None else f"{v:.1f}"


def _ratio(ours: float, peer: float | None) -> str:
    return "" if not peer else f"{ours / peer:.2f}x"


if __name__ == "__main__":
    sys.exit(main())
