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


class ExpertStaging:
    """One device buffer per device that every layer's host-memory experts are copied into in
    turn (DeviceExperts memory "host"). Safe to share: the layers' copies and products run in
    order on one stream, so a layer's products end before the next layer's copy lands. Sized
    by every layer's `reserve` before the first `buffer`."""

    def __init__(self) -> None:
        self._need: dict[torch.device, int] = {}
        self._buffers: dict[torch.device, torch.Tensor] = {}

    def reserve(self, device: torch.device, nbytes: int) -> None:
        if device in self._buffers and self._buffers[device].numel() < nbytes:
            raise RuntimeError("ExpertStaging: a layer reserved after the buffer was made")
        self._need[device] = max(self._need.get(device, 0), nbytes)

    def buffer(self, device: torch.device) -> torch.Tensor:
        """[bytes] uint8 on `device`, made on first use at the largest reservation."""
        if device not in self._buffers:
            self._buffers[device] = torch.empty(self._need[device], dtype=torch.uint8,
                                                device=device)
        return self._buffers[device]


class DeviceExperts:
    """The GGUF blocks of the chosen experts only, on `device`. With gpu_kernels (CUDA): all
    their tokens in grouped launches on the blocks (gpu_kernels.moe_grouped), no host sync;
    elsewhere each expert dequantized on use, looped in torch."""

    def __init__(self, ctx: BuildContext, prefix: str, expert_ids: list[int],
                 device: torch.device, limit: float = math.inf, memory: str = "device",
                 staging: ExpertStaging | None = None) -> None:
        """limit: the SwiGLU's clamp (DeepSeek-V4; inf: none). memory: where the blocks lie,
        "device" or "host": page-locked host memory, the experts a step uses copied over PCIe
        into `staging`'s buffer (one for all layers) before the products (no GPU memory of
        their own; the host's memory serves PCIe beside the CPU's cores, docs/serving.md).
        Without gpu_kernels both are the blocks on `device`."""
        if memory not in ("device", "host"):
            raise ValueError(f"gpu_experts_memory {memory!r}: device or host")
        self.device, self.limit, self.memory = device, limit, memory
        self.kernels = gpu_kernels_cover(ctx, prefix, device)
        if memory == "host" and device.type == "cuda" and not self.kernels:
            raise ValueError(f"{prefix}: gpu_experts_memory host needs gpu_kernels for the "
                             f"experts' types {expert_types(ctx, prefix)}; use device")
        self.layout = None  # memory host: gpu_kernels.expert_gather's HostLayout
        self._staged = None  # memory host: the parts over the staging buffer, made once
        self.staging = staging if staging is not None else ExpertStaging()
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
                from gpu_kernels.qformat import to_planes

                _, r, c = qt.shape
                self.parts.append(to_planes(raw, int(qt.qtype), len(expert_ids) * r, c))
            else:
                self.parts.append((raw, qt.qtype, qt.shape[1:]))
        if memory == "host" and self.kernels:
            from gpu_kernels.expert_gather import host_layout

            self.layout = host_layout(self.parts, len(expert_ids), device)
            self.parts = list(self.layout.parts)  # the device's planes are released
            self.staging.reserve(device, self.layout.nbytes)

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

    def _gathered(self, held: torch.Tensor) -> tuple:
        """The parts over the staging buffer, the experts `held` [N, K] uses (>= 0) copied
        there from host memory. Device ops only: a CUDA graph holds them."""
        from gpu_kernels.expert_gather import gather_used

        n = len(self.slot)
        used = torch.zeros(n + 1, dtype=torch.int8, device=self.device)  # [E_h + 1]
        used.index_fill_(0, torch.where(held >= 0, held, n).reshape(-1), 1)
        buffer = self.staging.buffer(self.device)
        gather_used(self.layout, buffer, used[:n])
        if self._staged is None:
            self._staged = self.layout.views(buffer)
        return self._staged

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
            parts = self.parts if self.layout is None else self._gathered(held)
            return moe_grouped.moe_experts(x, held, weights, tuple(parts[:-1]), parts[-1],
                                           len(self.slot), bm=bm, limit=self.limit)
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
