"""Rule files that place chosen experts on the GPU: a base rule file with one rule per tuned
layer put in front (the first matching rule wins, docs/optimize-rules.md), so everything else
stays exactly as the base file says, comments included."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hybrid.rules.plan import Plan


def experts_rule(layer: int, kwargs: dict[str, Any]) -> dict[str, Any]:
    return {"match": {"name": f"^model\\.layers\\.{layer}\\.mlp\\.experts$"},
            "replace": {"class": "experts", "kwargs": kwargs}, "recursive": False}


def hot_expert_rules(plan: Plan, hot: dict[int, list[int]],
                     gpu_device: str | Mapping[int, str]) -> list[dict[str, Any]]:
    """Per tuned layer, the base placement of its experts plus `gpu_experts` on gpu_device
    (one for all layers, or layer -> device). The base's `defer_experts` stays: a decode row
    then defers among its experts left on the CPU (cpu_kernels/runtime/deferral.py)."""
    rules = []
    for layer, ids in hot.items():
        base = plan.placements[f"model.layers.{layer}.mlp.experts"].options
        # held in GPU memory: the base's own host-memory experts (pcie_experts) give way
        kwargs = {k: v for k, v in base.items()
                  if k not in ("gpu_experts", "gpu_device", "pcie_experts", "gpu_experts_memory")}
        if not kwargs.get("defer_experts"):  # a plan's options hold every default
            kwargs.pop("defer_experts", None)
        device = gpu_device if isinstance(gpu_device, str) else gpu_device[layer]
        rules.append(experts_rule(layer, {**kwargs, "gpu_experts": list(ids),
                                          "gpu_device": device}))
    return rules


def whole_layer_rules(plan: Plan, layers: list[int], num_experts: int, gpu_device: str
                      ) -> list[dict[str, Any]]:
    """Each listed layer's routed experts all on gpu_device: written as every expert held
    (`gpu_experts`), not as the layer moved whole (`generate_device: cuda`), because a held
    layer stays in the captured decode step while a moved one runs in place and keeps the step
    out of CUDA graphs (slower than no expert on the GPU at all: docs/kernel-tuning.md); the
    GPU runs the same grouped kernels either way."""
    return hot_expert_rules(plan, {layer: list(range(num_experts)) for layer in layers},
                            gpu_device)


def write_rules(base: Path, rules: list[dict[str, Any]], out: Path, note: str) -> Path:
    """`rules` in front of the base file's text; `note` opens the file as comments."""
    head = "".join(f"# {line}\n" for line in note.splitlines())
    body = yaml.safe_dump(rules, sort_keys=False, default_flow_style=None, width=100) \
        if rules else ""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"{head}{body}# --- the base rules, {base.name}:\n{base.read_text()}")
    return out
