"""The routed experts of every MoE layer of one step, driven from one numba call: for each layer
in order, wait for its inputs (a flag another agent sets, e.g. a GPU through mapped pinned
memory), run its experts, raise its done flag.

Why one compiled loop: between two layers' kernels the calling thread would otherwise run
Python (wait, dispatch, checks) on caches the kernel just flushed by streaming its weights; that
costs ~40 us a layer, a tenth of a decode step of V2-Lite. Here the only work between kernels is
a spin on the flag.

Where numba's threading layer allows, the whole step runs in one parallel region
(region_driver.py: no region started per kernel phase; docs/serving.md has the two side by
side); elsewhere this module's loop calls packed_moe_kernel a layer.

Protocol per step, `seq` growing by one each step (flags are never reset):
    other side: x/ids/weights rows for layer l written, then ready[l] = seq (release)
    here:       wait ready[l] == seq, out = MoE(x[:n], ids[:n], weights[:n]), done[l] = seq
All layers share the buffers (layers run one after another). With expert deferral
(deferral.py) a layer's deferred experts run after its done flag, on copies of its inputs.
The layers are given as packed (fast mode) weights: a tuple of (gate_type, gate, up_type, up,
down_type, down) per layer.
"""

from __future__ import annotations

import functools
from functools import partial
from typing import NamedTuple

import numba
import numpy as np
from numba import njit

from cpu_kernels.fast.packed_moe import packed_moe_kernel
from cpu_kernels.fast.q8_activations import Q8Activations
from cpu_kernels.fast.tile_set import TileSet, tile_set
from cpu_kernels.runtime.deferral import split_deferred
from cpu_kernels.runtime.handshake import store_release, wait_equal
from cpu_kernels.runtime.placement import PlacedExperts
from cpu_kernels.runtime.region_driver import drive_in_one_region, layer_table
from cpu_kernels.simd.clock import cycles_per_us

MEET_S = 0.5  # how long one region's workers may take to all start (microseconds when healthy)


def is_packed(p: PlacedExperts) -> bool:
    """Fast-mode experts placed in one slice: what drive_layers runs."""
    return len(p.slices) == 1 and p.slices[0].packed is not None


class PackedLayers(NamedTuple):
    """drive_layers' layers argument (packed_layers makes it)."""

    tiles: TileSet  # every layer's types
    per_layer: tuple  # (gate_type, gate, up_type, up, down_type, down, swiglu limit) a layer
    table: tuple | None  # region_driver.layer_table(per_layer)


def packed_layers(layers: list[PlacedExperts]) -> PackedLayers:
    """drive_layers' view of these layers, made once; needs every layer `is_packed`.
    The tile set is the pool's (MoEPool.tiles) when these are all the layers placed there: prompt
    steps and decode steps then run one compiled kernel."""
    out = []
    for p in layers:
        if not is_packed(p):
            raise ValueError("drive_layers needs fast-mode experts placed in one slice")
        pk = p.slices[0].packed
        out.append((pk.gate.qtype, pk.gate.data, pk.up.qtype, pk.up.data, pk.down.qtype,
                    pk.down.data, float(p.experts.swiglu_limit)))
    return of_tuples(tuple(out))


def of_tuples(per_layer: tuple) -> PackedLayers:
    """PackedLayers of per-layer tuples as packed_layers makes them."""
    return PackedLayers(tile_set(t for g in per_layer for t in g[0:6:2]), per_layer,
                        layer_table(per_layer))


def runs_one_region(layers: PackedLayers) -> bool:
    """drive_layers' default: one parallel region a step where the layers allow it and
    one_region_safe."""
    return layers.table is not None and one_region_safe()


@functools.cache
def _meet_cycles() -> int:
    return int(MEET_S * 1e6 * cycles_per_us())  # measured once: cycles_per_us takes 20 ms


@functools.cache
def one_region_safe() -> bool:
    """Whether drive_in_one_region may run: its spin barriers need every prange iteration of
    the region running at once, which the omp layer gives (tbb may run two on one thread, and
    deadlock; workqueue is not relied on)."""
    Q8Activations.of(np.zeros((1, 32), np.float32))  # a parallel kernel: starts numba's layer
    return numba.threading_layer() == "omp"


