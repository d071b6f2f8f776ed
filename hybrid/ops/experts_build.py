"""How an ExpertsOp's parts are made from the GGUF and its rule, once at load: the CPU kernels'
weights on the file's own blocks (and fast mode's packed copy), the experts held on a GPU, and
the checks of `defer_experts`. Nothing here runs during a step."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from hybrid.errors import HybridError
from hybrid.ops.context import BuildContext
from hybrid.ops.device_experts import DeviceExperts, expert_types

if TYPE_CHECKING:
    from hybrid.model.spec import ModelSpec

log = logging.getLogger(__name__)


def cpu_expert_weights(ctx: BuildContext, layer: int, mode: str, swiglu_limit: float) -> tuple:
    """Layer `layer`'s routed experts for the CPU kernels -> (ExpertWeights on the file's
    memory-mapped blocks, the expert tensors a long prompt's step may stream to the GPU whole:
    gate, up, down, or gate_up, down in the fused layout). Fast mode's load-time repack
    (<= 1.1x the GGUF bytes) is built now, not on the first forward."""
    from cpu_kernels.formats.weights import ExpertWeights

    p, spec = f"blk.{layer}.", ctx.spec
    if spec.fused_gate_up_experts:
        fused, i = p + "ffn_gate_up_exps.weight", spec.moe_intermediate_size
        gate, up = quant_matrix(ctx, fused, slice(0, i)), quant_matrix(ctx, fused, slice(i, 2 * i))
    else:
        gate = quant_matrix(ctx, p + "ffn_gate_exps.weight")
        up = quant_matrix(ctx, p + "ffn_up_exps.weight")
    down = quant_matrix(ctx, p + "ffn_down_exps.weight")
    weights = ExpertWeights(gate, up, down, swiglu_limit=swiglu_limit)
    stream_parts = ((quant_matrix(ctx, fused),) if spec.fused_gate_up_experts
                    else (gate, up)) + (down,)
    if mode == "fast":
        _pack(ctx, layer, weights)
    return weights, stream_parts


def quant_matrix(ctx: BuildContext, gguf_name: str, rows: slice | None = None):
    """The GGUF's expert tensor `gguf_name` as a cpu_kernels QuantMatrix (its rows `rows` of
    each expert), on the memory-mapped blocks."""
    from cpu_kernels.formats.weights import QuantMatrix

    qt = ctx.gguf.tensor(gguf_name)
    raw = qt.data.reshape(qt.shape[0], qt.shape[1], -1)  # [E, rows, row bytes or elements]
    shape = qt.shape
    if rows is not None:
        raw = raw[:, rows]
        shape = (shape[0], raw.shape[1], shape[2])
    return QuantMatrix.from_raw(qt.qtype, shape, raw)


def cpu_kernels_cover(ctx: BuildContext, prefix: str) -> bool:
    """Whether cpu_kernels has a kernel for every type of the layer's expert tensors."""
    from cpu_kernels.formats.qtypes import is_supported

    return all(is_supported(t) for t in expert_types(ctx, prefix))


def held_experts(ctx: BuildContext, prefix: str, ids: list[int], limit: float
                 ) -> DeviceExperts | None:
    """The rule's gpu_experts, or None: none listed, or their host memory could not be
    page-locked (a warning; the CPU, which keeps every expert, computes them: a default rule
    file's pcie_experts never stops a start)."""
    if not ids:
        return None
    from gpu_kernels.expert_gather import HostMemoryUnavailable

    try:
        return DeviceExperts(ctx, prefix, ids, torch.device(ctx.options["gpu_device"]), limit,
                             ctx.options["gpu_experts_memory"], ctx.expert_staging)
    except HostMemoryUnavailable as e:
        log.warning("%s: its gpu_experts in host memory need %s; the CPU computes every expert "
                    "of the layer (lower pcie_experts, or set it to 0)", ctx.path, e)
        return None


def check_deferral(path: str, k: int, top_k: int, backend: str) -> None:
    """Raise unless `defer_experts` k fits the layer. With `gpu_experts` a row defers among its
    CPU experts only: the held slots reach the host as -1, which split_deferred never defers."""
    if k == 0:
        return
    if not 0 < k < top_k:
        raise HybridError(f"{path}: defer_experts is {k}; it must be between 0 and "
                          f"{top_k - 1} (the model routes {top_k} experts a token)")
    if backend != "cpu":
        raise HybridError(f"{path}: defer_experts needs the experts on the CPU kernels "
                          f"(backend cpu; this layer's run in torch): drop defer_experts here")


def _pack(ctx: BuildContext, layer: int, experts) -> None:
    """Give `experts` its packed copy: the disk cache's memory map when there is one (made now
    if missing), else packed in memory. Once the copy is in place the GGUF's expert pages are
    released from the process (fast mode never reads them again; the page cache keeps them)."""
    from cpu_kernels.fast.packed import PackedExperts
    from cpu_kernels.runtime.placement import packs

    if not packs(experts):
        return  # types without a packed layout run on the blocks themselves
    cache = ctx.packed_cache
    found = cache.load(layer, experts) if cache is not None else None
    if found is None:
        if ctx.packers is not None:  # their compile started before the plan: read it from cache
            ctx.packers.wait()
        found = PackedExperts.of(experts)
        if cache is not None:
            found = cache.store(layer, found)
    experts.use_packed(found)
    for name in expert_tensors(ctx.spec, f"blk.{layer}."):
        ctx.gguf.release(name)


def expert_tensors(spec: ModelSpec, prefix: str) -> list[str]:
    """A layer's routed-expert tensors (`prefix` "blk.L."): gate, up, down, or gate_up, down
    in the fused layout."""
    if spec.fused_gate_up_experts:
        return [prefix + "ffn_gate_up_exps.weight", prefix + "ffn_down_exps.weight"]
    return [prefix + f"ffn_{n}_exps.weight" for n in ("gate", "up", "down")]
