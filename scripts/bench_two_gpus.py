"""Two GPUs against one, on the GPU machine with two GPUs (device kind nvidia-h200-x2):

    python scripts/bench_two_gpus.py [--part check|bench|both] [--preset v3] [--layers 6]
        [--skew 0.6] [--share 0.25] [--prompts 24] [--folder DIR] [--json out.json]

check: tiny-v3 with the DeepSeek-V3 rules (exact CPU experts) against the same rules split over
cuda:0 and cuda:1 at layer 2 (hybrid.rules.layer_split): greedy tokens and log-probabilities of
4 concurrent requests, with decode graphs (a graph per stretch on each GPU) and without.

bench: a V3-shaped file (`make-model --preset v3 --layers N --router-skew S`), its routing
profile, then `hybrid tune` for one GPU whose budget holds `share` of the routed experts beside
the fixed parts (`--measure`: decode measured without and with the hot experts, the time model
fitted), and for two GPUs of that budget each over the split rules (layers halved at a MoE
boundary). The two-GPU rules' decode (1 and 8 streams) and prefill (2K, 8K) are measured
beside the one-GPU rules', and their greedy tokens compared. The predicted two-GPU step: its
own fixed part (the step with its CPU experts answered at once, measured on two GPUs) plus the
CPU side the one-GPU time model gives for its CPU bytes, beside the measured step. Where a
step's time goes: each engine's step with the CPU experts answered at once, without graphs,
and its eager step's GPU kernels. Prints a table last.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROMPTS = [[0, 42, 574, 81, 2058, 3, 223, 804, 853, 303, 3427, 223], [0, 9, 99, 999],
           [0, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [0, 3000, 17]]
TWO = ["cuda:0", "cuda:1"]


def greedy(llm, max_tokens: int = 12):
    """-> (token ids, log-probabilities) of PROMPTS on `llm`, and whether decode graphs ran."""
    from hybrid.engine.sampling.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=0, ignore_eos=True)
    out = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)
    runner = llm.engine.runner
    captured = runner.graphs is not None
    print(f"devices {runner.program.devices}, decode graphs {runner.decode_graph}, pieces "
          f"{[str(x.device) for x in runner.program.pieces if x.on_device]}", flush=True)
    return [o.outputs[0].token_ids for o in out], [o.outputs[0].logprobs for o in out], captured


def greedy_on(path: str, rules: str, graphs: bool):
    """greedy() on a fresh engine; graphs of the "layers" form, as two GPUs take."""
    from hybrid.engine.config import EngineConfig
    from hybrid.tuning.measure import on_fresh_engine

    config = EngineConfig(max_batch_size=4, cuda_graphs=graphs, decode_graph="layers",
                          prefix_cache=False, cache_lens=1024)
    return on_fresh_engine(path, rules, config, greedy)


def measure_all(path: str, rules: str, steps: int) -> dict:
    """On one fresh engine: decode ms a step at 1 and 8 streams, prefill tok/s of 2K and 8K
    tokens, and greedy() (its default decode graph form)."""
    from hybrid.engine.config import EngineConfig
    from hybrid.tuning.measure import on_fresh_engine, prefill_tok_s, step_ms

    def run(llm) -> dict:
        r = {f"decode_ms_b{b}": step_ms(llm, b, steps) for b in (1, 8)}
        r.update(breakdown(llm, steps))
        for n in (2048, 8192):
            try:
                r[f"prefill_tok_s_{n}"] = prefill_tok_s(llm, n)
            except Exception as e:  # noqa: BLE001 (a failed prefill keeps the decode rows)
                r[f"prefill_error_{n}"] = f"{type(e).__name__}: {e}"
                r[f"prefill_tok_s_{n}"] = 0.0
                print(f"prefill {n}: {r[f'prefill_error_{n}']}", flush=True)
        r["greedy"] = greedy(llm, 16)
        return r

    config = EngineConfig(max_batch_size=8, prefix_cache=False, cache_lens=9216)
    return on_fresh_engine(path, rules, config, run)


def breakdown(llm, steps: int) -> dict:
    """Where one stream's decode step goes: the step with every CPU experts call answered at
    once (the GPUs, the launches and the hand-overs alone), the step without graphs, and the
    GPU kernels of eager steps (us a step, the largest first)."""
    from profile_decode import kernel_table

    from hybrid.engine.sampling.sampling_params import SamplingParams
    from hybrid.tuning.measure import fixed_step_ms, step_ms

    runner = llm.engine.runner
    r = {"decode_ms_b1_experts_skipped": fixed_step_ms(llm, 1, steps)}
    graphs, runner.graphs = runner.graphs, None
    try:
        r["decode_ms_b1_eager"] = step_ms(llm, 1, steps)
    finally:
        runner.graphs = graphs
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    req = llm._submit([0, 100, 7, 9], params, lambda e: None)
    while req.num_output_tokens < 4:
        llm.worker.step()
    r["kernels_b1"] = [[name, round(us, 1), n] for name, us, n in kernel_table(llm, 8)[:12]]
    req.cancel()
    while llm.engine.has_work:
        llm.worker.step()
    return r


def compare(one, two) -> dict:
    tokens = sum(a == b for a, b in zip(one[0], two[0], strict=True))
    diff = max((abs(x - y) for a, b in zip(one[1], two[1], strict=True)
                for x, y in zip(a, b)), default=0.0)
    return {"equal": tokens, "of": len(one[0]), "max_dlogprob": diff, "graphs": two[2]}


def check(folder: Path) -> dict:
    from hybrid.rules.layer_split import write_split
    from hybrid.rules.planner import with_experts_mode
    from hybrid.synth.make_model import MakeModelOptions, make_model
    from hybrid.synth.presets import get_preset
    from hybrid.synth.vocab import get_vocab

    p = get_preset("tiny-v3")
    (path,) = make_model(MakeModelOptions(p, "q4_k_m"), get_vocab("small", p.vocab_size),
                         folder / "tiny-v3.gguf")
    base = with_experts_mode("DeepSeek-V3", "exact", folder)
    split = write_split(str(base), [2], TWO, p.num_layers, folder)
    rows = {}
    for graphs in (True, False):
        one, two = greedy_on(str(path), str(base), graphs), greedy_on(str(path), str(split), graphs)
        rows["graphs" if graphs else "eager"] = row = compare(one, two)
        print(f"check tiny-v3, {'graphs' if graphs else 'eager'}: {row}", flush=True)
    # hot experts held on each layer's GPU, and on the other GPU for layer 2
    for name, where in (("hot, own GPU", ("cuda:0", "cuda:1", "cuda:1")),
                        ("hot, other GPU", ("cuda:0", "cuda:0", "cuda:1"))):
        hot = with_hot(split, where, folder / f"{name[-9:].replace(' ', '-')}.yaml")
        rows[name] = row = compare(greedy_on(str(path), str(base), True),
                                   greedy_on(str(path), str(hot), True))
        print(f"check tiny-v3, {name}: {row}", flush=True)
    return rows


def with_hot(rules: Path, devices: tuple[str, ...], out: Path) -> Path:
    """`rules` with experts 0-3 of MoE layers 1-3 held on `devices` (one per layer)."""
    import yaml

    hot = [{"match": {"name": rf"^model\.layers\.{layer}\.mlp\.experts$"},
            "replace": {"class": "experts", "kwargs": {
                "generate_device": "cpu", "prefill_device": "cpu", "backend": "cpu",
                "mode": "exact", "gpu_experts": [0, 1, 2, 3], "gpu_device": device}},
            "recursive": False} for layer, device in zip((1, 2, 3), devices, strict=True)]
    out.write_text(yaml.safe_dump(hot + yaml.safe_load(rules.read_text()), sort_keys=False))
    return out


def bench(args, folder: Path) -> dict:
    from hybrid.rules.explain import GPU_RESERVE_BYTES, explain
    from hybrid.rules.layer_split import even_boundaries, write_split
    from hybrid.rules.planner import plan_model, with_experts_mode
    from hybrid.synth.make_model import MakeModelOptions, make_model
    from hybrid.synth.presets import get_preset
    from hybrid.synth.prompts import word_prompts
    from hybrid.synth.vocab import get_vocab
    from hybrid.tuning.planner import expert_bytes
    from hybrid.tuning.report import summary
    from hybrid.tuning.run_profile import profile_on_fresh_engine
    from hybrid.tuning.tune import TuneOptions, tune

    p = get_preset(args.preset, args.layers)
    t = time.perf_counter()
    (path,) = make_model(MakeModelOptions(p, "q4_k_m", router_skew=args.skew),
                         get_vocab("small", p.vocab_size), folder / f"{p.name}-skew.gguf")
    path = str(path)
    print(f"make-model {p.name} --layers {p.num_layers}: {time.perf_counter() - t:.0f} s",
          flush=True)
    base = str(with_experts_mode("DeepSeek-V3", "exact", folder))
    split = str(write_split(base, even_boundaries(p.num_layers, p.first_k_dense, 2), TWO,
                            p.num_layers, folder))
    t = time.perf_counter()
    profile = profile_on_fresh_engine(path, base, word_prompts(args.prompts), 32,
                                      args.cache_lens)
    profile.save(folder / "profile.json")
    print(f"profile: {time.perf_counter() - t:.0f} s", flush=True)

    planned = plan_model(path, base, check_devices=False, announce=False)
    sizes = expert_bytes(planned.plan, p.num_experts)
    fixed = explain(planned.plan, planned.spec, args.cache_lens, 1 << 50, None).devices["cuda:0"]
    share = int(sum(sizes.per_layer.values()) * p.num_experts * args.share)
    budget = fixed.weights + fixed.kv_cache + GPU_RESERVE_BYTES + share
    one = tune(TuneOptions(path, str(folder / "profile.json"), budget, folder / "one.yaml", base,
                           args.cache_lens, fractions=(), measure=True, steps=args.steps,
                           repeats=args.repeats),
               status=lambda s: print(s, flush=True))
    print(summary(one), flush=True)
    two = tune(TuneOptions(path, str(folder / "profile.json"), {d: budget for d in TWO},
                           folder / "two.yaml", split, args.cache_lens),
               status=lambda s: print(s, flush=True))
    print(summary(two), flush=True)
    tuned_one = next(c for c in one.placements if c.rules == one.rules)
    tuned_two = next(c for c in two.placements if c.rules == two.rules)
    # the CPU side of the two-GPU step from the one-GPU model (the CPU's own costs); its
    # fixed part is the two-GPU rules' own, measured below (their graphs are per stretch, and
    # the residual crosses between the GPUs: no one-GPU row holds that)
    cpu_side_ms = one.model.ms(tuned_two.cpu_bytes, tuned_two.cpu_layers) - one.model.fixed_ms

    rows = {"budget_gib": budget / 2**30, "file_gib": Path(path).stat().st_size / 2**30,
            "one": {"hit_rate": tuned_one.hit_rate, "predicted_ms": tuned_one.predicted_ms},
            "two": {"hit_rate": tuned_two.hit_rate, "cpu_side_ms": cpu_side_ms,
                    "predicted_ms_one_gpu_fixed": one.model.fixed_ms + cpu_side_ms}}
    for name, rules in (("one", str(one.rules)), ("two", str(two.rules))):
        t = time.perf_counter()
        rows[name].update(measure_all(path, rules, args.steps))
        print(f"{name}: {time.perf_counter() - t:.0f} s, " + ", ".join(
            f"{k} {v:.4g}" for k, v in rows[name].items() if isinstance(v, float)), flush=True)
    rows["two"]["predicted_ms"] = rows["two"]["decode_ms_b1_experts_skipped"] + cpu_side_ms
    rows["tokens"] = compare(rows["one"].pop("greedy"), rows["two"].pop("greedy"))
    return rows


def table(rows: dict) -> str:
    lines = []
    if "check" in rows:
        lines += ["| tiny-v3, one GPU vs split over two | tokens equal | max dlogprob | graphs |",
                  "|---|---|---|---|"]
        for k, r in rows["check"].items():
            lines.append(f"| {k} | {r['equal']}/{r['of']} | {r['max_dlogprob']:.2e} | "
                         f"{r['graphs']} |")
    if "bench" in rows:
        b = rows["bench"]
        one, two = b["one"], b["two"]
        lines += ["", f"V3-shaped file {b['file_gib']:.1f} GiB, {b['budget_gib']:.2f} GiB a GPU",
                  "| | one GPU | two GPUs | ratio |", "|---|---|---|---|"]
        for key, label in (("hit_rate", "tuned hit rate"), ("decode_ms_b1", "decode ms, 1"),
                           ("decode_ms_b8", "decode ms, 8"),
                           ("decode_ms_b1_experts_skipped", "decode ms, 1, CPU experts skipped"),
                           ("decode_ms_b1_eager", "decode ms, 1, no graphs"),
                           ("prefill_tok_s_2048", "prefill 2K tok/s"),
                           ("prefill_tok_s_8192", "prefill 8K tok/s")):
            if key not in one:
                continue
            lines.append(f"| {label} | {one[key]:.3g} | {two[key]:.3g} | "
                         f"{two[key] / one[key]:.3f} |")
        predicted = one["decode_ms_b1"] / two["predicted_ms"] if two["predicted_ms"] else 0
        measured = one["decode_ms_b1"] / two["decode_ms_b1"]
        lines += [f"decode speed-up at 1 stream: predicted {predicted:.3f}x (two-GPU step "
                  f"{two['predicted_ms']:.2f} ms), measured {measured:.3f}x; "
                  f"measured / predicted {measured / predicted:.3f}" if predicted else "",
                  f"tokens: {b['tokens']}"]
        for name in ("one", "two"):
            lines += ["", f"| GPU kernels, {name}, eager step of 1 stream | us | launches |",
                      "|---|---|---|"]
            lines += [f"| {k} | {us} | {n} |" for k, us, n in b[name].get("kernels_b1", [])]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["check", "bench", "both"], default="both")
    ap.add_argument("--preset", default="v3")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--skew", type=float, default=0.6)
    ap.add_argument("--share", type=float, default=0.25,
                    help="the routed experts' share one GPU's budget holds")
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=1,
                    help="rounds of the one-GPU decodes the time model is fitted to (medians)")
    ap.add_argument("--cache-lens", type=int, default=4096)
    ap.add_argument("--folder", default="/tmp/two-gpus")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = {}
    if args.part in ("check", "both"):
        rows["check"] = check(folder)
    if args.part in ("bench", "both"):
        rows["bench"] = bench(args, folder)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2, default=str))
    print(table(rows))
    ok = all(r["equal"] == r["of"] for r in rows.get("check", {}).values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
