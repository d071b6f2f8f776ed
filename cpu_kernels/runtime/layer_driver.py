"""The routed experts of every MoE layer of one step, driven from one numba call: for each layer
in order, wait for its inputs (a flag another agent sets, e.g. a GPU through mapped pinned
memory), run its experts, raise its done flag.

Why one compiled loop: between two layers' kernels the calling thread would otherwise run
Python (wait, dispatch, checks) on caches the kernel just flushed by streaming its weights; that
costs ~40 us a layer, a tenth of a decode step of V2-Lite. Here the only work between kernels is
a spin on the flag.

Protocol per step, `seq` growing by one each step (flags are never reset):
    other side: x/ids/weights rows for layer l written, then ready[l] = seq (release)
    here:       wait ready[l] == seq, out = MoE(x[:n], ids[:n], weights[:n]), done[l] = seq
All layers share the buffers (layers run one after another). The layers are given as packed
(fast mode) weights: a tuple of (gate_type, gate, up_type, up, down_type, down) per layer.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit

from cpu_kernels.fast.packed_moe import packed_moe_kernel
from cpu_kernels.fast.tile_set import tile_set
from cpu_kernels.runtime.handshake import store_release, wait_equal
from cpu_kernels.runtime.placement import PlacedExperts


def is_packed(p: PlacedExperts) -> bool:
    """Fast-mode experts placed in one slice: what drive_layers runs."""
    return len(p.slices) == 1 and p.slices[0].packed is not None


def packed_layers(layers: list[PlacedExperts]) -> tuple:
    """The layers argument of drive_layers: (the tile set of all their types, per layer
    (gate_type, gate, up_type, up, down_type, down, swiglu limit)), made once; needs every
    layer `is_packed`.
    The set is the pool's (MoEPool.tiles) when these are all the layers placed there: prompt
    steps and decode steps then run one compiled kernel."""
    out = []
    for p in layers:
        if not is_packed(p):
            raise ValueError("drive_layers needs fast-mode experts placed in one slice")
        pk = p.slices[0].packed
        out.append((pk.gate.qtype, pk.gate.data, pk.up.qtype, pk.up.data, pk.down.qtype,
                    pk.down.data, float(p.experts.swiglu_limit)))
    return tile_set(t for g in out for t in g[0:6:2]), tuple(out)


@njit(nogil=True, cache=True)
def _drive(tiles, ready, done, seq, n, x, ids, weights, out, layers, threads, timeout_cycles,
           stamps):
    # tiles: packed_moe_kernel's TileSet, one for all layers
    for layer in range(len(layers)):
        if not wait_equal(ready, layer, seq, timeout_cycles):
            return layer
        g = layers[layer]
        packed_moe_kernel(tiles, g[0], g[1], g[2], g[3], g[4], g[5], x[:n], ids[:n],
                          weights[:n], g[6], out[:n], stamps[layer], threads)
        store_release(done, layer, seq)
    return len(layers)


def drive_layers(ready: np.ndarray, done: np.ndarray, seq: int, n: int, x: np.ndarray,
                 ids: np.ndarray, weights: np.ndarray, out: np.ndarray, layers: tuple,
                 timeout_cycles: int, stamps: np.ndarray | None = None) -> int:
    """Run every layer of `layers` (packed_layers) as the protocol above, on numba's current
    thread count. ready/done: [L] int64 flags  x: [T, H] f32  ids: [T, K] int64
    weights: [T, K] f32  out: [T, H] f32, rows :n used. stamps: [L, 2] int64 kernel cycle
    stamps (optional). -> layers completed: len(layers), or the layer whose inputs did not
    come within timeout_cycles (its done flag and the later ones are not set)."""
    tiles, per_layer = layers
    if stamps is None:
        stamps = np.empty((len(per_layer), 2), np.int64)
    return _drive(tiles, ready, done, seq, n, x, ids, weights, out, per_layer,
                  numba.get_num_threads(), timeout_cycles, stamps)
