"""`hybrid tune`: a rule file whose GPU holds the experts a routing profile uses most.

1. Plan the base rule file (headers only) and ask `rules explain` what the GPU has left for
   the budget after the fixed parts, the KV cache for `cache_lens` tokens and the reserve.
2. Fill it with the experts of highest step probability (planner.py) and write the rule file.
3. Report the hit rate (the share of expert choices the GPU serves) and the CPU bytes read per
   decode step, beside the same bytes spent on whole layers (llama.cpp's `--n-cpu-moe`).
4. `measure`: decode with no hot experts, with the full budget, and with whole layers in half
   the budget fits the time model (predict.py), its fixed part measured: the full budget's
   step with its CPU experts answered at once, on the same engine; then a few budgets in
   between and the whole-layer placement are predicted and measured side by side; the CPU
   thread counts (decode) and chunk sizes (prefill of one long prompt) are swept on the tuned
   rules.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from hybrid.errors import HybridError
from hybrid.rules.devices import parse_device
from hybrid.tuning.planner import (
    expert_bytes,
    free_gpu_bytes,
    hit_rate,
    hot_experts,
    spread_hot_experts,
    whole_layers,
)
from hybrid.tuning.predict import DecodeModel, cpu_bytes_per_step, cpu_layers_per_step
from hybrid.tuning.profile import RoutingProfile
from hybrid.tuning.results import Placement, TuneOptions, TuneResult, variants_folder
from hybrid.tuning.rules_writer import hot_expert_rules, whole_layer_rules, write_rules


def tune(opts: TuneOptions, status: Callable[[str], None] = lambda s: None) -> TuneResult:
    from hybrid.rules.explain import explain
    from hybrid.rules.planner import plan_model

    base = opts.base_rules
    if base is None:  # tuning is for a GPU server, also when it runs on a laptop
        from hybrid.rules.planner import family_gpu_rules_name, open_model

        base = family_gpu_rules_name(open_model(opts.gguf_path)[1])
    if opts.repeats < 1:
        raise HybridError(f"--repeats must be at least 1, got {opts.repeats}")
    planned = plan_model(opts.gguf_path, base, check_devices=False, announce=False)
    spec, plan = planned.spec, planned.plan
    profile = RoutingProfile.load(opts.profile)
    _check_profile(profile, spec, opts.profile)
    sizes = expert_bytes(plan, spec.num_experts)
    if not sizes.cpu_layers:
        raise HybridError(f"{planned.rules_path.name} runs no routed experts on the CPU: "
                          "nothing to tune (start from a rule file with CPU experts)")
    if isinstance(opts.gpu_memory, dict):
        return _tune_over_gpus(opts, planned, profile, sizes, status)
    device = parse_device(opts.gpu_device)
    exp = explain(plan, spec, opts.cache_lens, opts.gpu_memory, None)
    free = free_gpu_bytes(exp, device)
    freq = profile.frequencies(opts.phase)
    layers = profile.layers
    hot = hot_experts(freq, layers, sizes, free, opts.batch)
    if not any(hot.values()):  # before minutes of --measure that would end in the same place
        smallest = min(sizes.per_layer.values())
        raise HybridError(
            f"--gpu-memory {opts.gpu_memory / 2**30:.2f} GiB leaves {free / 2**20:.0f} MiB on "
            f"{device} after the base rules' weights, KV cache and reserve: not one expert "
            f"({smallest / 2**20:.1f} MiB) fits; raise --gpu-memory or lower --cache-lens "
            f"(hybrid rules explain shows the budget)")

    def candidate(name: str, on_gpu: dict[int, list[int]]) -> Placement:
        return _candidate(name, on_gpu, freq, layers, sizes, opts.batch, spec.num_experts)

    note = (f"hybrid tune: {profile.model}'s experts most used ({opts.phase} tokens, batch "
            f"{opts.batch}) on {device}, {sum(map(len, hot.values()))} experts in "
            f"{len(hot)} layers,\n{free / 2**30:.2f} GiB free of --gpu-memory "
            f"{opts.gpu_memory / 2**30:.2f} GiB at --cache-lens {opts.cache_lens}")
    rules_path = write_rules(planned.rules_path, hot_expert_rules(plan, hot, device), opts.out,
                             note)
    read_gbs = _read_gbs(opts, status)
    result = TuneResult(rules_path, free, layers, freq, hot, sizes, read_gbs)
    budgets = sorted({0.0, *opts.fractions, 1.0})
    # the other placements' rule files, each one `hybrid serve --optimize-rules` takes as is
    work = variants_folder(opts.out)
    for f in budgets:
        on_gpu = hot if f == 1.0 else hot_experts(freq, layers, sizes, int(free * f), opts.batch)
        c = candidate(f"hot experts {f:.0%} of free", on_gpu)
        c.rules = rules_path if f == 1.0 else write_rules(
            planned.rules_path, hot_expert_rules(plan, on_gpu, device),
            work / f"hot-{int(f * 100)}.yaml", f"hybrid tune: {f:.0%} of the free GPU memory")
        result.placements.append(c)

    def whole_layer_placement(name: str, chosen: list[int], file: str, note: str) -> Placement:
        c = candidate(name, {layer: list(range(spec.num_experts)) for layer in chosen})
        c.rules = write_rules(planned.rules_path,
                              whole_layer_rules(plan, chosen, spec.num_experts, device),
                              work / file, note)
        return c

    whole = whole_layers(layers, sizes, free, spec.num_experts)
    result.placements.append(whole_layer_placement(
        f"whole layers ({len(whole)})", whole, "whole-layers.yaml",
        "hybrid tune: whole layers on the GPU (llama.cpp's --n-cpu-moe), the same budget"))
    half = whole_layers(layers, sizes, free // 2, spec.num_experts)
    if opts.measure and 0 < len(half) < len(whole):
        # a third calibration decode, a layer count apart from the other two: it fits the
        # per-layer cost; the candidates (whole layers in the full budget too) stay predictions
        c = whole_layer_placement(f"whole layers ({len(half)}), fit", half,
                                  "whole-layers-half.yaml",
                                  "hybrid tune: whole layers in half the budget (calibration)")
        c.calibration = True
        result.placements.append(c)
    if opts.measure:
        _measure(opts, result, status)
    return result


def _candidate(name: str, on_gpu: dict[int, list[int]], freq, layers: tuple[int, ...],
               sizes, batch: int, num_experts: int) -> Placement:
    """A placement of `on_gpu` (layer -> expert ids held on a GPU) and what it predicts."""
    nbytes = sum(sizes.per_layer[layer] * len(ids) for layer, ids in on_gpu.items())
    return Placement(name, nbytes, hit_rate(freq, layers, on_gpu),
                     cpu_bytes_per_step(freq, layers, sizes, on_gpu, batch),
                     cpu_layers_per_step(layers, sizes, on_gpu, num_experts))


def _tune_over_gpus(opts: TuneOptions, planned, profile: RoutingProfile, sizes,
                    status: Callable[[str], None]) -> TuneResult:
    """Several GPUs' budgets: the hot experts spread over what each has left
    (planner.spread_hot_experts), one rule file; compared with no expert held (the base
    rules over the same GPUs), both timed with --measure (the time model, fitted to those two,
    adds no prediction of its own here)."""
    from hybrid.rules.explain import explain, gib

    home = _attention_devices(planned.plan, sizes)
    if len(set(home.values()) & set(opts.gpu_memory)) == 1:  # one GPU's rules: split them
        planned = _split_layers(opts, planned, status)
        sizes = expert_bytes(planned.plan, planned.spec.num_experts)
        home = _attention_devices(planned.plan, sizes)
    spec, plan = planned.spec, planned.plan
    exp = explain(plan, spec, opts.cache_lens, opts.gpu_memory, None)
    free = {d: free_gpu_bytes(exp, d) for d in opts.gpu_memory}
    freq, layers = profile.frequencies(opts.phase), profile.layers
    spread = spread_hot_experts(freq, layers, sizes, free, home, opts.batch)
    hot = {layer: ids for layer, (_, ids) in spread.items()}
    devices = {layer: d for layer, (d, _) in spread.items()}
    held = {d: sum(sizes.per_layer[layer] * len(hot[layer]) for layer in hot
                   if devices[layer] == d) for d in free}
    note = (f"hybrid tune: {profile.model}'s experts most used ({opts.phase} tokens, batch "
            f"{opts.batch}) over {len(free)} GPUs, {sum(map(len, hot.values()))} experts in "
            f"{len(hot)} layers:\n" + "\n".join(
                f"{d}: {gib(held[d])} of experts, {gib(free[d])} free of --gpu-memory "
                f"{gib(opts.gpu_memory[d])}" for d in free)
            + f"\nat --cache-lens {opts.cache_lens}")
    rules = write_rules(planned.rules_path, hot_expert_rules(plan, hot, devices), opts.out,
                        note)
    read_gbs = _read_gbs(opts, status)
    result = TuneResult(rules, sum(free.values()), layers, freq, hot, sizes, read_gbs,
                        devices=devices)
    for name, on_gpu in (("none on the GPUs", {}), (f"hot experts on {len(free)} GPUs", hot)):
        c = _candidate(name, on_gpu, freq, layers, sizes, opts.batch, spec.num_experts)
        c.rules = rules if on_gpu else planned.rules_path  # the layers over the GPUs, no expert
        result.placements.append(c)
    if opts.measure:
        _measure(opts, result, status)
    return result


def _attention_devices(plan, sizes) -> dict[int, str]:
    """MoE layer (with CPU experts) -> the device its attention runs on."""
    home = {}
    for layer in sizes.cpu_layers:
        attention = plan.placements.get(f"model.layers.{layer}.self_attn")
        home[layer] = parse_device(attention.generate_device if attention else "cpu")
    return home


def _split_layers(opts: TuneOptions, planned, status: Callable[[str], None]):
    """The base rules keep every layer on one GPU: their layers split over the budgeted GPUs
    (rules/layer_split.py, the MoE layers evenly), written beside the output -> that plan."""
    from hybrid.rules.layer_split import even_boundaries, write_split
    from hybrid.rules.planner import plan_model

    spec, devices = planned.spec, list(opts.gpu_memory)
    boundaries = even_boundaries(spec.num_layers, spec.first_k_dense, len(devices))
    folder = variants_folder(opts.out)
    folder.mkdir(parents=True, exist_ok=True)
    path = write_split(str(planned.rules_path), boundaries, devices, spec.num_layers, folder)
    status(f"{planned.rules_path.name} runs its layers on one GPU: split over "
           f"{', '.join(devices)} at layer {', '.join(map(str, boundaries))} ({path})")
    return plan_model(opts.gguf_path, str(path), check_devices=False, announce=False)


def _read_gbs(opts: TuneOptions, status: Callable[[str], None]) -> float:
    """The CPU's read bandwidth: --cpu-bandwidth, or measured now."""
    if opts.read_gbs is not None:
        return opts.read_gbs
    from cpu_kernels.runtime.bandwidth import read_bandwidth

    status("measuring the CPU's read bandwidth")
    return read_bandwidth(1 << 30)


