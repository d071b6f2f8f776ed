"""Find a rule file, validate it, and plan a model with it (headers only, on the meta device)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from torch import nn

from hybrid.gguf.reader import GGUFModelFile
from hybrid.model.loader import build_meta_model, open_model
from hybrid.model.spec import ModelSpec
from hybrid.model.spec_v4 import V4Spec
from hybrid.rules.devices import check_available
from hybrid.rules.plan import Plan, build_plan
from hybrid.rules.schema import RuleError, load_rules

# DeepSeek-V4 through transformers' modules, the routed experts on the CPU kernels: the linear
# layers on one GPU in the file's blocks, or everything on the CPU
V4_RULES, V4_CPU_RULES = "DeepSeek-V4.yaml", "DeepSeek-V4-cpu.yaml"


def bundled_rules() -> dict[str, Path]:
    folder = resources.files("optimize_rules")
    return {p.name: Path(str(p)) for p in folder.iterdir() if p.name.endswith(".yaml")}


def find_rules(name: str) -> Path:
    """A rule file by path, or a bundled one by name (with or without `.yaml`, in any case:
    `deepseek-v3` is DeepSeek-V3.yaml)."""
    path = Path(name).expanduser()
    if path.is_file():
        return path
    bundled = {key.lower(): value for key, value in bundled_rules().items()}
    for candidate in (name.lower(), f"{name.lower()}.yaml"):
        if candidate in bundled:
            return bundled[candidate]
    bundled = bundled_rules()
    raise RuleError(f"no rule file {name!r}: not a file, and not a bundled rule file "
                    f"({', '.join(sorted(bundled))})")


def default_rules_name(spec: ModelSpec) -> str:
    """The bundled rules for this machine: the 24 GB GPU layout with a GPU, else cpu.yaml
    (DeepSeek-V4's own CPU layout for V4)."""
    import torch

    if not torch.cuda.is_available():
        return cpu_rules_name(spec)
    return family_gpu_rules_name(spec)


def cpu_rules_name(spec: ModelSpec) -> str:
    """The bundled rules that run this model on the CPU alone."""
    return V4_CPU_RULES if isinstance(spec, V4Spec) else "cpu.yaml"


def family_gpu_rules_name(spec: ModelSpec) -> str:
    """The bundled rules for one 24 GB GPU of this model's family, whatever this machine has.

    DeepSeek-V3.2 (an indexer) gets its own file: DeepSeek-V3.yaml names V3's classes, so on a
    V3.2 tree it would match nothing but the names and leave attention and the routed experts
    to `default` (fp32 on the GPU). DeepSeek-V4 has its own too."""
    if isinstance(spec, V4Spec):
        return V4_RULES
    if spec.has_indexer:
        return "DeepSeek-V3.2.yaml"
    return "DeepSeek-V3.yaml" if spec.is_v3 else "DeepSeek-V2-Lite.yaml"


def with_experts_mode(rules: str, mode: str, folder: Path) -> Path:
    """A copy of rule file `rules` (bundled name or path), written into `folder`, whose CPU
    experts rules run in `mode` ("exact" for comparisons with the reference, "fast")."""
    def edit(cls: str, kwargs: dict) -> None:
        if cls == "experts" and kwargs.get("backend", "cpu") == "cpu":
            kwargs["mode"] = mode
    return _rewritten(rules, folder, mode, edit)


def with_deferral(rules: str, k: int, folder: Path) -> Path:
    """A copy of rule file `rules` whose CPU experts rules defer `k` experts of a decoding
    token (the experts' `defer_experts`; 0 removes it)."""
    return _with_cpu_experts_option(rules, "defer_experts", k, folder, f"defer{k}")


def with_gpu_experts(rules: str, ids: list[int], memory: str, folder: Path,
                     device: str = "cuda:0") -> Path:
    """A copy of rule file `rules` whose CPU experts rules hand experts `ids` of every layer
    to `device` (`gpu_experts`, `gpu_device`), their blocks in `memory` (`gpu_experts_memory`:
    device or host); no ids removes the three. The explicit ids replace a `pcie_experts` share
    (the plan refuses both on one rule)."""
    def edit(cls: str, kwargs: dict) -> None:
        if cls == "experts" and kwargs.get("backend", "cpu") == "cpu":
            for key in ("gpu_experts", "gpu_device", "gpu_experts_memory", "pcie_experts"):
                kwargs.pop(key, None)
            if ids:
                kwargs.update(gpu_experts=sorted(set(ids)), gpu_device=device,
                              gpu_experts_memory=memory)
    return _rewritten(rules, folder, f"held{len(ids)}-{memory}", edit)


def with_pcie_experts(rules: str, share: float, folder: Path) -> Path:
    """A copy of rule file `rules` whose CPU experts rules keep `share` of each layer's experts
    in page-locked host memory for the GPU (`pcie_experts`; 0 removes it)."""
    return _with_cpu_experts_option(rules, "pcie_experts", share, folder, f"pcie{share:g}")


def _with_cpu_experts_option(rules: str, key: str, value, folder: Path, suffix: str) -> Path:
    """A copy of `rules` whose CPU experts rules set option `key` to `value` (falsy removes
    it, leaving the operator's default)."""
    def edit(cls: str, kwargs: dict) -> None:
        if cls == "experts" and kwargs.get("backend", "cpu") == "cpu":
            kwargs.pop(key, None)
            if value:
                kwargs[key] = value
    return _rewritten(rules, folder, suffix, edit)


def with_kv_cache_dtype(rules: str, dtype: str, folder: Path) -> Path:
    """A copy of rule file `rules` whose mla_attention rules keep the KV cache in `dtype`
    ("f32" for comparisons with the CPU rules, whose cache is f32)."""
    def edit(cls: str, kwargs: dict) -> None:
        if cls == "mla_attention":
            kwargs["kv_cache_dtype"] = dtype
    return _rewritten(rules, folder, f"kv-{dtype}", edit)


def with_activations(rules: str, activations: str, folder: Path) -> Path:
    """A copy of rule file `rules` whose operators with quantized GPU products take x in
    `activations` (registry.ACTIVATIONS: "int16", "int8", "fp32")."""
    from hybrid.ops.registry import OPERATORS

    takes = {s.name for s in OPERATORS.values() if "activations" in s.options}

    def edit(cls: str, kwargs: dict) -> None:
        if cls in takes:
            kwargs["activations"] = activations
    return _rewritten(rules, folder, activations, edit)


def _rewritten(rules: str, folder: Path, suffix: str, edit) -> Path:
    import yaml

    source = find_rules(rules)
    data = yaml.safe_load(source.read_text())
    for rule in data:
        replace = rule.get("replace", {})
        edit(replace.get("class"), replace.setdefault("kwargs", {}))
    path = Path(folder) / f"{source.stem}-{suffix}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@dataclass
class PlannedModel:
    gguf: GGUFModelFile
    spec: ModelSpec
    model: nn.Module  # transformers' tree on the meta device
    plan: Plan
    rules_path: Path


def plan_model(gguf_path: str, rules: str | None, device_map: Mapping[str, str] | None = None,
               check_devices: bool = True, announce: bool = True,
               opened: tuple[GGUFModelFile, ModelSpec | V4Spec] | None = None) -> PlannedModel:
    """`opened`: open_model(gguf_path) where the caller has it already."""
    gguf, spec = opened or open_model(gguf_path)
    if rules is None:
        rules = default_rules_name(spec)
        if announce:
            print(f"using optimize rules {rules} (the default for this machine)", file=sys.stderr)
    path = find_rules(rules)
    model = build_meta_model(spec)
    plan = build_plan(model, spec, gguf, load_rules(path), str(path), device_map)
    if check_devices:
        cpu_rules = cpu_rules_name(spec)
        for place in plan.placements.values():
            devices = [place.generate_device, place.prefill_device]
            if place.options.get("gpu_experts"):
                devices.append(place.options["gpu_device"])
            for device in devices:
                check_available(device, str(path), cpu_rules)
    if announce:
        for warning in plan.warnings:
            print(f"warning: {warning}", file=sys.stderr)
    return PlannedModel(gguf, spec, model, plan, path)
