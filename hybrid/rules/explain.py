"""`hybrid rules explain`: what a rule file does to a model, and whether it fits, from headers only.

Per device: weights (in the format each operator keeps them), the latent KV cache for
`cache_lens` tokens on the devices that run attention, and on each GPU a stated reserve for
activations, CUDA graphs and the CUDA context. The verdict compares each GPU with its budget and
the CPU side with the machine's RAM.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hybrid.errors import HybridError
from hybrid.model import v4_cache
from hybrid.model.kv_budget import DEFAULT_CACHE_LENS, DEFAULT_MAX_BATCH_SIZE, auto_cache_lens
from hybrid.model.spec import ModelSpec
from hybrid.model.spec_v4 import V4Spec
from hybrid.rules.devices import parse_device
from hybrid.rules.plan import Plan

GPU_RESERVE_BYTES = int(1.5 * 2**30)  # activations at 512-token steps, CUDA graphs, context
_KV_BYTES = {"bf16": 2, "f16": 2, "f32": 4}
V4_FLOAT = 4  # V4 runs transformers' own attention modules, in f32, and their caches
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?)B?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'24GiB', '24GB', '24G', '1.5GiB' or plain bytes -> bytes (GB = 10^9, GiB = 2^30)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise HybridError(f"cannot read the size {text!r}; write e.g. 24GiB or 80GB")
    value, unit, binary = float(m.group(1)), m.group(2).upper(), m.group(3)
    power = "KMGT".find(unit) + 1 if unit else 0
    return int(value * ((1024 if binary or not unit else 1000) ** power))


def parse_budgets(text: str) -> int | dict[str, int]:
    """--gpu-memory: one size for every GPU ('24GiB'), or one per GPU in device order
    ('24GiB,16GiB' -> {'cuda:0': ..., 'cuda:1': ...})."""
    parts = [t.strip() for t in str(text).split(",")]
    if len(parts) == 1:
        return parse_size(parts[0])
    return {f"cuda:{i}": parse_size(t) for i, t in enumerate(parts)}


def gpu_budget(gpu_memory: int | Mapping[str, int], device: str) -> int:
    """`device`'s budget from explain's gpu_memory (one size, or one per GPU)."""
    if not isinstance(gpu_memory, Mapping):
        return gpu_memory
    name = parse_device(device)
    if name not in gpu_memory:
        raise HybridError(f"--gpu-memory gives budgets for {', '.join(gpu_memory)}, not for "
                          f"{device}, which the rules place weights on: give one size per GPU "
                          f"up to it")
    return gpu_memory[name]


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


@dataclass
class Group:
    pattern: str  # module path with layer numbers folded to *
    operator: str
    device: str
    nbytes: int = 0
    modules: set[str] = field(default_factory=set)
    types: Counter = field(default_factory=Counter)


@dataclass
class DeviceTotal:
    weights: int = 0
    kv_cache: int = 0
    reserve: int = 0
    budget: int | None = None
    # a GPU whose prompt steps may stream CPU experts: the chunk the engine would choose
    # (hybrid/model/activations.py) and its activations beyond the reserve's 512-token share
    prefill_chunk: int | None = None
    activations: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.reserve + self.activations

    @property
    def fits(self) -> bool:
        return self.budget is None or self.total <= self.budget


@dataclass
class Explanation:
    groups: list[Group]
    devices: dict[str, DeviceTotal]
    cache_lens: int
    kv_bytes_per_token: dict[str, int]
    warnings: list[str]
    advice: list[str]
    # fast-mode CPU experts: their GGUF blocks' bytes and the packed copy's that replaces them
    # in RAM (and on disk, as the packed cache) at steady state
    packed_from: int = 0
    packed_bytes: int = 0
    # per GPU: the KV cache tokens `hybrid serve` sizes without --cache-lens on this budget
    # (model/kv_budget.py, from what the weights and the reserve leave)
    serve_cache_lens: dict[str, int] = field(default_factory=dict)
    # DeepSeek-V4: kv_cache is one request's window and compressed caches at cache_lens tokens
    # and the most the prefix cache's store holds (`prefix_store`, per device), kv_bytes_per_token
    # what each further token adds (model/v4_cache.py)
    v4: bool = False
    # expert deferral (the experts' defer_experts): k -> the MoE layers that defer k experts
    deferred: dict[int, int] = field(default_factory=dict)
    # GPU experts in host memory (gpu_experts_memory host, pcie_experts): MoE layers, the
    # page-locked copy's bytes, the staging buffer per GPU (counted in its weights)
    host_experts: dict[str, Any] = field(default_factory=dict)
    prefix_store: dict[str, int] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return all(d.fits for d in self.devices.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "fits": self.fits,
            "cache_lens": self.cache_lens,
            "devices": {name: {"weights": d.weights, "kv_cache": d.kv_cache, "reserve": d.reserve,
                               "activations": d.activations, "prefill_chunk": d.prefill_chunk,
                               "total": d.total, "budget": d.budget, "fits": d.fits}
                        for name, d in self.devices.items()},
            "kv_bytes_per_token": self.kv_bytes_per_token, "v4_caches": self.v4,
            "v4_prefix_store": self.prefix_store,
            "serve_cache_lens": self.serve_cache_lens,
            "groups": [{"group": g.pattern, "operator": g.operator, "device": g.device,
                        "modules": len(g.modules), "bytes": g.nbytes, "types": dict(g.types)}
                       for g in self.groups],
            "packed_experts": {"gguf_bytes": self.packed_from, "packed_bytes": self.packed_bytes},
            "deferred_experts": {str(k): n for k, n in self.deferred.items()},
            "host_experts": self.host_experts,
            "warnings": self.warnings,
            "advice": self.advice,
        }


def explain(plan: Plan, spec: ModelSpec, cache_lens: int, gpu_memory: int | Mapping[str, int],
            cpu_memory: int | None, gpu_reserve: int = GPU_RESERVE_BYTES,
            max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> Explanation:
    if cache_lens < 0:
        raise HybridError(f"--cache-lens must be >= 0, got {cache_lens}")
    groups: dict[tuple[str, str, str], Group] = {}
    devices: dict[str, DeviceTotal] = {}
    packed_from = packed_bytes = 0
    for w in plan.weights:
        place = plan.placements[w.owner]
        pattern = re.sub(r"\.\d+(?=\.|$)", ".*", w.owner) or "(model)"
        g = groups.setdefault((pattern, place.operator, w.device),
                              Group(pattern, place.operator, w.device))
        g.nbytes += w.nbytes
        g.modules.add(w.owner)
        g.types.update({t: 1 for t in w.types})
        held = w.nbytes
        packed = _packed_size(place, w)
        if packed is not None:  # RAM holds the packed copy; the GGUF pages are released
            packed_from, packed_bytes, held = packed_from + w.nbytes, packed_bytes + packed, packed
        devices.setdefault(w.device, DeviceTotal()).weights += held
    staging = _host_experts_staging(plan)
    for dev, nbytes in staging.items():  # a fixed allocation beside the weights
        devices.setdefault(dev, DeviceTotal()).weights += nbytes
    attention: dict[str, list] = {}  # device -> its attention placements
    for place in plan.placements.values():
        if place.class_name.endswith("Attention"):
            attention.setdefault(place.generate_device, []).append(place)
    kv_per_token: dict[str, int] = {}
    store: dict[str, int] = {}  # DeepSeek-V4: device -> the most its prefix store holds
    for dev, places in attention.items():
        if isinstance(spec, V4Spec):  # a window and compressed rows (model/v4_cache.py)
            layers = [int(p.path.split(".")[2]) for p in places]
            kv_per_token[dev] = round(v4_cache.compressed_bytes_per_token(spec, V4_FLOAT, layers))
            kv = v4_cache.request_bytes(spec, cache_lens, V4_FLOAT, layers)
            store[dev] = v4_cache.store_bytes(spec, cache_lens,
                                              v4_cache.store_entries(max_batch_size), V4_FLOAT,
                                              layers)
            kv += store[dev]
        else:
            kv_per_token[dev] = sum(_kv_bytes_per_layer(p, spec) for p in places)
            kv = kv_per_token[dev] * cache_lens
        devices.setdefault(dev, DeviceTotal()).kv_cache = kv
    for name, d in devices.items():
        if name == "cpu":
            d.budget = cpu_memory
        else:
            d.reserve, d.budget = gpu_reserve, gpu_budget(gpu_memory, name)
    served = not isinstance(spec, V4Spec)  # what the engine would choose, where it serves
    if served:
        _count_prefill_activations(plan, spec, cache_lens, devices)
    ordered = sorted(groups.values(), key=lambda g: (g.device, -g.nbytes))
    serve = {dev: auto_cache_lens(spec.context_length, per_token,
                                  max(0, devices[dev].budget - devices[dev].weights
                                      - gpu_reserve), 64)
             for dev, per_token in kv_per_token.items()
             if dev != "cpu" and devices[dev].budget and served}
    exp = Explanation(ordered, dict(sorted(devices.items())), cache_lens, kv_per_token,
                      list(plan.warnings), [], packed_from, packed_bytes, serve, not served,
                      prefix_store=store)
    pinned = [w for w in plan.weights if w.pinned]
    if pinned:
        exp.host_experts = {"layers": len({w.owner for w in pinned}),
                            "pinned_bytes": sum(w.nbytes for w in pinned),
                            "staging_bytes": dict(staging)}
    experts = {int(path.split(".")[2]): place for path, place in plan.placements.items()
               if place.operator == "experts" and place.options.get("backend") == "cpu"}
    for layer, place in experts.items():  # the last CPU one defers nothing (deferral.py)
        k = place.options.get("defer_experts", 0)
        if k and layer != max(experts):
            exp.deferred[k] = exp.deferred.get(k, 0) + 1
    exp.advice = _advice(exp)
    if isinstance(gpu_memory, Mapping):  # budgets for GPUs the rules leave empty
        idle = [d for d in map(parse_device, gpu_memory) if d not in devices]
        if idle:
            exp.advice.append(f"{', '.join(idle)} has a budget but the rules place nothing "
                              f"there: `hybrid tune --gpu-memory` with these budgets splits a "
                              f"one-GPU rule file's layers over the GPUs (rules/layer_split.py)")
    return exp


def _count_prefill_activations(plan: Plan, spec: ModelSpec, cache_lens: int,
                               devices: dict[str, DeviceTotal]) -> None:
    """Where attention runs on a GPU and routed experts on the CPU (prompt steps may stream
    them), the engine chooses the prefill chunk from the memory left (model/activations.py):
    the same choice from the budget, its activations counted beyond the reserve's share."""
    from hybrid.model.activations import (
        CPU_CHUNK,
        ModelShapes,
        activation_bytes_per_token,
        choose_chunk_size,
    )

    cpu_experts = any(p.operator == "experts" and p.generate_device == "cpu"
                      for p in plan.placements.values())
    per_token = activation_bytes_per_token(ModelShapes.of(spec))
    for name, d in devices.items():
        if name == "cpu" or not d.kv_cache or not cpu_experts or d.budget is None:
            continue
        free = max(0, d.budget - d.weights - d.kv_cache - d.reserve)
        d.prefill_chunk = choose_chunk_size(True, per_token, free,
                                            min(cache_lens, spec.context_length))
        d.activations = max(0, d.prefill_chunk - CPU_CHUNK) * per_token