def _measure(opts: TuneOptions, result: TuneResult, status: Callable[[str], None]) -> None:
    from hybrid.engine.config import EngineConfig
    from hybrid.tuning.measure import decode_and_fixed_ms, decode_ms, on_fresh_engine, prefill_tok_s

    none, full = result.placements[0], next(p for p in result.placements
                                             if p.rules == result.rules)
    fit = [none, full, *(p for p in result.placements if p.calibration)]
    order = fit + [p for p in result.placements if p not in fit]
    # the time model's fixed part, a sample a round: on the tuned placement (the one nearest the
    # predictions that matter: few CPU bytes), on the engine of its decode
    fixed = []
    for r in range(opts.repeats):  # round by round: a drifting host touches every placement
        for p in order:
            status(f"measuring decode: {p.name}"
                   + (", then with its CPU experts answered at once" if p is full else "")
                   + (f" (round {r + 1} of {opts.repeats})" if opts.repeats > 1 else ""))
            if p is full:
                ms, fixed_ms = decode_and_fixed_ms(opts.gguf_path, str(p.rules), opts.batch,
                                                   opts.steps, device_map=opts.device_map)
                fixed.append(fixed_ms)
            else:
                ms = decode_ms(opts.gguf_path, str(p.rules), opts.batch, opts.steps,
                               device_map=opts.device_map)
            p.samples.append(ms)
    for p in order:
        p.measured_ms = statistics.median(p.samples)
    model = DecodeModel.fit([(p.cpu_bytes, p.cpu_layers, p.measured_ms) for p in fit],
                            fixed_ms=statistics.median(fixed))
    result.model = model
    for p in result.placements:
        p.predicted_ms = model.ms(p.cpu_bytes, p.cpu_layers)
    for t in opts.threads:
        status(f"measuring decode: {t} CPU threads")
        result.threads.append((t, decode_ms(opts.gguf_path, str(result.rules), opts.batch,
                                            opts.steps, cpu_threads=t,
                                            device_map=opts.device_map)))
    for c in opts.chunk_sizes:
        status(f"measuring prefill of {opts.prefill_tokens} tokens: --chunk-size {c}")
        config = EngineConfig(chunk_size=c, prefix_cache=False,
                              cache_lens=max(opts.cache_lens, opts.prefill_tokens + 64))
        result.chunks.append((c, on_fresh_engine(
            opts.gguf_path, str(result.rules), config,
            lambda llm: prefill_tok_s(llm, opts.prefill_tokens), opts.device_map)))


def _check_profile(profile: RoutingProfile, spec, where: str) -> None:
    moe = set(range(spec.first_k_dense, spec.num_layers))
    if profile.num_experts != spec.num_experts or not set(profile.layers) <= moe:
        raise HybridError(f"{where} was recorded on another model ({profile.model}: "
                          f"{profile.num_experts} experts, layers {min(profile.layers)}-"
                          f"{max(profile.layers)}); profile this model first")
    if profile.prefill_tokens + profile.decode_tokens == 0:
        raise HybridError(f"{where} holds no tokens: record some traffic first")
