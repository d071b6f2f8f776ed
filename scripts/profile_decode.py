"""Where a decode step's time goes with CUDA graphs: the CPU experts, the GPU's pieces, and the
hand-overs between them (GPU machine).

    python scripts/profile_decode.py [--gguf-path P | --preset v2-lite [--layers N]]
        [--optimize-rules R] [--mode fast] [--batch 1] [--steps 64] [--defer 1,2]
        [--json out.json]

Both kinds of decode graphs (EngineConfig.decode_graph: "layers", one graph per stretch
between MoE layers' CPU experts; "step", the whole step in one graph) are captured and timed
in one process. Columns: the two kinds. Rows, per decode step of --batch streams (medians where repeated):
- step: the engine's step (scheduler, graphs, sampling) as bench_e2e.py times it;
- experts: the CPU experts' calls inside it;
- step, experts skipped: the same step with every experts call returning at once: what the
  GPU, the launches and the hand-overs cost on their own;
- device pieces back to back: every captured piece replayed without the host pieces between
  (the GPU's work plus its launch gaps when the GPU is kept busy);
- each kind of piece alone (attention .. router and copies / shared expert / head);
- kernels: the GPU time of each kernel in eager steps (torch.profiler), per step;
- whole steps' timeline: per MoE layer, the CPU's wait for the layer's rows (the GPU's work
  since the last layer's answer) and its CPU experts' time (HostExperts.timeline).
--defer adds whole steps with expert deferral (ops.experts.set_deferral, k per run, on the
same graphs): the step against the undeferred step's CPU experts, which is the CPU's whole work
either way (a deferred expert is read once, one layer late), and the timeline.
The floor: the CPU experts plus the GPU work no MoE layer's experts can run beside (every layer
before the first MoE layer, that layer's attention, the head), timed as the bytes those weights
hold read at the GPU's measured read bandwidth: no kernel or overlap beats it without changing
the math.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_e2e import ExpertClock, build_model, rules_with_mode

from hybrid.engine.config import EngineConfig
from hybrid.engine.graphs import setup as graphs_setup
from hybrid.engine.llm import LLM
from hybrid.engine.runner import warm_up as runner_warm_up
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.ops.experts import set_deferral
from hybrid.tuning.measure import answer_experts_at_once


def start(llm: LLM, batch: int, gen: int) -> list:
    # sampled, not greedy: a random model's greedy stream soon repeats one token. Even so the
    # V2-Lite-shaped file's experts time faster here than its streams decode (docs/serving.md,
    # "Expert deferral"): read the step's experts from decode rates, not from this profile
    reqs = [llm._submit([1000 + 7 * i + j for j in range(32)],
                        SamplingParams(temperature=1.0, seed=i, max_tokens=gen, ignore_eos=True),
                        lambda e: None)
            for i in range(batch)]
    while any(r.num_output_tokens == 0 for r in reqs):
        llm.worker.step()
    return reqs


def time_steps(llm: LLM, steps: int) -> float:
    """Median seconds of one engine step over `steps` decode steps."""
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        llm.worker.step()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def time_graphs(graphs: list, repeats: int) -> float:
    """Median seconds of replaying `graphs` back to back, GPU-timed."""
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for g in graphs:
            g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(times)


def kernel_table(llm: LLM, steps: int) -> list[tuple[str, float, int]]:
    """(kernel, GPU us per step, launches per step) of eager decode steps, largest first."""
    from torch.profiler import ProfilerActivity, profile

    runner = llm.engine.runner
    graphs, runner.graphs = runner.graphs, None
    try:
        llm.worker.step()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                llm.worker.step()
            torch.cuda.synchronize()
    finally:
        runner.graphs = graphs
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)
        if t > 0:
            rows.append((e.key[:70], t / steps, e.count // steps))
    return sorted(rows, key=lambda r: -r[1])


def timeline(llm: LLM, host, steps: int) -> list[list[float]]:
    """Per MoE layer, the medians over `steps` whole steps of (us waited for the layer's
    ready flag since the last layer's done flag: the GPU's work between them and the
    hand-overs; us of its CPU experts), from the driver's cycle stamps (HostExperts.timeline)."""
    lines = []
    for _ in range(steps):
        llm.worker.step()
        lines.append(host.timeline())
    return [[statistics.median(step[i][k] for step in lines) for k in (0, 1)]
            for i in range(len(lines[0]))]