def _host_experts_staging(plan) -> dict[str, int]:
    """Per GPU, the staging buffer its host-memory experts share (ops/device_experts.py): the
    largest layer's held planes (about their GGUF bytes)."""
    per_layer: dict[tuple[str, str], int] = {}
    for w in plan.weights:
        if w.pinned:
            key = (w.owner, plan.placements[w.owner].options["gpu_device"])
            per_layer[key] = per_layer.get(key, 0) + w.nbytes
    out: dict[str, int] = {}
    for (_, dev), nbytes in per_layer.items():
        out[dev] = max(out.get(dev, 0), nbytes)
    return out


def _packed_size(place, w) -> int | None:
    """Bytes of fast mode's packed copy of CPU expert weight `w`, or None where the blocks are
    read as stored (exact mode, the GPU, types without a packed layout)."""
    from cpu_kernels.fast.packed import can_pack, packed_ratio
    from cpu_kernels.formats import qtypes as qt

    if place.operator != "experts" or w.device != "cpu" or w.pinned or \
            place.options.get("mode") != "fast":
        return None
    ids = {name: i for i, name in qt.NAMES.items()}
    # gate and up as one parameter have two source tensors: of one type in every real mix
    if len(set(w.types)) != 1 or not can_pack(ids.get(w.types[0], -1)):
        return None
    return int(w.nbytes * packed_ratio(ids[w.types[0]]))


