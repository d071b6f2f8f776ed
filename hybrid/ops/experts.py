"""Routed experts: out[t] = sum_k w[t,k] * down(silu(gate x_t) * up x_t) over token t's experts.

backend "cpu": cpu_kernels on the GGUF's own blocks (memory-mapped, never dequantized), in
`exact` or `fast` mode. backend "torch": dequantized weights (weight_format) on the device.
`gpu_experts` keeps those experts on `gpu_device` (device_experts.py; their blocks in its
memory, or with `gpu_experts_memory: host` in page-locked host memory, the ones a step uses
copied over PCIe) while the rest run on the CPU; the two partial sums are added.
`use_cpu_pool` hands the CPU part to a cpu_kernels MoEPool (kernel threads, NUMA groups): it
then runs asynchronously, overlapping the gpu_experts. The parts made at load (the CPU
kernels' weights, the held experts) come from experts_build.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from hybrid.ops.context import BuildContext
from hybrid.ops.device_experts import DeviceExperts, gpu_kernels_cover, torch_experts
from hybrid.ops.experts_build import (
    check_deferral,
    cpu_expert_weights,
    cpu_kernels_cover,
    held_experts,
)

# The pairs a step must hand host-memory GPU experts on average for their copy over PCIe to
# pay: fewer, and the copy's fixed cost and the spread of the experts one token picks leave
# the GPU's share finishing after the CPU's (docs/serving.md has the rows at 1 and 16 streams)
MIN_HOST_PAIRS = 4


class ExpertsOp(nn.Module):
    def __init__(self, ctx: BuildContext) -> None:
        super().__init__()
        spec, opts = ctx.spec, ctx.options
        self.backend, self.mode = opts["backend"], opts["mode"]
        self.device = ctx.device
        self.num_experts, self.top_k = spec.num_experts, spec.num_experts_per_tok
        gpu_ids = sorted(set(opts.get("gpu_experts") or []))
        layer = ctx.layer_index
        p = f"blk.{layer}."
        if self.backend == "cpu" and not cpu_kernels_cover(ctx, p):
            # Types cpu_kernels has no kernel for (F32 experts, Q4_1/Q5_1, IQ types): same math
            # in torch on dequantized weights, so the plan still runs.
            self.backend = "torch"
            ctx = BuildContext(ctx.gguf, ctx.spec, ctx.path, {**opts, "weight_format": "f32"},
                               ctx.module)
        self.on_device = None  # backend torch on gpu_kernels: DeviceExperts of every expert
        self.stream_parts = None  # backend cpu: the expert tensors a step may stream
        # DeepSeek-V4's clamped SwiGLU (transformers' DeepseekV4Experts.limit): every kernel
        # clamps (cpu_kernels/exact/swiglu.py, gpu_kernels' silu_mul, the torch loops)
        limit = getattr(ctx.module, "limit", None)
        self.swiglu_limit = math.inf if limit is None else float(limit)
        if self.backend == "cpu":
            self.cpu_weights, self.stream_parts = cpu_expert_weights(ctx, layer, self.mode,
                                                                     self.swiglu_limit)
        elif gpu_kernels_cover(ctx, p, self.device):
            # every expert's blocks on the device, all tokens in grouped launches
            self.on_device = DeviceExperts(ctx, p, list(range(spec.num_experts)), self.device,
                                         self.swiglu_limit)
        else:
            self.gate_up = ctx.weight("gate_up_proj").get()  # [E, 2I, H]
            self.down = ctx.weight("down_proj").get()  # [E, H, I]
        # expert deferral (cpu_kernels/runtime/deferral.py): run by the CPU experts' drivers
        self.defer_experts = int(opts.get("defer_experts", 0))
        check_deferral(ctx.path, self.defer_experts, self.top_k, self.backend)
        mask = torch.zeros(spec.num_experts, dtype=torch.bool)
        mask[gpu_ids] = True
        self.gpu_held = mask  # [E] bool: the experts held on the GPU (`gpu_experts`)
        self.gpu_experts = held_experts(ctx, p, gpu_ids, self.swiglu_limit)
        if self.gpu_experts is None:
            mask[:] = False
        # host-memory held experts: the fewest rows a step hands them (rows * K * held >=
        # MIN_HOST_PAIRS * E); 0 where every step does
        self.host_min_rows = 0 if self.gpu_experts is None or self.gpu_experts.memory != "host" \
            else -(-MIN_HOST_PAIRS * self.num_experts // (self.top_k * len(gpu_ids)))
        self._held: dict[torch.device, torch.Tensor] = {}  # gpu_held, on each ids device
        self.pool = None  # a cpu_kernels MoEPool, set by use_pool
        self.placed = None  # cpu_weights as placed on the pool's worker groups

    def warm_up(self) -> None:
        """Compile the on-device experts' kernel variants (the model runner's start-up), each
        part with its GPU current (Triton launches on the current device)."""
        for part in (self.on_device, self.gpu_experts):
            if part is not None:
                with torch.cuda.device(part.device if part.device.type == "cuda" else None):
                    part.warm_up()

    def use_pool(self, pool) -> None:
        """Run the CPU experts as jobs of `pool` (cpu_kernels.runtime.pool.MoEPool); no-op for torch."""
        if self.backend == "cpu":
            self.placed = pool.place(self.cpu_weights, self.mode)
            self.pool = pool

    @property
    def runs_on_host(self) -> bool:
        """The experts run in cpu_kernels (but those gpu_experts holds): the engine can hand the
        layer over as host arrays, splitting off the held experts' slots (hand_off)."""
        return self.backend == "cpu"

    @property
    def held_device(self) -> torch.device | None:
        """The device of the experts `gpu_experts` holds (None: none held)."""
        return None if self.gpu_experts is None else self.gpu_experts.device

    @property
    def device_only(self) -> bool:
        """Every expert on one device in gpu_kernels' grouped launches (forward makes no host
        round trip and no data-dependent shape: a CUDA graph can hold it)."""
        return self.on_device is not None and self.gpu_experts is None

    def splits(self, rows: int) -> bool:
        """Whether hand_off splits a step of `rows` rows (held experts that take their pairs);
        where it does not, the host gets the router's ids as they are."""
        return self.gpu_experts is not None and rows >= self.host_min_rows

    def hand_off(self, ids: torch.Tensor, weights: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Split a step's choices [N, K]: (ids for the host, the held experts' slots -1 so the
        CPU never reads them; weights of the held slots only, the rest 0, or None when no
        expert is held, or they lie in host memory and N * K pairs would hand them fewer than
        MIN_HOST_PAIRS on average: the CPU, which keeps every expert, computes them). Device
        ops only: no sync, capturable (N is the step's static row count)."""
        if not self.splits(ids.shape[0]):  # none held, or too few pairs to pay for their
            return ids, None  # copy: the CPU computes all
        if ids.device not in self._held:
            self._held[ids.device] = self.gpu_held.to(ids.device)
        held = self._held[ids.device][ids]  # [N, K] bool
        return ids.masked_fill(held, -1), weights.masked_fill(~held, 0.0)

    def held_summary(self) -> str | None:
        """What the held experts are, for the start-up's log (None: none)."""
        g = self.gpu_experts
        if g is None:
            return None
        held = f"{len(g.slot)} of {self.num_experts} experts a layer"
        if g.memory != "host":
            return f"{held} held on {g.device}"
        return (f"{held} in page-locked host memory, the ones a step uses copied over PCIe and "
                f"computed on {g.device} in steps of {self.host_min_rows} or more tokens")

    def run_held(self, hidden: torch.Tensor, ids: torch.Tensor, held_weights: torch.Tensor
                 ) -> torch.Tensor:
        """The held experts' share of the layer's output [N, H] f32 on hidden's device, from
        hand_off's weights; runs on gpu_device while the host computes the rest."""
        held = self.gpu_experts.device
        if held != hidden.device and held.type == "cuda":  # its kernels launch on their GPU
            with torch.cuda.device(held):
                out = self.gpu_experts(hidden, ids, held_weights)
            return out.to(hidden.device, torch.float32)
        return self.gpu_experts(hidden, ids, held_weights).to(hidden.device, torch.float32)

    def run_host(self, x: np.ndarray, ids: np.ndarray, weights: np.ndarray,
                 out: np.ndarray) -> None:
        """x: [N, H] f32  ids: [N, K] int64  weights: [N, K] f32 -> out [N, H] (host arrays,
        e.g. pinned buffers); on the pool's kernel threads when there is a pool (driven from
        this thread where the pool allows it: the caller waits anyway). Needs `runs_on_host`."""
        if self.pool is not None:
            if self.pool.can_run_inline:
                self.pool.run_inline(x, ids, weights, self.placed, out)
            else:
                self.pool.submit(x, ids, weights, self.placed, out).wait()
            return
        from cpu_kernels.moe import moe_forward

        moe_forward(x, ids, weights, self.cpu_weights, out, mode=self.mode)

    def forward(self, hidden: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """hidden: [N, H]  ids: [N, K]  weights: [N, K] -> [N, H]"""
        if self.device_only:
            # the whole layer on the device: no split by expert, nothing waits for the host
            return self.on_device(hidden, ids, weights).to(hidden.device, hidden.dtype)
        gpu_mask = self.gpu_held[ids.cpu()].to(ids.device)  # [N, K]
        if self.backend == "cpu":  # the kernels skip negative ids: held experts are never read
            finish = self._start(hidden, ids.masked_fill(gpu_mask, -1), weights)
        else:  # torch loops: the held slots weigh 0
            finish = self._start(hidden, ids, weights.masked_fill(gpu_mask, 0.0))
        gpu_out = None
        if self.gpu_experts is not None and bool(gpu_mask.any()):
            gpu_w = weights.masked_fill(~gpu_mask, 0.0)
            gpu_out = self.gpu_experts(hidden, ids, gpu_w)
        out = finish()
        if gpu_out is not None:
            out = out + gpu_out.to(out.device)
        return out.to(hidden.dtype)

    def _start(self, hidden: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
               ) -> Callable[[], torch.Tensor]:
        """Start the experts on this op's backend; the returned function gives [N, H]."""
        if self.backend == "cpu":
            from cpu_kernels.moe import moe_forward

            x = hidden.detach().to("cpu", torch.float32).contiguous().numpy()
            out = np.empty_like(x)
            ids_cpu = ids.cpu().numpy().astype(np.int32)
            w_cpu = weights.detach().cpu().float().numpy()
            if self.pool is not None:
                job = self.pool.submit(x, ids_cpu, w_cpu, self.placed, out)
                return lambda: torch.from_numpy(job.wait()).to(hidden.device)
            moe_forward(x, ids_cpu, w_cpu, self.cpu_weights, out, mode=self.mode)
            return lambda: torch.from_numpy(out).to(hidden.device)
        if self.on_device is not None:
            res = self.on_device(hidden, ids, weights).to(hidden.device)
            return lambda: res
        res = torch_experts(hidden.to(self.device), ids.to(self.device), weights.to(self.device),
                             self.gate_up, self.down, self.swiglu_limit).to(hidden.device)
        return lambda: res


def set_deferral(model: nn.Module, k: int) -> int:
    """Give every CPU ExpertsOp of `model` `defer_experts` k (what the rule option does; for
    A/B measurements within one process: the next step runs with it). -> layers set."""
    ops = [m for m in model.modules() if isinstance(m, ExpertsOp) and m.runs_on_host]
    for op in ops:
        check_deferral("set_deferral", k, op.top_k, op.backend)
        op.defer_experts = k
    return len(ops)


def use_cpu_pool(model: nn.Module, pool) -> int:
    """Run every ExpertsOp of `model` on `pool` (a cpu_kernels.runtime.pool.MoEPool built with the
    engine's cpu_threads); places each layer's experts on the pool's NUMA groups (in `fast`
    mode a per-node repack). Returns the number of CPU expert layers now on the pool."""
    ops = [m for m in model.modules() if isinstance(m, ExpertsOp) and m.backend == "cpu"]
    for op in ops:
        op.use_pool(pool)
    return len(ops)