def profile(llm: LLM, graphs, batch: int, steps: int) -> dict:
    runner = llm.engine.runner
    runner.graphs = graphs
    time_steps(llm, 8)
    clock = ExpertClock()
    r: dict = {"step_us": time_steps(llm, steps) * 1e6}
    r["experts_us"] = clock.seconds / steps * 1e6
    r.update({f"experts_{k}": v for k, v in clock.medians_us().items()})
    clock.close()
    undo = answer_experts_at_once(llm)  # on the graphs runner.graphs holds now
    try:
        r["step_no_experts_us"] = time_steps(llm, steps) * 1e6
    finally:
        undo()
    if graphs.whole_step:
        r["timeline_us"] = timeline(llm, graphs.form.host, steps)
        return r
    device = [g for g in graphs.captured(batch) if g is not None]
    r["device_chain_us"] = time_graphs(device, steps) * 1e6
    pieces = [time_graphs([g], steps) * 1e6 for g in device]
    # device pieces: [embed .. router], then per MoE layer [shared], [receive .. router],
    # the last one ending in the head
    r["first_piece_us"], r["head_piece_us"] = pieces[0], pieces[-1]
    r["shared_piece_us"] = statistics.median(pieces[1::2]) if len(pieces) > 1 else 0.0
    r["layer_piece_us"] = statistics.median(pieces[2:-1:2]) if len(pieces) > 3 else 0.0
    return r


def unhidden_bytes(path: str) -> tuple[int, int]:
    """(first piece, head): bytes of the weights a step reads on the GPU before its first MoE
    layer's CPU experts can start (every layer before it and its attention; the embedding's
    one row is left out), and after its last one's are back (the output norm and head). A
    lower bound: the first MoE layer's router is left out too."""
    from hybrid.model.loader import open_model

    gguf, spec = open_model(path)  # headers only; a split set's every file
    first = head = 0
    for name, (info, _) in gguf.tensor_infos.items():
        parts = name.split(".")
        if parts[0] == "blk" and (int(parts[1]) < spec.first_k_dense or (
                int(parts[1]) == spec.first_k_dense and parts[2].startswith("attn"))):
            first += info.nbytes
        elif name in ("output.weight", "output_norm.weight"):
            head += info.nbytes
    return first, head


def read_bandwidth(gib: int = 2, repeats: int = 9) -> float:
    """The GPU's read bandwidth in bytes/s: the median of summing `gib` GiB, GPU-timed."""
    x = torch.ones(gib << 29, dtype=torch.bfloat16, device="cuda")  # [gib GiB / 2]
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        x.sum()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    del x
    return (gib << 30) / statistics.median(times[1:])


def floor_row(path: str, r: dict) -> dict:
    """The step's floor against its CPU experts' own time (see the module's docstring): the
    whole steps' timeline's busy sum where there is one (the experts' call also holds the
    CPU's waits for each layer's rows), else the call."""
    first, head = unhidden_bytes(path)
    bw = read_bandwidth()
    line = r["step"].get("timeline_us")
    experts = sum(busy for _, busy in line) if line else r["step"]["experts_us"]
    floor = experts + (first + head) / bw * 1e6
    return {"first_bytes": first, "head_bytes": head, "read_gbps": bw / 1e9,
            "first_floor_us": first / bw * 1e6, "head_floor_us": head / bw * 1e6,
            "experts_us": experts, "floor_us": floor, "floor_ratio": floor / experts}


def deferral_rows(llm: LLM, ks: list[int], steps: int) -> list[dict]:
    """Whole-step graphs with each k of `ks` (0 first, for the rows' common reference), on
    one capture: the step, and the per-layer timeline (its `busy` leaves out the deferred
    experts, which run after the layer's done flag)."""
    runner = llm.engine.runner
    graphs = graphs_setup.capture(runner, "step")
    runner.graphs = graphs
    rows = []
    for k in ks:
        set_deferral(runner.model, k)
        time_steps(llm, 8)
        clock = ExpertClock()
        step_us = time_steps(llm, steps) * 1e6
        experts_us = clock.seconds / steps * 1e6
        clock.close()
        line = timeline(llm, graphs.form.host, steps)
        rows.append({"k": k, "step_us": step_us, "experts_us": experts_us,
                     "waited_us": sum(w for w, _ in line[1:]),
                     "busy_us": sum(b for _, b in line), "timeline_us": line})
    set_deferral(runner.model, 0)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf-path")
    ap.add_argument("--preset", default="v2-lite")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--optimize-rules", default="DeepSeek-V2-Lite")
    ap.add_argument("--mode", choices=["fast", "exact"], default="fast")
    ap.add_argument("--activations", choices=["int16", "int8", "fp32"], default=None,
                    help="x of the GPU's one-token Q4_K products (default: the rules')")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--defer", default="",
                    help="comma-separated k: whole steps with expert deferral (issue 39)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ks = [int(k) for k in args.defer.split(",") if k.strip()]
    path = args.gguf_path or build_model(args.preset, Path(tempfile.mkdtemp()), args.layers)
    # every timed step decodes: 3-4 timings of `steps` a kind and per k, 8 warm-up steps each
    gen = (9 + 3 * len(ks)) * (args.steps + 8) + 100
    config = EngineConfig(max_batch_size=max(args.batch, 1), chunk_size=256, prefix_cache=False,
                          cache_lens=max(args.batch, 1) * (gen + 64), cuda_graphs=False)
    llm = LLM(path, rules_with_mode(args.optimize_rules, args.mode, args.activations), engine_config=config)
    runner = llm.engine.runner
    if not runner.program.can_capture or runner.device.type != "cuda":
        print("no CUDA graphs for this model and rules: nothing to profile")
        return 1
    runner_warm_up.warm_up(runner)
    r: dict = {"model": Path(path).name, "batch": args.batch,
               "moe_layers": len(runner.program.moe_layers)}
    start(llm, args.batch, gen)
    for kind in ("layers", "step"):
        r[kind] = profile(llm, graphs_setup.capture(runner, kind), args.batch,
                          args.steps)
    if ks and "timeline_us" in r["step"]:  # whole steps driven in one call
        r["deferral"] = deferral_rows(llm, [0] + [k for k in ks if k], args.steps)
    r["kernels"] = kernel_table(llm, 8)
    r["floor"] = floor_row(path, r)
    print(json.dumps({k: v for k, v in r.items() if k != "kernels"}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1))
    print_table(r)
    return 0


