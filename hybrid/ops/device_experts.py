"""Routed experts on one device from the GGUF's blocks: the experts a rule holds on a GPU
(`gpu_experts`, beside the CPU's share) and backend "torch" on gpu_kernels (every expert).

    DeviceExperts(ctx, prefix, ids, device)(hidden, ids, weights)   [N, H] f32: their terms
    torch_experts(x, ids, weights, gate_up, down)                   the reference loop
    expert_mlp(x, gate_up, down)                                    one expert, both loops

With gpu_kernels (CUDA) all of a step's pairs run in grouped launches on the blocks
(gpu_kernels.moe_grouped), no host sync, so a CUDA graph holds them; elsewhere each expert is
dequantized on use and looped in torch.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from hybrid.gguf.dequant import dequantize
from hybrid.ops.context import BuildContext


def expert_types(ctx: BuildContext, prefix: str) -> list[int]:
    names = [n for n in ctx.gguf.tensor_names if n.startswith(prefix) and "_exps." in n]
    return [int(ctx.gguf.tensor_infos[n][0].qtype) for n in names]


def gpu_kernels_cover(ctx: BuildContext, prefix: str, device: torch.device) -> bool:
    from hybrid.ops.kernel_sets import uses_gpu_kernels

    if not uses_gpu_kernels(device):
        return False
    from gpu_kernels.qtypes import is_supported

    return all(is_supported(t) for t in expert_types(ctx, prefix))


class DeviceExperts:
    """The GGUF blocks of the chosen experts only, on `device`. With gpu_kernels (CUDA): all
    their tokens in grouped launches on the blocks (gpu_kernels.moe_grouped), no host sync;
    elsewhere each expert dequantized on use, looped in torch."""

    def __init__(self, ctx: BuildContext, prefix: str, expert_ids: list[int],
                 device: torch.device, limit: float = math.inf, memory: str = "device") -> None:
        """limit: the SwiGLU's clamp (DeepSeek-V4; inf: none). memory: where the blocks lie,
        "device" or "host": page-locked host memory that the kernels on `device` read in
        place over PCIe each step (no GPU memory; the host's memory serves PCIe beside the
        CPU's cores, docs/serving.md). On a CPU device both are host memory."""
        if memory not in ("device", "host"):
            raise ValueError(f"experts' memory {memory!r}: device or host")
        self.device, self.limit, self.memory = device, limit, memory
        self.kernels = gpu_kernels_cover(ctx, prefix, device)
        if memory == "host" and device.type == "cuda" and not self.kernels:
            raise ValueError(f"{prefix}: gpu_experts_memory host needs gpu_kernels for the "
                             f"experts' types {expert_types(ctx, prefix)}; use device")
        self.slot = {e: j for j, e in enumerate(expert_ids)}
        self.local = torch.full((ctx.spec.num_experts,), -1, dtype=torch.long,
                                device=self.device)  # global expert id -> row block here
        self.local[expert_ids] = torch.arange(len(expert_ids), device=self.device)
        self.hidden_size, self.top_k = ctx.spec.hidden_size, ctx.spec.num_experts_per_tok
        names = (["ffn_gate_up_exps"] if ctx.spec.fused_gate_up_experts
                 else ["ffn_gate_exps", "ffn_up_exps"]) + ["ffn_down_exps"]
        self.parts = []
        for name in names:
            qt = ctx.gguf.tensor(f"{prefix}{name}.weight")
            rows = np.ascontiguousarray(qt.data.reshape(qt.shape[0], -1)[expert_ids])
            raw = torch.from_numpy(rows).to(self.device)
            if self.kernels:
                from gpu_kernels.qformat import in_host_memory, to_planes

                _, r, c = qt.shape
                planes = to_planes(raw, int(qt.qtype), len(expert_ids) * r, c)
                self.parts.append(in_host_memory(planes) if memory == "host" else planes)
            else:
                self.parts.append((raw, qt.qtype, qt.shape[1:]))

    def warm_up(self) -> None:
        """Compile the grouped launches' every block size (they follow the pairs per expert,
        which no warm-up step can choose), one token each."""
        if not self.kernels:
            return
        from gpu_kernels.qmatmul import TOKEN_CLASSES

        x = torch.zeros(1, self.hidden_size, device=self.device)
        ids = torch.full((1, self.top_k), next(iter(self.slot)), dtype=torch.long,
                         device=self.device)
        for bm in TOKEN_CLASSES:
            self(x, ids, torch.zeros(1, self.top_k, device=self.device), bm=bm)

    def weights(self, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        j = self.slot[expert]
        mats = [dequantize(raw[j], qtype, shape) for raw, qtype, shape in self.parts]
        return torch.cat(mats[:-1], dim=0), mats[-1]  # [2I, H], [H, I]

    def __call__(self, hidden: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                 bm: int | None = None) -> torch.Tensor:
        x, ids, weights = (t.to(self.device) for t in (hidden, ids, weights))
        if self.kernels:
            from gpu_kernels import moe_grouped

            x, held = x.float().contiguous(), self.local[ids.long()]  # [N, H], [N, K]
            return moe_grouped.moe_experts(x, held, weights, tuple(self.parts[:-1]),
                                           self.parts[-1], len(self.slot), bm=bm,
                                           limit=self.limit)
        out = torch.zeros(x.shape, dtype=torch.float32, device=self.device)
        for e in self.slot:
            tok, k = torch.where(ids == e)
            if tok.numel() == 0:
                continue
            y = expert_mlp(x[tok], *self.weights(e), self.limit)
            out.index_add_(0, tok, y * weights[tok, k, None].float())
        return out


def torch_experts(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                   gate_up: torch.Tensor, down: torch.Tensor,
                   limit: float = math.inf) -> torch.Tensor:
    """Reference loop over the experts present. x: [N, H] -> [N, H] fp32; `limit` clamps
    the gate from above and up on both sides before the SwiGLU (V4)."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in torch.unique(ids).tolist():
        tok, slot = torch.where(ids == e)
        w = weights[tok, slot].float()
        if not bool((w != 0).any()):
            continue
        out.index_add_(0, tok, expert_mlp(x[tok], gate_up[e], down[e], limit) * w[:, None])
    return out


def expert_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
               limit: float = math.inf) -> torch.Tensor:
    """One expert's SwiGLU on its rows in fp32. x: [T, H], gate_up: [2I, H], down: [H, I] ->
    [T, H]; `limit` clamps the gate from above and up on both sides (V4)."""
    g, u = F.linear(x.float(), gate_up.float()).chunk(2, dim=-1)
    if limit != math.inf:
        g, u = g.clamp(max=limit), u.clamp(min=-limit, max=limit)
    return F.linear(F.silu(g) * u, down.float())