@njit(nogil=True, cache=True)
def _drive(tiles, ready, done, seq, n, x, ids, weights, out, layers, deferred, rows, threads,
           timeout_cycles, stamps):
    # tiles: packed_moe_kernel's TileSet, one for all layers; deferred [L] int64: experts a
    # decode row (rows :rows) defers per layer (deferral.py's protocol)
    hidden, top_k = x.shape[1], ids.shape[1]
    carry = np.empty((n, hidden), np.float32)  # [n, H] the last layer's deferred sum
    x_later, w_later = np.empty((n, hidden), np.float32), np.empty((n, top_k), np.float32)
    now, later = np.empty((n, top_k), np.int64), np.empty((n, top_k), np.int64)
    spare = np.empty(2, np.int64)  # the deferred kernels' stamps (not reported)
    held = False
    for layer in range(len(layers)):
        if not wait_equal(ready, layer, seq, timeout_cycles):
            return layer
        g = layers[layer]
        defer = deferred[layer] > 0 and rows > 0
        # now: ids less the deferred slots (all of them where none defers)
        split_deferred(ids[:n], weights[:n], deferred[layer] if defer else 0, rows, now, later)
        if defer:  # kept: once done is raised the GPU may write the next layer's
            x_later[:, :] = x[:n]
            w_later[:, :] = weights[:n]
        packed_moe_kernel(tiles, g[0], g[1], g[2], g[3], g[4], g[5], x[:n], now, weights[:n],
                          g[6], out[:n], stamps[layer], threads)
        if held:
            out[:n] += carry
        held = False
        store_release(done, layer, seq)
        if defer:
            packed_moe_kernel(tiles, g[0], g[1], g[2], g[3], g[4], g[5], x_later, later,
                              w_later, g[6], carry, spare, threads)
            held = True
    return len(layers)


def drive_layers(ready: np.ndarray, done: np.ndarray, seq: int, n: int, x: np.ndarray,
                 ids: np.ndarray, weights: np.ndarray, out: np.ndarray, layers: PackedLayers,
                 timeout_cycles: int, stamps: np.ndarray | None = None,
                 one_region: bool | None = None, deferred: np.ndarray | None = None,
                 rows: int = 0, starts: np.ndarray | None = None) -> int:
    """Run every layer of `layers` (packed_layers) as the protocol above, on numba's current
    thread count: bound_driver's call, made at once. -> see bound_driver."""
    return bound_driver(ready, done, seq, n, x, ids, weights, out, layers, timeout_cycles,
                        stamps, one_region, deferred, rows, starts)()


def bound_driver(ready: np.ndarray, done: np.ndarray, seq: int, n: int, x: np.ndarray,
                 ids: np.ndarray, weights: np.ndarray, out: np.ndarray, layers: PackedLayers,
                 timeout_cycles: int, stamps: np.ndarray | None = None,
                 one_region: bool | None = None, deferred: np.ndarray | None = None,
                 rows: int = 0, starts: np.ndarray | None = None) -> partial:
    """drive_layers' numba call with its arguments bound, on numba's thread count now: a
    functools.partial of region_driver.drive_in_one_region or of the layer loop (its `func`
    says which) that enters numba at once when called. Why: the Python before it
    (numba.get_num_threads is a ctypes call, which lets go of the GIL) would let another Python
    thread started just before (the engine's beside thread) take the GIL and hold the driver
    back.
    ready/done: [L] int64 flags  x: [T, H] f32  ids: [T, K] int64  weights: [T, K] f32
    out: [T, H] f32, rows :n used. stamps: [L, 2] int64 kernel cycle stamps (optional).
    one_region: run region_driver.drive_in_one_region (default: runs_one_region), else
    packed_moe_kernel a layer. deferred: [L] int64 experts a row of rows :rows defers at each
    layer (deferral.py; its last entry must be 0), default none. starts: [threads + 1] int64
    the one region's start stamps (region_driver; optional).
    The call -> layers completed: len(layers), or the layer whose inputs did not come within
    timeout_cycles (its done flag and the later ones are not set), or NOT_TOGETHER: the one
    region's workers did not all run at once, no flag was touched (call again with
    one_region=False)."""
    num_layers = len(layers.per_layer)
    if stamps is None:
        stamps = np.empty((num_layers, 2), np.int64)
    if deferred is None:
        deferred = np.zeros(num_layers, np.int64)
    elif deferred.shape != (num_layers,) or (num_layers and deferred[-1] != 0):
        raise ValueError("deferred: one count a layer, the last 0 (deferral.deferred_ks)")
    if one_region is None:
        one_region = runs_one_region(layers)
    threads = numba.get_num_threads()
    if one_region:
        if layers.table is None:
            raise ValueError("one_region needs layers of one H and I (PackedLayers.table)")
        if starts is None or starts.shape[0] < threads + 1:
            starts = np.empty(threads + 1, np.int64)
        return partial(drive_in_one_region, layers.tiles, ready, done, seq, n, x, ids, weights,
                       out, *layers.table, deferred, rows, threads, timeout_cycles, stamps,
                       starts, _meet_cycles())
    return partial(_drive, layers.tiles, ready, done, seq, n, x, ids, weights, out,
                   layers.per_layer, deferred, rows, threads, timeout_cycles, stamps)