def print_table(r: dict) -> None:
    moe = max(r["moe_layers"], 1)
    print(f"\n{r['model']}, batch {r['batch']}, {moe} MoE layers; us per step (per MoE layer)")
    print("| part | decode_graph=layers | decode_graph=step |")
    print("|---|---|---|")

    def cell(kind: str, v: float | None) -> str:
        return "" if v is None else f"{v:.0f} ({v / moe:.1f})"

    def row(name: str, get) -> None:
        print(f"| {name} | {cell('layers', get(r['layers']))} | {cell('step', get(r['step']))} |")
    row("step", lambda d: d["step_us"])
    row("experts (kernels)", lambda d: d["experts_us"])
    row("step - experts", lambda d: d["step_us"] - d["experts_us"])
    row("step, experts skipped", lambda d: d["step_no_experts_us"])
    row("device pieces back to back", lambda d: d.get("device_chain_us"))
    row("hand-overs (skipped - back to back)",
        lambda d: d["step_no_experts_us"] - d["device_chain_us"] if "device_chain_us" in d
        else None)
    lay = r["layers"]
    print(f"pieces alone (us): attention .. router {lay['layer_piece_us']:.1f}, shared expert "
          f"{lay['shared_piece_us']:.1f}, first {lay['first_piece_us']:.0f}, last (head) "
          f"{lay['head_piece_us']:.0f}")
    print(f"experts call / kernel us (layers): {lay.get('experts_call_us', 0):.0f} / "
          f"{lay.get('experts_kernel_us', 0):.0f}; kernel (step): "
          f"{r['step'].get('experts_kernel_us', 0):.0f}")
    tl = r["step"].get("timeline_us")
    if tl:
        print("\nwhole steps, per MoE layer (medians, us): the CPU waiting for the layer's rows "
              "(the GPU between two layers, hand-overs included), then its CPU experts")
        print("| MoE layer | waited | CPU experts |\n|---|---|---|")
        for i, (waited, busy) in enumerate(tl):
            print(f"| {i} | {waited:.1f} | {busy:.1f} |")
        print(f"| all | {sum(w for w, _ in tl):.0f} | {sum(b for _, b in tl):.0f} |")
    if r.get("deferral"):
        print_deferral(r["deferral"], moe)
    f = r["floor"]
    print(f"\nfloor: CPU experts {f['experts_us']:.0f} us + the first piece's "
          f"{f['first_bytes'] / 1e6:.0f} MB ({f['first_floor_us']:.0f} us; measured "
          f"{lay['first_piece_us']:.0f}) + the head's {f['head_bytes'] / 1e6:.0f} MB "
          f"({f['head_floor_us']:.0f} us; measured {lay['head_piece_us']:.0f}) at the GPU's "
          f"{f['read_gbps']:.0f} GB/s read = {f['floor_us']:.0f} us, {f['floor_ratio']:.3f}x "
          "the experts")
    print("\n| kernel (eager steps) | us per step | launches |")
    print("|---|---|---|")
    for name, us, n in r["kernels"][:18]:
        print(f"| {name} | {us:.0f} | {n} |")


def print_deferral(rows: list[dict], moe: int) -> None:
    base = rows[0]["experts_us"]  # k = 0: the CPU experts' whole work a step
    print("\nwhole steps with expert deferral, us per step; the CPU's work is k=0's experts "
          f"({base:.0f})")
    print("| k | step | step / CPU work | CPU waited for the GPU (MoE layers 1..) | "
          "CPU experts before done |\n|---|---|---|---|---|")
    for d in rows:
        print(f"| {d['k']} | {d['step_us']:.0f} ({d['step_us'] / moe:.1f}) | "
              f"{d['step_us'] / base:.3f} | {d['waited_us']:.0f} | {d['busy_us']:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
