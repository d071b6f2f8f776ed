"""Where one stream's decode step goes on the critical path, phase by phase, as the engine runs
it with its defaults (the loop `hybrid serve` runs on its main thread, without HTTP).

    python scripts/probe_decode_host.py [--gguf-path P] [--optimize-rules R] [--gen-len 256]
        [--set NAME=VALUE] [--defer K,..] [--json FILE]

One greedy request (or, given --temperature and --top-p, a seeded sampled one) decodes
--gen-len tokens; every step after the first few is stamped on the CPU's time-stamp counter
(cpu_kernels.simd.clock, the clock the CPU experts' driver stamps its layers with), so the
phases below add up to the step:
- schedule: the worker's lock and the scheduler;
- load: the step's rows packed and fetched into the graph's buffers (StaticStep.load);
- launch: graph.replay() returning;
- GPU to the first MoE layer: from the launch to the CPU seeing the first layer's rows (the
  embedding, the dense layers, the first attention and router, and the hand-over);
- CPU experts: the layers' kernels (sum of `busy`); CPU waits between layers: the GPU's work
  from one layer's answer to the next layer's rows (sum of `waited`);
- after the last layer: from its answer to the driver returning;
- head and sampling: from the driver's return to the picks launched (the final norm and
  lm_head, the draw);
- read back, deliver: the tokens to the host, detokenized, to their sinks, retired (with
  overlapped decode the step before's tokens are read back inside "launch" instead, while the
  GPU runs to the first MoE layer, and this phase only delivers them);
- period: from one step's start to the next one's (the rate a stream sees). Where the engine
  schedules and launches a step during the one before (greedy decodes on a whole-step graph),
  its schedule and load phases happen there: such steps have a period only.
`--defer K,..` runs the request once a k in the same engine (defer_experts k on every CPU experts
layer): a deferred pass runs after its layer's done flag, so it shows in the layer's wait.
Without a whole-step graph (a CPU run, or `decode_graph: layers`) the driver's rows are absent
and the replay phase holds them. Prints medians in microseconds; --json writes every step.
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cpu_kernels.simd.clock import cycles_per_us, now_cycles
from hybrid.engine.config import EngineConfig
from hybrid.engine.llm import LLM
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.engine.scheduling.request import Request
from hybrid.ops.experts import set_deferral

WARM_STEPS = 8  # the first steps (prefill, the first decodes) are left out


class Stamps:
    """Named cycle stamps of the current step, and the steps so far."""

    def __init__(self) -> None:
        self.now: dict[str, int] = {}
        self.steps: list[dict[str, int]] = []

    def mark(self, name: str) -> None:
        self.now[name] = now_cycles()

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
    stamps.wrap(worker, "_schedule", "step", "scheduled")
    stamps.wrap(engine.outputs, "launch", "outputs", "sampled")
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
    host = graphs.form.host
    stamps.wrap(host, "run", "launched", "driven")
    return host


def step_row(s: dict[str, int], host, layer_stamps, per_us: float) -> dict[str, float]:
    def us(a: str, b: str) -> float:
        return (s[b] - s[a]) / per_us
    row = {"schedule": us("step", "scheduled"), "to_load": us("scheduled", "load"),
           "load": us("load", "loaded")}
    if host is not None:
        first_ready, last_done = int(layer_stamps[0, 0]), int(layer_stamps[-1, 1])
        busy = float(((layer_stamps[:, 1] - layer_stamps[:, 0])).sum()) / per_us
        waited = float((layer_stamps[1:, 0] - layer_stamps[:-1, 1]).sum()) / per_us
        row |= {"launch": us("loaded", "launched"),
                "gpu_to_first_layer": (first_ready - s["launched"]) / per_us,
                "cpu_experts": busy, "cpu_waits_between_layers": waited,
                "after_last_layer": (s["driven"] - last_done) / per_us,
                "to_outputs": us("driven", "outputs")}
    elif "replay" in s:
        row |= {"to_replay": us("loaded", "replay"), "replay": us("replay", "replayed"),
                "to_outputs": us("replayed", "outputs")}
    else:  # eager: "load" was the whole forward
        row["forward"] = row.pop("load")
        row |= {"to_outputs": us("loaded", "outputs")}
    row |= {"head_sampling": us("outputs", "sampled"),
            "read_back_deliver": us("sampled", "delivered"), "step": us("step", "delivered")}
    return row


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
    -> {"medians_us", "accounted" (their sum less step and period), "tokens", "steps"}."""
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
    while not request.is_finished and len(tokens) < args.gen_len:
        stamps.now = {}
        begin = now_cycles()
        llm.worker.step()
        steps += 1
        if rows and last_begin is not None:
            rows[-1]["period"] = (begin - last_begin) / per_us
        last_begin = begin
        if steps > WARM_STEPS and "sampled" in stamps.now and not request.is_finished:
            try:
                rows.append(step_row(stamps.now, host, host.stamps if host else None, per_us))
            except KeyError:  # scheduled and launched ahead, during the step before
                rows.append({})
    rows = [r for r in rows if "period" in r]
    if cprofile:
        profiled(llm, request)
    while not request.is_finished:  # the rest of its tokens, so the next run starts alone
        llm.worker.step()
    # the loop's own time: from one step's delivery to the next step's start is not stamped
    # above; the step column is schedule-to-delivery
    keys = list(dict.fromkeys(k for r in rows for k in r))
    medians = {k: statistics.median(r[k] for r in rows if k in r) for k in keys}
    accounted = sum(v for k, v in medians.items() if k not in ("step", "period"))
    return {"medians_us": medians, "accounted": accounted, "tokens": tokens, "steps": rows}


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
    return 0


if __name__ == "__main__":
    sys.exit(main())
