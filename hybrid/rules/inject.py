"""Turn a plan into a runnable model: swap matched modules for operators, load the rest.

Operators load their own weights from the GGUF onto their devices in their formats. Modules
left to transformers (`default`) get fp32 parameters on their placement's generate_device.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from hybrid.model.tensor_map import load_hf_weight
from hybrid.ops.context import BuildContext
from hybrid.rules.engine import PlannedModel


def _builders() -> dict[str, Callable[[BuildContext], nn.Module]]:
    from hybrid.ops.experts import ExpertsOp
    from hybrid.ops.gate import GateOp
    from hybrid.ops.layers import EmbeddingOp, LinearOp, MLPOp, RMSNormOp
    from hybrid.ops.mla_attention import MLAAttentionOp
    from hybrid.ops.rotary import RotaryOp

    return {"embedding": EmbeddingOp, "rmsnorm": RMSNormOp, "rotary": RotaryOp,
            "linear": LinearOp, "lm_head": LinearOp, "mlp": MLPOp, "gate": GateOp,
            "experts": ExpertsOp, "mla_attention": MLAAttentionOp}


def inject(planned: PlannedModel, progress: Callable[[int, int], None] | None = None) -> nn.Module:
    model, plan = planned.model, planned.plan
    builders = _builders()
    ops = [p for p in plan.placements.values() if p.operator != "default"]
    # Outermost first, so a replaced module's own descendants are never visited again.
    ops.sort(key=lambda p: p.path.count("."))
    replaced: list[str] = []
    for done, place in enumerate(ops, start=1):
        if any(place.path.startswith(r + ".") for r in replaced):
            continue
        module = model.get_submodule(place.path)
        ctx = BuildContext(planned.gguf, planned.spec, place.path, place.options, module)
        _set_submodule(model, place.path, builders[place.operator](ctx))
        replaced.append(place.path)
        if progress is not None:
            progress(done, len(ops) + 1)
    _load_defaults(planned, replaced)
    if progress is not None:
        progress(len(ops) + 1, len(ops) + 1)
    return model.eval()


def _set_submodule(model: nn.Module, path: str, new: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent_path) if parent_path else model, name, new)


def _load_defaults(planned: PlannedModel, replaced: list[str]) -> None:
    """fp32 parameters (and the rotary tables) for modules transformers still runs."""
    model, plan = planned.model, planned.plan
    for name, param in list(model.named_parameters(remove_duplicate=False)):
        module_path, _, leaf = name.rpartition(".")
        device = plan.placement_of(module_path).generate_device
        tensor = load_hf_weight(planned.gguf, planned.spec, name).to(device)
        model.get_submodule(module_path)._parameters[leaf] = nn.Parameter(tensor, requires_grad=False)
    for name, buf in list(model.named_buffers()):
        module_path, _, leaf = name.rpartition(".")
        if not getattr(model.get_submodule(module_path), leaf).is_meta:
            continue
        device = plan.placement_of(module_path).generate_device
        if leaf == "e_score_correction_bias":
            value = load_hf_weight(planned.gguf, planned.spec, name)
        else:  # rotary tables are computed, not stored: rebuild the module off the meta device
            rotary = model.get_submodule(module_path)
            _set_submodule(model, module_path, type(rotary)(config=model.config).to(device))
            continue
        model.get_submodule(module_path)._buffers[leaf] = value.to(device)
    if planned.spec.tied_embeddings and "lm_head" not in replaced:
        model.lm_head.weight = model.model.embed_tokens.weight
    leftover = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if leftover:
        raise RuntimeError(f"modules left on the meta device: {leftover[:5]}")
