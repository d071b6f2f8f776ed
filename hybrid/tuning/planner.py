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
    """hot_experts over several GPUs (free: device -> bytes it has left). The experts are
    those hot_experts picks for all the room together; a layer's live on one GPU (a rule has
    one gpu_device), so the layers are then placed, largest set first: on the GPU their
    attention runs on (`home`: layer -> device; the hidden state is there) if the set fits,
    else on the GPU with the most room left, keeping the set's most used experts that fit
    there; then what room is left takes the next most used experts, each on its layer's GPU.
    -> layer -> (device, sorted expert ids)."""
    chosen = hot_experts(freq, layers, sizes, sum(free.values()), batch)
    p = step_probability(freq, batch)
    row = {layer: i for i, layer in enumerate(layers)}
    left = dict(free)
    out: dict[int, tuple[str, list[int]]] = {}
    for layer in sorted(chosen, key=lambda x: (-len(chosen[x]) * sizes.per_layer[x], x)):
        cost = sizes.per_layer[layer]
        ids = sorted(chosen[layer], key=lambda e: (-p[row[layer], e], e))  # most used first
        own = home.get(layer)
        if own in left and left[own] >= cost * len(ids):
            device = own
        else:
            device = max(left, key=lambda d: (left[d], d == own))
            ids = ids[:left[device] // cost]
        if ids:
            out[layer] = (device, ids)
            left[device] -= cost * len(ids)
    # what truncation left: the next most used experts, each where its layer lives (a layer
    # not placed yet: its own GPU if it has room, else the roomiest)
    items = sorted(((p[row[layer], e], layer, e) for layer in layers
                    if layer in sizes.cpu_layers for e in range(freq.shape[1])
                    if p[row[layer], e] > 0), key=lambda t: (-t[0], t[1], t[2]))
    for _, layer, e in items:
        cost = sizes.per_layer[layer]
        if layer in out:
            device, ids = out[layer]
            if e not in ids and left[device] >= cost:
                ids.append(e)
                left[device] -= cost
            continue
        fits = [d for d in left if left[d] >= cost]
        if fits:
            device = home[layer] if home.get(layer) in fits else max(fits, key=lambda d: left[d])
            out[layer] = (device, [e])
            left[device] -= cost
    return {layer: (d, sorted(ids)) for layer, (d, ids) in sorted(out.items())}


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
