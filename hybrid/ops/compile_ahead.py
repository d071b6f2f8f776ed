"""Which fast-mode CPU expert kernels a plan will run, started compiling in background
processes before its weights load (cpu_kernels/runtime/precompile.py has the processes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybrid.gguf.reader import GGUFModelFile
from hybrid.model.spec import ModelSpec
from hybrid.ops.experts import expert_tensors

if TYPE_CHECKING:
    from cpu_kernels.runtime.precompile import BackgroundCompile
    from hybrid.rules.plan import Plan


def compile_ahead(plan: Plan, gguf: GGUFModelFile, spec: ModelSpec) -> list[BackgroundCompile]:
    """One BackgroundCompile per distinct kernel set among the plan's fast-mode CPU expert
    layers: the tile family (i-quant layers run other tiles than K-quant ones) and the step
    sizes whose kernels differ (AMX for some types only); [] where nothing starts."""
    from cpu_kernels.formats.qtypes import IQUANTS
    from cpu_kernels.runtime.precompile import BackgroundCompile, token_counts

    kernel_sets: dict[tuple, tuple[int, int, int]] = {}
    for placement in plan.placements.values():
        o = placement.options
        if placement.operator != "experts" or o.get("backend") != "cpu" or o.get("mode") != "fast":
            continue
        names = expert_tensors(spec, f"blk.{placement.path.split('.')[2]}.")
        types = [int(gguf.tensor_infos[n][0].qtype) for n in names]
        if len(types) == 2:  # fused gate_up: gate and up share the type
            types.insert(0, types[0])
        key = (any(t in IQUANTS for t in types), tuple(token_counts(tuple(types))))
        kernel_sets.setdefault(key, tuple(types))
    started = (BackgroundCompile.start(types) for types in kernel_sets.values())
    return [b for b in started if b is not None]
