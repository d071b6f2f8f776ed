"""Turn a plan into a runnable model: swap matched modules for operators, load the rest.

Operators load their own weights from the GGUF onto their devices in their formats. Modules
left to transformers (`default`) get fp32 parameters on their placement's generate_device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from hybrid.model.loader import fill_weights
from hybrid.ops.context import BuildContext
from hybrid.ops.device_experts import ExpertStaging
from hybrid.rules.planner import PlannedModel

if TYPE_CHECKING:
    from cpu_kernels.runtime.precompile import BackgroundPackers
    from hybrid.model.packed_cache import PackedCache


def _builders() -> dict[str, Callable[[BuildContext], nn.Module]]:
    from hybrid.ops.experts import ExpertsOp
    from hybrid.ops.hyper_connection import HyperConnectionOp
    from hybrid.ops.layers import EmbeddingOp, GateOp, GroupedLinearOp, LinearOp, MLPOp, RMSNormOp
    from hybrid.ops.mla_attention import MLAAttentionOp
    from hybrid.ops.rotary import RotaryOp

    return {"embedding": EmbeddingOp, "rmsnorm": RMSNormOp, "rotary": RotaryOp,
            "linear": LinearOp, "grouped_linear": GroupedLinearOp, "lm_head": LinearOp,
            "mlp": MLPOp, "gate": GateOp, "hyper_connection": HyperConnectionOp,
            "experts": ExpertsOp, "mla_attention": MLAAttentionOp}


def inject(planned: PlannedModel, progress: Callable[[int, int], None] | None = None,
           packed_cache: PackedCache | None = None,
           packers: BackgroundPackers | None = None) -> nn.Module:
    """Build every operator of the plan; `progress` hears (bytes done, bytes in all) of the
    weights the plan counts, after each operator (fast mode's packing included); `packers`:
    fast mode's packers compiling in the background, waited for before the first pack."""
    model, plan = planned.model, planned.plan
    builders = _builders()
    ops = [p for p in plan.placements.values() if p.operator != "default"]
    # Outermost first, so a replaced module's own descendants are never visited again.
    ops.sort(key=lambda p: p.path.count("."))
    total = sum(w.nbytes for w in plan.weights)
    done = 0
    staging = ExpertStaging()  # one device buffer for every layer's host-memory GPU experts
    replaced: list[str] = []
    for place in ops:
        if any(place.path.startswith(r + ".") for r in replaced):
            continue
        module = model.get_submodule(place.path)
        ctx = BuildContext(planned.gguf, planned.spec, place.path, place.options, module,
                           packed_cache, packers, staging)
        _set_submodule(model, place.path, builders[place.operator](ctx))
        replaced.append(place.path)
        done += sum(w.nbytes for w in plan.weights
                    if w.owner == place.path or w.owner.startswith(place.path + "."))
        if progress is not None:
            progress(done, total)
    _load_defaults(planned)
    if progress is not None:
        progress(total, total)
    return model.eval()


def _set_submodule(model: nn.Module, path: str, new: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent_path) if parent_path else model, name, new)


def _load_defaults(planned: PlannedModel) -> None:
    """fp32 parameters (and the rotary tables) for modules transformers still runs."""
    plan = planned.plan
    fill_weights(planned.model, planned.gguf, planned.spec, torch.float32,
                 device_of=lambda path: plan.placement_of(path).generate_device)