def _kv_bytes_per_layer(place, spec: ModelSpec) -> int:
    """Latent cache (kv_lora + rope per token) for our MLA operator; transformers' own
    attention caches full per-head keys and values. DeepSeek-V3.2's lightning indexer adds its
    key (index_head_dim; 0 without one) per token beside either."""
    if place.operator == "mla_attention":
        width = spec.kv_lora_rank + spec.qk_rope_head_dim + spec.index_head_dim
        return width * _KV_BYTES[place.options["kv_cache_dtype"]]
    return (spec.num_heads * (spec.qk_head_dim + spec.v_head_dim) + spec.index_head_dim) * 4


def _advice(exp: Explanation) -> list[str]:
    out = []
    for name, d in exp.devices.items():
        if d.fits or d.budget is None:
            continue
        over = d.total - d.budget
        largest = [g for g in exp.groups if g.device == name][:3]
        items = ", ".join(f"{g.pattern} ({g.operator}, {gib(g.nbytes)})" for g in largest)
        out.append(f"{name} is over its {gib(d.budget)} budget by {gib(over)}; largest: {items}")
        per_token = exp.kv_bytes_per_token.get(name, 0)
        room = d.budget - d.weights - d.reserve
        if per_token and room > 0 and d.kv_cache > over:
            out.append(f"fits with --cache-lens {room // per_token} (KV cache "
                       f"{per_token} B per token on {name})")
        elif name != "cpu" and largest:
            g = largest[0]
            out.append(f"move {g.pattern} to the CPU: set generate_device and prefill_device of "
                       f"its rule ('{g.operator}') to cpu")
    return out


