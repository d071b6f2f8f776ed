"""Where one stream's decode step goes on the critical path, phase by phase, as the engine runs
it with its defaults (the loop `hybrid serve` runs on its main thread, without HTTP).

    python scripts/probe_decode_host.py [--gguf-path P] [--optimize-rules R] [--gen-len 256]
        [--set NAME=VALUE] [--defer K,..] [--json FILE]

One greedy request (or, given --temperature and --top-p, a seeded sampled one) decodes
--gen-len tokens; every step after the first few is stamped on the CPU's time-stamp counter
(cpu_kernels.simd.clock, the clock the CPU experts' driver stamps its layers with). Phases, in
microseconds, on the engine's thread (the one `hybrid serve` steps):
- schedule: the worker's lock and the scheduler (absent where the step was scheduled ahead);
- load, launch: the step's rows staged (StaticStep.load) and its graph launched (absent where
  the step was launched ahead, during the step before);
- read_back: tokens read back: the step before's where they were left pending (launch-ahead,
  before the driver; where this step launches the next ahead, the beside thread makes them:
  ahead_read_back), else this step's (after it, inside `deliver`);
- to_drive: from the step's start to the CPU experts' driver entered (all of the above);
  inside it, where a whole-step graph drives: to_execute (the worker's step to engine.execute),
  to_run (the engine's own, to ModelRunner.run), to_form_drive (the runner and DecodeGraphs,
  to WholeStepGraphs.drive), to_prepared (before_experts: the picks taken or the tokens read
  back; HostExperts.prepare), to_driver (the beside thread's job submitted);
- gpu_to_first_layer: from there to the driver's first worker seeing the first MoE layer's
  rows (the GPU's embedding, dense layers, first attention and router, and the hand-over, or
  what is left of them); inside it, from the driver's entry: in_numba (the one-region driver's
  numba call entered), first_worker and last_worker (its team's workers at their meeting);
- cpu_experts: the layers' kernels (sum of `busy`); cpu_waits_between_layers: from one layer's
  answer to the next layer's rows seen (the GPU's work between them, or a deferred pass);
- after_last_layer: from the last answer to the driver returning;
- head_sampling: the picks launched after the driver (absent where the beside thread did it);
- deliver: from the driver's return to the step's tokens delivered (completing the chunks,
  detokenizing, the sinks, retiring; head_sampling and a read back after the driver are in it);
  inside it: to_runner_return (the beside thread's end awaited, DecodeGraphs and ModelRunner
  returning), to_engine_return (the engine completing the step), worker_deliver (the sinks);
- period: from one step's start to the next one's (the rate a stream sees).
On the beside thread (`Ahead`, launch-ahead: this step's tokens decided and the next step
launched while this one's CPU experts run), each from the driver's entry: ahead_saw_first_layer
(its wait for the first MoE layer's hand-over returning: against gpu_to_first_layer, how late
the driver's workers saw the same flag), ahead_read_back (the step before's outputs made, where
the beside thread makes them), ahead_sampled, ahead_scheduled, ahead_launched (the next step's
graph launched).
`--defer K,..` runs the request once a k in the same engine (defer_experts k on every CPU experts
layer): a deferred pass runs after its layer's done flag, so it shows in the layer's wait.
Without a whole-step graph (a CPU run, or `decode_graph: layers`) the driver's rows are absent
and the replay phase holds them. Prints medians in microseconds (and, with a whole-step
graph, each MoE layer's median wait and busy time: layers_us); --json writes every step.
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import sys
import threading
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cpu_kernels.simd.clock import cycles_per_us, now_cycles
from hybrid.engine.config import EngineConfig
from hybrid.engine.llm import LLM
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.engine.scheduling.request import Request
from hybrid.ops.experts import set_deferral

WARM_STEPS = 8  # the first steps (prefill, the first decodes) are left out
# a step on the engine's thread without a whole-step graph: (stamp, the phase that ends there)
# in order; a step has the stretches between the stamps it has (one launched ahead has no
# schedule, one whose tokens Ahead decided no head_sampling), which add up to it
EAGER_STEP = (("scheduled", "schedule"), ("load", "to_load"), ("loaded", "forward"),
              ("outputs", "to_outputs"), ("sampled", "head_sampling"), ("delivered", "deliver"))
REPLAYED_STEP = (("scheduled", "schedule"), ("load", "to_load"), ("loaded", "load"),
                 ("replay", "to_replay"), ("replayed", "replay"), ("outputs", "to_outputs"),
                 ("sampled", "head_sampling"), ("delivered", "deliver"))
# a whole-step graph's step on the engine's thread, from its start to its tokens delivered
DRIVEN_STEP = ("to_drive", "gpu_to_first_layer", "cpu_experts", "cpu_waits_between_layers",
               "after_last_layer", "deliver")


class Stamps:
    """Named cycle stamps of the current step; a thread other than the one that made this
    (the beside thread's `Ahead`) marks its names with "ahead_"."""

    def __init__(self) -> None:
        self.now: dict[str, int] = {}
        self._main = threading.get_ident()

    def mark(self, name: str) -> None:
        self.now[name if threading.get_ident() == self._main else "ahead_" + name] = now_cycles()

    def wrap(self, owner, name: str, before: str | None, after: str | None) -> None:
        fn = getattr(owner, name)

        def run(*args, **kwargs):
            if before:
                self.mark(before)
            try:
                return fn(*args, **kwargs)
            finally:
                if after:
                    self.mark(after)
        setattr(owner, name, run)


def instrument(llm: LLM, stamps: Stamps):
    """Wrap the step's parts on their instances -> the whole-step graphs' host driver or None."""
    worker, engine, runner = llm.worker, llm.engine, llm.engine.runner
    stamps.wrap(worker, "_schedule", "schedule", "scheduled")
    stamps.wrap(engine.outputs, "launch", "outputs", "sampled")
    stamps.wrap(engine.outputs, "finish", "read", "read_back")
    stamps.wrap(worker, "_deliver", None, "delivered")
    graphs = runner.graphs
    if graphs is None:  # eager steps: the forward is the "load" phase, the only one
        stamps.wrap(runner, "_run", "load", "loaded")
        return None
    for b in graphs.sizes:
        static, _ = graphs._buckets[b]
        stamps.wrap(static, "load", "load", "loaded")
    if not graphs.whole_step:
        stamps.wrap(graphs.form, "replay", "replay", "replayed")
        return None
    stamps.wrap(graphs.form, "launch", None, "launched")
    stamps.wrap(graphs.form, "started", None, "started")
    stamps.wrap(engine, "execute", "execute", "executed")
    stamps.wrap(runner, "run", "run", "ran")
    stamps.wrap(graphs.form, "drive", "form_drive", None)
    host = graphs.form.host
    stamps.wrap(host, "prepare", None, "prepared")
    stamps.wrap(host, "run", "drive", "driven")
    return host


def region_start(starts, drive: int, per_us: float) -> dict[str, float]:
    """The one-region driver's start in this step, each from the driver's entry: the numba
    call entered (`in_numba`), its first and last worker at the meeting (`first_worker`,
    `last_worker`); empty where no region started this step (the layer loop ran)."""
    if starts[0] < drive:
        return {}
    arrivals = starts[1:][starts[1:] >= starts[0]]
    return {"in_numba": (starts[0] - drive) / per_us,
            "first_worker": (arrivals.min() - drive) / per_us,
            "last_worker": (arrivals.max() - drive) / per_us}


def step_row(s: dict[str, int], host, layer_stamps, per_us: float) -> dict[str, float]:
    def us(a: str, b: str) -> float | None:
        return (s[b] - s[a]) / per_us if a in s and b in s else None

    if host is not None and "drive" in s:
        first_ready, last_done = int(layer_stamps[0, 0]), int(layer_stamps[-1, 1])
        busy = float(((layer_stamps[:, 1] - layer_stamps[:, 0])).sum()) / per_us
        waited = float((layer_stamps[1:, 0] - layer_stamps[:-1, 1]).sum()) / per_us
        row = {"schedule": us("schedule", "scheduled"), "load": us("load", "loaded"),
               "launch": us("loaded", "launched"),
               "read_back": us("read", "read_back"), "to_drive": us("step", "drive"),
               "gpu_to_first_layer": (first_ready - s["drive"]) / per_us,
               "cpu_experts": busy, "cpu_waits_between_layers": waited,
               "after_last_layer": (s["driven"] - last_done) / per_us,
               "head_sampling": us("outputs", "sampled"), "deliver": us("driven", "delivered"),
               "to_execute": us("step", "execute"), "to_run": us("execute", "run"),
               "to_form_drive": us("run", "form_drive"),
               "to_prepared": us("form_drive", "prepared"), "to_driver": us("prepared", "drive"),
               "to_runner_return": us("driven", "ran"), "to_engine_return": us("ran", "executed"),
               "worker_deliver": us("executed", "delivered")}
        row |= region_start(host.starts, s["drive"], per_us)
        row |= {name: us("drive", "ahead_" + stamp) for name, stamp in (
            ("ahead_saw_first_layer", "started"), ("ahead_read_back", "read_back"),
            ("ahead_sampled", "sampled"),
            ("ahead_scheduled", "scheduled"), ("ahead_launched", "launched"))}
    else:  # layer graphs or eager steps: the stretches between the stamps this step has
        stops = REPLAYED_STEP if "replay" in s else EAGER_STEP
        row = {}
        last = "step"
        for stamp, phase in stops:
            if stamp in s:
                row[phase] = us(last, stamp)
                last = stamp
    row["step"] = us("step", "delivered")
    return {k: v for k, v in row.items() if v is not None}


def profiled(llm: LLM, request: Request) -> None:
    """The request's remaining steps under cProfile: the host functions' own and inner time."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    steps = 0
    prof.enable()
    while not request.is_finished:
        llm.worker.step()
        steps += 1
    prof.disable()
    print(f"\ncProfile over {steps} decode steps (times include the profiler's own)")
    stats = pstats.Stats(prof).strip_dirs()
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumtime").print_stats(35)


def probe(llm: LLM, stamps: Stamps, host, args, name: str, cprofile: int) -> dict:
    """One request of --gen-len tokens (plus `cprofile` under cProfile) stamped step by step
    -> {"medians_us", "accounted" (the sum of the phases that make up a step), "tokens",
    "steps", "layers_us" (per MoE layer, the median of its waited and busy: HostExperts.timeline;
    empty without a whole-step graph)}."""
    per_us = cycles_per_us()
    rows: list[dict[str, float]] = []
    prompt = [(7 * i + 3) % 1000 + 10 for i in range(args.prompt_len)]
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, seed=1,
                            max_tokens=args.gen_len + cprofile, ignore_eos=True)
    tokens: list[int] = []
    request = Request(name, prompt, params,
                      lambda event: tokens.append(getattr(event, "token_id", -1)))
    llm.worker.submit(request)
    steps, last_begin = 0, None
    timelines: list[list[tuple[float, float]]] = []  # a step's (waited, busy) a MoE layer
    while not request.is_finished and len(tokens) < args.gen_len:
        stamps.now = {}
        stamps.mark("step")
        begin = stamps.now["step"]
        llm.worker.step()
        steps += 1
        if rows and last_begin is not None:
            rows[-1]["period"] = (begin - last_begin) / per_us
        last_begin = begin
        if steps > WARM_STEPS and "delivered" in stamps.now and not request.is_finished:
            rows.append(step_row(stamps.now, host, host.stamps if host else None, per_us))
            if host is not None and "drive" in stamps.now:
                timelines.append(host.timeline())
    rows = [r for r in rows if "period" in r]
    if cprofile:
        profiled(llm, request)
    while not request.is_finished:  # the rest of its tokens, so the next run starts alone
        llm.worker.step()
    # the loop's own time, from one step's delivery to the next step's start, is in the period
    # only: the step column runs from the step's start to its delivery
    keys = list(dict.fromkeys(k for r in rows for k in r))
    medians = {k: statistics.median(r[k] for r in rows if k in r) for k in keys}
    # with a driver, the engine thread's phases that add up to its step; else every phase
    parts = DRIVEN_STEP if "to_drive" in medians else \
        [k for k in medians if k not in ("step", "period")]
    accounted = sum(medians[k] for k in parts if k in medians)
    # per MoE layer over the steps: where a layer's experts or the GPU's work before it stand
    # out (the first layers run beside the beside thread's work)
    layers = [{"waited": statistics.median(t[i][0] for t in timelines),
               "busy": statistics.median(t[i][1] for t in timelines)}
              for i in range(len(timelines[0]))] if timelines else []
    return {"medians_us": medians, "accounted": accounted, "tokens": tokens, "steps": rows,
            "layers_us": layers}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf-path", default=None, help="default: the demo model")
    ap.add_argument("--optimize-rules", default=None)
    ap.add_argument("--gen-len", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="an EngineConfig field (repeatable)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sample the stream (seeded) at this temperature instead of greedily")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--defer", default="",
                    help="one run a k (comma list, in one engine): defer_experts k on every "
                         "CPU experts layer (ops.experts.set_deferral), the phases side by side")
    ap.add_argument("--json", default=None)
    ap.add_argument("--cprofile", type=int, default=0, metavar="N",
                    help="after the stamped steps, N more under cProfile: the host's functions "
                    "by own time and by time inside")
    args = ap.parse_args()
    fields = {k: ast.literal_eval(v) if v[:1].isdigit() or v in ("True", "False", "None")
              else v for k, v in (s.split("=", 1) for s in args.set)}
    llm = LLM(args.gguf_path, args.optimize_rules, engine_config=EngineConfig(**fields))
    stamps = Stamps()
    host = instrument(llm, stamps)
    ks = [int(k) for k in args.defer.split(",")] if args.defer else [None]
    runs = {}  # a column a run, in order: a k may repeat (drift between runs)
    for i, k in enumerate(ks):
        if k is not None:
            set_deferral(llm.engine.runner.model, k)
        label = "rules" if k is None else f"defer_experts={k}"
        runs[f"{label} (run {i + 1})" if ks.count(k) > 1 else label] = probe(
            llm, stamps, host, args, f"probe{i}", args.cprofile if i == len(ks) - 1 else 0)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"gguf": args.gguf_path, "set": args.set,
             "runs": runs}, indent=1))
    kind = f"temperature {args.temperature}" if args.temperature else "greedy"
    first = next(iter(runs.values()))
    print(f"\n{len(first['steps'])} decode steps a run, medians (us); one stream, {kind}")
    heads = [f"{label}, us" for label in runs]
    print(f"| phase | {' | '.join(heads)} |\n|---|{'---|' * len(heads)}")
    keys = list(dict.fromkeys(key for run in runs.values() for key in run["medians_us"]))
    for key in keys:
        cells = [f"{run['medians_us'][key]:.1f}" if key in run["medians_us"] else ""
                 for run in runs.values()]
        print(f"| {key} | {' | '.join(cells)} |")
    sums = [f"{run['accounted']:.1f}" for run in runs.values()]
    rates = [f"{1e6 / run['medians_us']['period']:.1f}" for run in runs.values()]
    print(f"| (sum of the phases' medians) | {' | '.join(sums)} |")
    print(f"| tok/s from the median period | {' | '.join(rates)} |")
    for label, run in runs.items():
        if run["layers_us"]:
            busy = " ".join(f"{x['busy']:.0f}" for x in run["layers_us"])
            waited = " ".join(f"{x['waited']:.0f}" for x in run["layers_us"])
            print(f"\n{label}, per MoE layer (median us), busy: {busy}; waited: {waited}")
    print(f"\nthis process's threads (OpenMP teams: one a thread that starts parallel kernels): "
          f"{thread_names()}")
    return 0


def thread_names() -> str:
    """The process's threads by name, counted (Linux; else empty)."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return ""
    names = Counter((t / "comm").read_text().strip() for t in tasks.iterdir())
    return ", ".join(f"{name} x{count}" for name, count in names.most_common())


if __name__ == "__main__":
    sys.exit(main())
