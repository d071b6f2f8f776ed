"""Which experts to keep on the GPU: the ones a workload uses most, per byte, within what the
GPU has left once a rule file's fixed parts and the KV cache are placed.

At batch B, a decode step reads an expert on the CPU if any of its B tokens chose it: with
per-token frequency f that is 1 - (1 - f)**B of the steps. The CPU experts are memory bound
(their time is their bytes over the read bandwidth), so moving expert e of layer l to the GPU
saves p_B(l, e) * bytes_l of reads per step for bytes_l of GPU memory: the best use of each
GPU byte is the expert with the highest p_B, whatever its layer. Greedy by p_B fills the
budget (each expert is one item; within a layer they are all the same size).

The llama.cpp way (`--n-cpu-moe`) places whole layers instead: the same bytes buy each layer's
experts regardless of use (`whole_layers`), which `hybrid tune --measure` compares.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hybrid.errors import HybridError
from hybrid.rules.explain import Explanation
from hybrid.rules.plan import Plan


@dataclass(frozen=True)
class ExpertBytes:
    """Bytes of one routed expert (its three matrices, as the GPU keeps them) per MoE layer."""

    per_layer: dict[int, int]  # model layer -> bytes per expert
    cpu_layers: tuple[int, ...]  # layers whose experts run on the CPU (candidates)


def expert_bytes(plan: Plan, num_experts: int) -> ExpertBytes:
    """From a plan: what each layer's expert costs, and which layers' experts run on the CPU
    (layers already wholly on a GPU are not candidates)."""
    per_layer: dict[int, int] = {}
    cpu: list[int] = []
    for path, place in plan.placements.items():
        if place.operator != "experts":
            continue
        layer = int(path.split(".")[2])
        nbytes = sum(w.nbytes for w in plan.weights if w.owner == path)
        per_layer[layer] = nbytes // num_experts
        if place.generate_device == "cpu":
            cpu.append(layer)
    return ExpertBytes(per_layer, tuple(sorted(cpu)))


def free_gpu_bytes(exp: Explanation, device: str) -> int:
    """What `device` has left for hot experts under its budget (the whole budget less the
    reserve when the rule file puts nothing there), the prefill chunk's activations beyond the
    reserve included."""
    d = exp.devices.get(device)
    if d is None:
        budget = next((x.budget for name, x in exp.devices.items() if name != "cpu"), None)
        from hybrid.rules.explain import GPU_RESERVE_BYTES

        if budget is None:
            raise HybridError(f"no GPU budget for {device}: pass --gpu-memory")
        return max(0, budget - GPU_RESERVE_BYTES)
    if d.budget is None:
        raise HybridError(f"no GPU budget for {device}: pass --gpu-memory")
    # the room a large prefill chunk's activations would take goes to hot experts: decode is
    # what they serve, and the engine then chooses the chunk that fits what is left
    return max(0, d.budget - (d.total - d.activations))


def step_probability(freq: np.ndarray, batch: int) -> np.ndarray:
    """P(a decode step of `batch` tokens reads the expert) from per-token frequencies."""
    return 1.0 - (1.0 - np.clip(freq, 0.0, 1.0)) ** batch


def hot_experts(freq: np.ndarray, layers: tuple[int, ...], sizes: ExpertBytes, budget: int,
                batch: int = 1) -> dict[int, list[int]]:
    """The experts to place on the GPU: layer -> sorted expert ids, most used per byte first
    until `budget` bytes. freq: [L, E] per-token frequencies, rows in `layers` order."""
    p = step_probability(freq, batch)
    items = [(p[i, e], layer, e) for i, layer in enumerate(layers) if layer in sizes.cpu_layers
             for e in range(freq.shape[1]) if p[i, e] > 0]
    items.sort(key=lambda t: (-t[0], t[1], t[2]))
    chosen: dict[int, list[int]] = {}
    left = budget
    for _, layer, e in items:
        cost = sizes.per_layer[layer]
        if cost <= left:
            chosen.setdefault(layer, []).append(e)
            left -= cost
    return {layer: sorted(ids) for layer, ids in sorted(chosen.items())}


def spread_hot_experts(freq: np.ndarray, layers: tuple[int, ...], sizes: ExpertBytes,
                       free: dict[str, int], home: dict[int, str], batch: int = 1
                       ) -> dict[int, tuple[str, list[int]]]:
    """hot_experts over several GPUs (free: device -> bytes it has left): each GPU holds the
    experts most used by the layers whose attention runs on it (`home`: layer -> device; the
    hidden state is there), picked as hot_experts picks them within its room. A layer's held
    experts on another GPU than its own would cost a crossing there and back and keep its
    decode steps out of CUDA graphs (a graph captures one GPU). Layers homed on no GPU of
    `free` go with the roomiest. -> layer -> (device, sorted expert ids)."""
    row = {layer: i for i, layer in enumerate(layers)}
    roomiest = max(free, key=lambda d: free[d])
    gpu_of = {x: home[x] if home.get(x) in free else roomiest for x in layers}
    out: dict[int, tuple[str, list[int]]] = {}
    for device, room in free.items():
        mine = tuple(x for x in layers if gpu_of[x] == device)
        if not mine:
            continue
        chosen = hot_experts(freq[[row[x] for x in mine]], mine, sizes, room, batch)
        out.update({x: (device, sorted(ids)) for x, ids in chosen.items() if ids})
    return dict(sorted(out.items()))


def whole_layers(layers: tuple[int, ...], sizes: ExpertBytes, budget: int,
                 num_experts: int) -> list[int]:
    """llama.cpp's `--n-cpu-moe` placement: the last layers' experts wholly on the GPU, as many
    as fit in `budget` (the first N MoE layers stay on the CPU)."""
    chosen, left = [], budget
    for layer in reversed([x for x in layers if x in sizes.cpu_layers]):
        cost = sizes.per_layer[layer] * num_experts
        if cost > left:
            break
        chosen.append(layer)
        left -= cost
    return sorted(chosen)


def hit_rate(freq: np.ndarray, layers: tuple[int, ...], on_gpu: dict[int, list[int]]) -> float:
    """The share of expert choices (per token) the GPU serves."""
    total = float(freq.sum())
    if total == 0:
        return 0.0
    row = {layer: i for i, layer in enumerate(layers)}
    hits = sum(float(freq[row[layer], ids].sum()) for layer, ids in on_gpu.items()
               if layer in row)
    return hits / total