def render_table(exp: Explanation, header: str) -> str:
    lines = [header, ""]
    lines.append(f"{'group':<44} {'operator':<14} {'device':<7} {'mods':>5} {'weights':>12}  types")
    for g in exp.groups:
        types = ", ".join(f"{t}" for t, _ in g.types.most_common())
        lines.append(f"{g.pattern:<44} {g.operator:<14} {g.device:<7} {len(g.modules):>5} "
                     f"{gib(g.nbytes):>12}  {types}")
    lines.append("")
    lines.append(f"{'device':<8} {'weights':>12} {'kv cache':>12} {'reserve':>12} {'total':>12} "
                 f"{'budget':>12}  verdict")
    for name, d in exp.devices.items():
        budget = gib(d.budget) if d.budget is not None else "-"
        lines.append(f"{name:<8} {gib(d.weights):>12} {gib(d.kv_cache):>12} {gib(d.reserve):>12} "
                     f"{gib(d.total):>12} {budget:>12}  {'fits' if d.fits else 'DOES NOT FIT'}")
    lines.append("")
    for dev, per_token in exp.kv_bytes_per_token.items():
        if exp.v4:
            store = exp.prefix_store.get(dev, 0)
            lines.append(f"KV cache on {dev}: {gib(exp.devices[dev].kv_cache - store)} for one "
                         f"request of {exp.cache_lens:,} tokens: its compressed rows, "
                         f"{per_token:,} bytes per token, beside its sliding windows and the "
                         f"compressors' open windows (f32, as transformers' V4 attention keeps "
                         f"them); and up to {gib(store)} in the prefix cache's store of finished "
                         f"prompts' caches, {exp.cache_lens:,} tokens in all (counted in the "
                         f"total; --no-prefix-cache: none)")
            continue
        lines.append(f"KV cache: {per_token:,} bytes per token on {dev}, {exp.cache_lens:,} tokens")
        if dev in exp.serve_cache_lens:
            lines.append(f"  hybrid serve without --cache-lens: {exp.serve_cache_lens[dev]:,} "
                         f"tokens on this budget (up to the model's context where a third of "
                         f"the memory the weights and the reserve leave holds it; at least "
                         f"{DEFAULT_CACHE_LENS:,})")
    lines.append(f"GPU reserve: {gib(GPU_RESERVE_BYTES)} per GPU for activations at 512 "
                 "prompt tokens a step, CUDA graphs and the CUDA context")
    for name, d in exp.devices.items():
        if d.prefill_chunk is not None:
            lines.append(f"prompt steps on {name}: up to {d.prefill_chunk} tokens (they may "
                         f"stream experts; --chunk-size sets it), {gib(d.activations)} of "
                         f"activations beyond the reserve's (counted above)")
    if exp.packed_bytes:
        lines.append(f"fast-mode CPU experts: a packed copy of {gib(exp.packed_bytes)} "
                     f"({exp.packed_bytes / exp.packed_from:.3f}x their {gib(exp.packed_from)} of "
                     "GGUF blocks) is what RAM holds for them (counted above; the blocks' pages "
                     "are released), and the same bytes on disk as the packed cache "
                     "(--no-packed-cache: none)")
    if exp.host_experts:
        h = exp.host_experts
        lines.append(f"GPU experts in host memory: {h['layers']} MoE layers keep a page-locked "
                     f"copy ({gib(h['pinned_bytes'])}, counted above) of experts that steps of "
                     f"enough rows copy over PCIe as used and compute on the GPU beside the CPU "
                     f"(one staging buffer: " + ", ".join(
                         f"{gib(b)} on {d}" for d, b in h["staging_bytes"].items()) + ")")
    for k, n in sorted(exp.deferred.items()):
        lines.append(f"expert deferral: {n} MoE layers defer the {k} lowest-weighted routed "
                     f"experts of each decoding token to the next MoE layer (the last MoE "
                     f"layer defers none): faster decode of one or a few streams, slower with many, "
                     f"not exact (docs/serving.md)")
    lines.extend(f"warning: {w}" for w in exp.warnings)
    lines.extend(f"advice: {a}" for a in exp.advice)
    lines.append(f"verdict: {'fits' if exp.fits else 'does not fit'}")
    return "\n".join(lines)


