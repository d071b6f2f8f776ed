"""Which fast-mode CPU expert kernels a plan will run, started compiling in background
processes before its weights load, and the load-time packers of a file's expert types before
the plan is made (cpu_kernels/runtime/precompile.py has the processes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybrid.gguf.reader import GGUFModelFile
from hybrid.model.spec import ModelSpec
from hybrid.ops.experts_build import expert_tensors

if TYPE_CHECKING:
    from cpu_kernels.runtime.precompile import BackgroundCompile, BackgroundPackers
    from hybrid.rules.plan import Plan


def compile_ahead(plan: Plan, gguf: GGUFModelFile, spec: ModelSpec) -> list[BackgroundCompile]:
    """The BackgroundCompile of the plan's fast-mode CPU expert layers with packed layouts, []
    where nothing starts. The engine's pool runs them all on one tile set, every type among
    them (MoEPool.tiles), so one set of kernels serves every layer: the decode step's, and a
    prompt step's on AMX where some layer's types run there (compiled for such a layer). Where
    every MoE layer is such a layer, the decode step's one-call driver over all of them too
    (engine/step/host_experts.py)."""
    from cpu_kernels.amx.amx_bf16_moe import runs_on_amx
    from cpu_kernels.fast.packed import can_pack
    from cpu_kernels.runtime.precompile import BackgroundCompile

    layers: list[tuple[int, int, int]] = []
    moe_layers = 0
    for placement in plan.placements.values():
        if placement.operator != "experts":
            continue
        moe_layers += 1
        if not _fast_on_cpu(placement):
            continue
        names = expert_tensors(spec, f"blk.{placement.path.split('.')[2]}.")
        types = [int(gguf.tensor_infos[n][0].qtype) for n in names]
        if len(types) == 2:  # fused gate_up: gate and up share the type
            types.insert(0, types[0])
        if all(can_pack(t) for t in types):  # others run the blocks (no packed kernels)
            layers.append((types[0], types[1], types[2]))
    if not layers:
        return []
    tiles = tuple(sorted({t for types in layers for t in types}))
    chosen = next((types for types in layers if runs_on_amx(*types)), layers[0])
    job = BackgroundCompile.start(chosen, tiles, len(layers) if len(layers) == moe_layers else 0)
    return [] if job is None else [job]


def packers_ahead(gguf: GGUFModelFile) -> BackgroundPackers | None:
    """The load-time packers of every routed-expert type in the file, started compiling (the
    plan, which says whether fast mode packs them, takes seconds to make: `packs_any` after it
    tells whether to keep them), or None where nothing starts."""
    from cpu_kernels.runtime.precompile import BackgroundPackers

    return BackgroundPackers.start({int(info[0].qtype) for name, info in gguf.tensor_infos.items()
                                    if "_exps." in name})


def packs_any(plan: Plan) -> bool:
    """Whether some MoE layer of the plan runs fast mode on the CPU (its experts are packed)."""
    return any(_fast_on_cpu(p) for p in plan.placements.values())


def _fast_on_cpu(placement) -> bool:
    """A placement of the experts operator in fast mode on the CPU."""
    o = placement.options
    return placement.operator == "experts" and o.get("backend") == "cpu" \
        and o.get("mode") == "fast"
