"""Apply rules to the module tree (on the meta device): which operator and device each module
gets, and how many bytes each weight takes where it lives. No weight is read.

Semantics (docs/optimize-rules.md): modules are visited from the root down; the first rule in
file order whose `match` holds wins. A matched module's unmatched descendants belong to it
(same operator's weights, same devices). `recursive: false` stops the walk: no rule is tried
below that module. A module no rule matches inherits its parent's placement; the root starts
as `default` on the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from hybrid.gguf.quant_types import type_name
from hybrid.gguf.reader import GGUFModelFile
from hybrid.model.spec import ModelSpec
from hybrid.model.tensor_map import gguf_sources
from hybrid.ops.registry import OPERATORS
from hybrid.rules.devices import map_device
from hybrid.rules.schema import Rule, RuleError

_ELEMENT_BYTES = {"bf16": 2, "f16": 2, "f32": 4}


@dataclass(frozen=True)
class Placement:
    path: str  # dotted module path, "" for the root
    class_name: str
    operator: str
    options: dict[str, Any] = field(hash=False)  # resolved kwargs, devices mapped
    rule: Rule | None = None

    @property
    def generate_device(self) -> str:
        return self.options["generate_device"]

    @property
    def prefill_device(self) -> str:
        return self.options["prefill_device"]

    @property
    def weight_format(self) -> str:
        return self.options.get("weight_format", OPERATORS[self.operator].default_weight_format)


@dataclass(frozen=True)
class WeightItem:
    param: str  # transformers parameter name
    owner: str  # path of the placement that owns it
    gguf_tensors: tuple[str, ...]
    types: tuple[str, ...]  # GGUF types of those tensors
    nbytes: int
    device: str
    pinned: bool = False  # a page-locked copy of host-memory GPU experts (their planes)


@dataclass
class Plan:
    placements: dict[str, Placement]
    owners: dict[str, str]  # module path -> owning placement path
    weights: list[WeightItem]
    warnings: list[str]
    source: str

    def placement_of(self, module_path: str) -> Placement:
        return self.placements[self.owners[module_path]]


def build_plan(model: nn.Module, spec: ModelSpec, gguf: GGUFModelFile, rules: list[Rule],
               source: str, device_map: Mapping[str, str] | None = None) -> Plan:
    root = Placement("", type(model).__name__, "default",
                     {"generate_device": "cpu", "prefill_device": "cpu"})
    placements = {"": root}
    owners: dict[str, str] = {}
    used: set[int] = set()  # rules matching a module they could place (first or shadowed)

    def visit(module: nn.Module, path: str, owner: str, try_rules: bool) -> None:
        matching = [r for r in rules if r.matches(path, type(module))] if try_rules else []
        used.update(r.index for r in matching)
        rule = matching[0] if matching else None  # the first matching rule wins
        if rule is not None:
            placements[path] = _place(rule, path, module, device_map, source, spec.num_experts)
            owner = path
        owners[path] = owner
        descend = try_rules and (rule is None or rule.recursive)
        for name, child in module.named_children():
            visit(child, f"{path}.{name}" if path else name, owner, descend)

    visit(model, "", "", True)
    warnings = [f"{source}: {r.label} matches no module of this model ({_describe(r)})"
                for r in rules if r.index not in used]
    apart = {p.rule.index: p for p in placements.values()
             if p.rule is not None and p.prefill_device != p.generate_device}
    warnings += [f"{source}: {p.rule.label}: prefill_device {p.prefill_device} is not "
                 f"generate_device {p.generate_device}: an operator runs prompt chunks where it "
                 f"runs decodes (one copy of its weights), so prefill_device is ignored; a long "
                 f"prompt's CPU experts stream to the GPU by themselves when that is faster "
                 f"(--prefill-experts)" for _, p in sorted(apart.items())]
    weights = _weights(model, spec, gguf, placements, owners)
    return Plan(placements, owners, weights, warnings, source)


def _describe(rule: Rule) -> str:
    parts = []
    if rule.name_regex is not None:
        parts.append(f"name {rule.name_regex!r}")
    if rule.class_names is not None:
        parts.append(f"class {'/'.join(rule.class_names)}")
    return ", ".join(parts)


def _place(rule: Rule, path: str, module: nn.Module, device_map: Mapping[str, str] | None,
           source: str, num_experts: int) -> Placement:
    spec = OPERATORS[rule.operator]
    class_name = type(module).__name__
    if not spec.can_replace(class_name):
        raise RuleError(
            f"{source}:{rule.line}: rule {rule.index}: operator '{rule.operator}' cannot replace "
            f"{path or 'the model'} ({class_name}); it replaces *{'/*'.join(spec.applies_to)} "
            "modules: narrow match.name or add match.class"
        )
    options = spec.resolved(rule.kwargs)
    if options["prefill_device"] is None:  # every operator takes both (registry._devices)
        options["prefill_device"] = options["generate_device"]
    share = options.get("pcie_experts") or 0
    if rule.operator == "experts" and share:
        where = f"{source}:{rule.line}: rule {rule.index}"
        if not 0 < share < 1:
            raise RuleError(f"{where}: pcie_experts is {share}; give a share in (0, 1), or 0")
        if options.get("gpu_experts"):
            raise RuleError(f"{where}: pcie_experts chooses the layer's gpu_experts itself; "
                            f"give one of pcie_experts and gpu_experts")
        if options.get("backend") != "cpu":
            raise RuleError(f"{where}: pcie_experts shares the CPU experts' work with the GPU; "
                            f"it needs backend cpu, not {options.get('backend')}")
        options["gpu_experts"] = pcie_expert_ids(num_experts, share)
        options["gpu_experts_memory"] = "host"
    bad = [e for e in options.get("gpu_experts", []) if e >= num_experts]
    if bad:
        raise RuleError(f"{source}:{rule.line}: rule {rule.index}: gpu_experts lists expert {bad[0]} "
                        f"but the model has {num_experts} experts (0..{num_experts - 1})")
    for key in [k for k in options if k.endswith("_device")]:
        options[key] = map_device(options[key], device_map)
    return Placement(path, class_name, rule.operator, options, rule)


def pcie_expert_ids(num_experts: int, share: float) -> list[int]:
    """`pcie_experts`' ids: round(share * E) of them (at least one), spread evenly over the
    ids (synthetic routing is uniform; a routing profile's choice is `hybrid tune`'s)."""
    count = max(1, round(share * num_experts))
    return sorted({i * num_experts // count for i in range(count)})


def _weights(model: nn.Module, spec: ModelSpec, gguf: GGUFModelFile,
             placements: dict[str, Placement], owners: dict[str, str]) -> list[WeightItem]:
    items = []
    named = list(model.named_parameters(remove_duplicate=False)) + [
        (n, b) for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")]
    for name, tensor in named:
        module_path = name.rpartition(".")[0]
        place = placements[owners[module_path]]
        sources = tuple(s for s in gguf_sources(name, spec) if gguf.has_tensor(s))
        infos = [gguf.tensor_infos[s][0] for s in sources]
        types = tuple(type_name(i.qtype) for i in infos)
        fmt = place.weight_format
        numel = tensor.numel()
        nbytes = sum(i.nbytes for i in infos) if fmt == "gguf" else numel * _ELEMENT_BYTES[fmt]
        if fmt == "gguf" and _held_as_bf16(place, infos):
            nbytes = numel * _ELEMENT_BYTES["bf16"]
        items.extend(_split_experts(name, module_path, place, sources, types, nbytes, spec))
    return items


def _held_as_bf16(place: Placement, infos: list) -> bool:
    """A GPU weight in a type the GPU kernels do not read (the i-quants) is held as bf16
    (ops/weights.py): count what it will take. Routed experts stay on the CPU kernels."""
    from gpu_kernels.qtypes import is_supported

    return (place.operator != "experts" and place.generate_device.startswith("cuda")
            and any(not is_supported(i.qtype) for i in infos))


def _split_experts(name: str, owner_path: str, place: Placement, sources: tuple[str, ...],
                   types: tuple[str, ...], nbytes: int, spec: ModelSpec) -> list[WeightItem]:
    """Routed experts listed in `gpu_experts` live on gpu_device, the rest where the op runs;
    with gpu_experts_memory host the op keeps them all and the held ones are a page-locked copy
    more (`pinned`)."""
    gpu = place.options.get("gpu_experts") or []
    if place.operator != "experts" or not gpu:
        return [WeightItem(name, place.path, sources, types, nbytes, place.generate_device)]
    on_gpu = nbytes * len(set(gpu)) // spec.num_experts
    if place.options.get("gpu_experts_memory") == "host":  # the CPU's copy keeps every expert
        return [WeightItem(name, place.path, sources, types, nbytes, place.generate_device),
                WeightItem(name, place.path, sources, types, on_gpu, "cpu", pinned=True)]
    return [
        WeightItem(name, place.path, sources, types, nbytes - on_gpu, place.generate_device),
        WeightItem(name, place.path, sources, types, on_gpu, place.options["gpu_device"]),
    ]