def refuse_if_over_budget(plan: Plan, spec: ModelSpec, cache_lens: int,
                          gpu_memory: int | None = None) -> None:
    """Before any weight moves: fail, naming the largest items and a fix, if a GPU would
    overflow; say in one line when the CPU's share exceeds this machine's RAM (it still runs,
    from the memory-mapped file at the disk's speed, as llama.cpp's mmap does).

    `gpu_memory` None reads each GPU's total memory (the smallest, for the shared budget).
    """
    import logging

    import psutil

    # a GPU may hold no weight yet a staging buffer (experts in host memory, CPU rules)
    gpus = {w.device for w in plan.weights if w.device != "cpu"} | \
        {d for d in _host_experts_staging(plan) if d != "cpu"}
    if gpus and gpu_memory is None:
        import torch

        gpu_memory = min(torch.cuda.get_device_properties(int(d.split(":")[1])).total_memory
                         for d in gpus)
    ram = psutil.virtual_memory().total
    exp = explain(plan, spec, cache_lens, gpu_memory or 0, cpu_memory=ram)
    cpu = exp.devices.get("cpu")
    if cpu is not None and not cpu.fits:
        logging.getLogger("hybrid.model").warning(
            "the CPU's share of this plan, %s, is more than this machine's %s of RAM: it "
            "runs from the memory-mapped file at the disk's speed (hybrid rules explain shows "
            "the plan; put more on the GPU or use a smaller quant)", gib(cpu.total), gib(ram))
    if any(not d.fits for name, d in exp.devices.items() if name != "cpu"):
        advice = [a for a in exp.advice if not a.startswith("cpu ")]
        raise HybridError(f"{plan.source}: the plan does not fit: {'; '.join(advice)} "
                          f"(see hybrid rules explain)")
