"""Where a long prompt's step goes on the GPU: CUDA kernel time by kernel, one prefill chunk.

    python scripts/profile_prefill.py [--gguf-path P] [--tokens 2048] [--mode fast]

Without --gguf-path it writes a V2-Lite-shaped Q4_K_M model. Runs a prompt of --tokens tokens
(one chunk, every MoE layer streamed or on the CPU as the start-up cost model picks) a few times,
then once under torch.profiler, and prints the wall time beside the CUDA time of each kernel
name (summed over launches; torch ops that launch kernels appear beside their kernels), largest
first. --itl also times every step of a stream decoding beside the prompt (its chunk's pass
spread over steps: the step's wall time and the host's time launching the pass's pieces) and
profiles one step in the middle of the pass.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_e2e import build_model, rules_with_mode

from hybrid.engine.config import EngineConfig
from hybrid.engine.llm import LLM
from hybrid.engine.sampling.sampling_params import SamplingParams


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def prompt_once(llm: LLM, n: int, seed: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    t = time.perf_counter()
    r = llm._submit([1000 + (j * 31 + seed) % 90000 for j in range(n)], params, lambda e: None)
    while not r.is_finished:
        llm.worker.step()
    _sync()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf-path")
    ap.add_argument("--preset", default="v2-lite")
    ap.add_argument("--optimize-rules", default="DeepSeek-V2-Lite")
    ap.add_argument("--mode", choices=["fast", "exact"], default="fast")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--host", action="store_true",
                    help="also profile the host's Python time of one prompt (cProfile)")
    ap.add_argument("--itl", action="store_true",
                    help="also time the steps of a decoding stream beside the prompt")
    ap.add_argument("--decode-gap", type=float, default=EngineConfig.decode_gap,
                    help="the engine's --decode-gap (the layers a step of the pass takes)")
    args = ap.parse_args()
    path = args.gguf_path or build_model(args.preset, Path(tempfile.mkdtemp()))
    config = EngineConfig(max_batch_size=2, chunk_size=args.tokens, decode_chunk_size=args.tokens,
                          cache_lens=max(16 * 1024, 2 * args.tokens), prefix_cache=False,
                          decode_gap=args.decode_gap,
                          # each decode graph's events bracket that step alone: a step launched
                          # ahead would sit between them
                          overlap_decode="off")
    llm = LLM(path, rules_with_mode(args.optimize_rules, args.mode), engine_config=config,
              status=lambda m: print("start-up:", m, flush=True))
    runner = llm.engine.runner
    streamed = runner.placement.streamed(args.tokens, True)
    print(f"{args.tokens} tokens: {len(streamed)} of {len(runner.program.moe_layers)} MoE "
          f"layers streamed", flush=True)
    walls = [prompt_once(llm, args.tokens, s) for s in range(3)]
    print("wall ms:", [round(w * 1e3, 1) for w in walls], flush=True)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        wall = prompt_once(llm, args.tokens, 7)
    table(prof, f"a {args.tokens}-token prompt alone: wall {wall * 1e3:.1f} ms", args.top)
    if args.host:
        host_table(llm, args.tokens, args.top)
    if args.itl:
        itl_steps(llm, args.tokens, args.top)
    return 0


def table(prof, title: str, top: int) -> None:
    kernels = sorted(((e.self_device_time_total, e.count, e.key) for e in prof.key_averages()
                      if e.self_device_time_total > 0), reverse=True)
    total = sum(k[0] for k in kernels)
    print(f"\n{title}, CUDA kernel time {total / 1e3:.1f} ms")
    print("| kernel | launches | ms | share |\n|---|---|---|---|")
    for us, count, key in kernels[:top]:
        print(f"| {key[:90]} | {count} | {us / 1e3:.2f} | {us / total:.0%} |")


def timed_step(llm: LLM) -> float:
    """Seconds of one engine step, the device synchronized before and after."""
    _sync()
    t = time.perf_counter()
    llm.worker.step()
    _sync()
    return time.perf_counter() - t


def _computing_ms(form) -> float:
    """The last whole-step graph's CPU experts' kernel time (the one-call driver's stamps; the
    rest of their wall time is waiting for the GPU's flags), or nan."""
    host = getattr(form, "host", None)
    if host is None or not host.one_call:
        return float("nan")
    from cpu_kernels.simd.clock import cycles_per_us

    return float((host.stamps[:, 1] - host.stamps[:, 0]).sum()) / cycles_per_us() / 1e3


def _timed(fn, spent: list):
    """fn, appending each call's wall seconds to `spent`."""
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent.append(time.perf_counter() - t)
    return timed


def host_table(llm: LLM, n: int, top: int) -> None:
    """Where the host's time of one n-token prompt goes: cProfile's functions by own time,
    then by cumulative time."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    wall = prompt_once(llm, n, 11)
    prof.disable()
    print(f"\nhost profile of a {n}-token prompt: wall {wall * 1e3:.1f} ms")
    for key in ("tottime", "cumulative"):
        pstats.Stats(prof).strip_dirs().sort_stats(key).print_stats(top)


def itl_steps(llm: LLM, n: int, top: int) -> None:
    """A decoding stream, then an n-token prompt passing the layers over steps
    (layered_prefill.py): every step's wall time, the host's time launching the prompt's
    pieces, and where the decode's step is one graph, its CPU experts' host time and the
    graph's GPU time; then one middle step of the pass profiled alone."""
    params = SamplingParams(temperature=0, max_tokens=4096, ignore_eos=True)
    stream = llm._submit([1000 + j for j in range(32)], params, lambda e: None)
    for _ in range(8):
        llm.worker.step()
    layered = llm.engine.runner.layered
    advance, spent = layered.advance, []
    layered.advance = _timed(advance, spent)
    form = getattr(llm.engine.runner.graphs, "form", None)
    whole = form is not None and hasattr(form, "host")
    experts, graph_events = [], []
    if whole:  # the decode's CPU experts (host wall) and its graph on the GPU (events)
        host_run, launch, drive = form.host.run, form.launch, form.drive
        form.host.run = _timed(host_run, experts)
        started: list = []

        def evented_launch(*a, **k):  # an event before the graph, one after its experts
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            started.append(ev)
            return launch(*a, **k)

        def evented_drive(*a, **k):
            try:
                return drive(*a, **k)
            finally:
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                graph_events.append((started.pop(0), end))
        form.launch, form.drive = evented_launch, evented_drive
    for profiled in (False, True):
        prompt = llm._submit([2000 + (j * 37 + profiled) % 90000 for j in range(n)],
                             SamplingParams(temperature=0, max_tokens=1, ignore_eos=True),
                             lambda e: None)
        rows = []
        while not prompt.is_finished:
            spent.clear()
            experts.clear()
            graph_events.clear()
            job = layered.job
            if profiled and len(rows) == 6:
                acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
                with torch.profiler.profile(activities=acts) as prof:
                    wall = timed_step(llm)
                table(prof, f"step 6 of the pass: wall {wall * 1e3:.1f} ms", top)
            else:
                wall = timed_step(llm)
            gpu = sum(a.elapsed_time(b) for a, b in graph_events)
            rows.append((wall, sum(spent), 1e3 * sum(experts), _computing_ms(form), gpu,
                         job is not None and job.pieces or 0))
        if not profiled:
            print(f"\n{n}-token prompt beside a decoding stream: {len(rows)} steps")
            print("| step | wall ms | host ms launching the pass | decode's CPU experts ms "
                  "(computing) | decode graph on the GPU ms | pieces before |")
            print("|---|---|---|---|---|---|")
            for i, (wall, host, cpu, busy, gpu, pieces) in enumerate(rows):
                print(f"| {i} | {wall * 1e3:.1f} | {host * 1e3:.1f} | {cpu:.1f} ({busy:.1f}) "
                      f"| {gpu:.1f} | {pieces} |")
    for _ in range(8):
        experts.clear()
        graph_events.clear()
        wall = timed_step(llm)
        gpu = sum(a.elapsed_time(b) for a, b in graph_events)
        print(f"decode step alone: {wall * 1e3:.1f} ms; CPU experts {1e3 * sum(experts):.1f} "
              f"ms (computing {_computing_ms(form):.1f}), graph on the GPU {gpu:.1f} ms")
    layered.advance = advance
    if whole:
        form.host.run, form.launch, form.drive = host_run, launch, drive
    stream.cancel()
    while llm.engine.has_work:
        llm.worker.step()


if __name__ == "__main__":
    sys.exit(main())
