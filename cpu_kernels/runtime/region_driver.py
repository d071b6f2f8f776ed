"""Every MoE layer of one step inside ONE parallel region: layer_driver's protocol without a
parallel region started per kernel phase.

Why: packed_moe_kernel opens four parallel regions a layer (x's quantization, phase 1, h's
quantization, phase 2); each start and join wakes and waits for every worker, and between two
layers the workers idle through the GPU's attention, long enough to go to sleep. Here
the workers never leave the region: they spin on the layer's ready flag with the driving thread,
and the phases are separated by spin barriers.

Per layer, every one of the `threads` workers (one prange iteration each; all must run at once,
which numba's omp layer gives: layer_driver.one_region_safe; the meeting below catches a team
that came short):
    worker 0 waits ready[l] == seq (with the timeout) and publishes go[l] = GO (or ABORT);
    all: route (each its own copy: n*K ids), quantize their share of x's 32-groups;  barrier
    phase 1: (expert, 16 rows) tasks claimed one at a time, h = w * swiglu;          barrier
    all: quantize their share of h's 32-groups;                                      barrier
    phase 2: H's 16-row blocks claimed one at a time, each summed over experts into out
             (and the previous layer's deferred sum added, with deferral);
    the last worker to finish raises done[l] = seq;
    with deferral (deferral.py): the same phases again on the layer's deferred slots, into the
    carry, while the GPU runs the next layer (worker 0 split the slots and kept copies of the
    layer's inputs before its GO: once done is raised the GPU may overwrite them).
Tasks are claimed singly (packed_moe claims 4): at decode sizes a phase is ~9 tasks a worker, and
the phase ends when its slowest worker does.
The math, and each element's order of operations, is packed_moe_kernel's: out is bit-identical.
Every layer must have the same H and I (DeepSeek's do; layer_table checks).
stamps[l] = (worker 0 saw ready[l], the last worker raised done[l]), cycle counter; starts =
(the call entered, then each worker's arrival at the meeting below): where a step's first layer
is seen late, whether the call or its team started late.

Before the first layer the workers meet: worker 0 waits (up to `meet_cycles`) for all of them
and publishes whether they came. Where the layer gave the region fewer threads than iterations
(OMP_DYNAMIC, a thread limit), some iterations would queue behind others on one thread and the
first barrier would never open; instead every worker returns NOT_TOGETHER before touching a
flag, and the caller runs the layer loop. Worker 0 always runs at once (it starts the first
thread's share), so a worker waiting for its word never waits on a queued one.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from cpu_kernels.exact.routing import route
from cpu_kernels.fast.packed_moe import down_pair, gate_up_task
from cpu_kernels.fast.q8_activations import quantize_row
from cpu_kernels.runtime.deferral import split_deferred
from cpu_kernels.runtime.handshake import load_acquire, spin_pause, store_release, wait_equal
from cpu_kernels.simd.clock import cycles
from cpu_kernels.simd.task_queue import claim, counters

f32 = np.float32
GO, ABORT = 1, 2  # worker 0's word per layer (0: not yet decided)
NOT_TOGETHER = -1  # drive_in_one_region's answer when its workers did not all run at once


@njit(nogil=True, cache=True)
def barrier(bar: np.ndarray, threads: int) -> None:
    """Wait until all `threads` workers called it. bar: [2] int64 (arrivals, generation), zeros
    before the region. The generation is read before arriving: it cannot move until this worker
    has arrived, so a worker never mistakes the previous barrier's release for this one's."""
    generation = load_acquire(bar, 1)
    if claim(bar) == threads - 1:
        store_release(bar, 0, 0)
        store_release(bar, 1, generation + 1)
    else:
        while load_acquire(bar, 1) == generation:
            spin_pause()


@njit(nogil=True, cache=True)
def quantize_groups(x: np.ndarray, lo_off: int, xq: np.ndarray, dx: np.ndarray,
                    xqsum: np.ndarray, xsum16: np.ndarray, worker: int, threads: int) -> None:
    """This worker's share (every threads-th) of the 32-groups of x [N, C]: quantize_row on
    one group at a time into xq [P*Nmax, C] (lo plane, if lo_off, lo_off elements on), dx, xqsum
    [Nmax, C/32], xsum16 [Nmax, C/16]."""
    rows, cols = x.shape
    groups = cols // 32
    lo_rows = lo_off // cols
    for j in range(worker, rows * groups, threads):
        t, g = j // groups, j % groups
        c0 = 32 * g
        lo = xq[lo_rows + t, c0:c0 + 32] if lo_off else xq[t, :0]
        quantize_row(x[t, c0:c0 + 32], xq[t, c0:c0 + 32], lo, dx[t, g:g + 1],
                     xqsum[t, g:g + 1], xsum16[t, 2 * g:2 * g + 2])


@njit(nogil=True, cache=True)
def least(values: np.ndarray) -> int:
    """values.min() of an int64 array, as a serial loop (in the parallel function, a reduction
    would be a parallel loop: simd/task_queue.py)."""
    low = values[0]
    for v in values[1:]:
        low = min(low, v)
    return low


@intrinsic
def _pointer(typingctx, address):
    """An int64 address as a void pointer (for numba.carray)."""
    if not isinstance(address, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)
    return types.voidptr(address), codegen


@njit(inline="always", cache=True)
def _matrix(table, layer, which):
    """Matrix `which` (0 gate, 1 up, 2 down) of `layer`: [E, rows/8, bytes] uint8 at its address."""
    d = table[layer, which]
    return carray(_pointer(d[0]), (d[1], d[2], d[3]), dtype=np.uint8)


def layer_table(per_layer: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """drive_in_one_region's view of layer_driver's per-layer tuples (a parallel region takes
    arrays, not tuples of arrays): table [L, 3, 4] int64 (address, E, rows/8, bytes) of gate,
    up, down; qtypes [L, 3] int64; limits [L] f32. The caller keeps `per_layer` alive.
    None where the region cannot run them: layers of other widths (its buffers are sized once)
    or a matrix that is not C-contiguous (addressed as one block)."""
    if len({(g[1].shape[1], g[5].shape[1]) for g in per_layer}) != 1 or not all(
            g[i].flags.c_contiguous for g in per_layer for i in (1, 3, 5)):
        return None
    table = np.zeros((len(per_layer), 3, 4), np.int64)
    qtypes = np.zeros((len(per_layer), 3), np.int64)
    limits = np.zeros(len(per_layer), f32)
    for layer, g in enumerate(per_layer):
        for which in range(3):
            data = g[2 * which + 1]
            table[layer, which] = (data.ctypes.data, *data.shape)
            qtypes[layer, which] = g[2 * which]
        limits[layer] = g[6]
    return table, qtypes, limits


@njit(inline="always", cache=True)
def _experts(tiles, table, qtypes, limits, layer, x, ids, weights, out, add, carry, xq, dx, xqsum,
             xsum16, h, hq, hd, hqsum, hsum16, claims, bar, worker, threads):
    """Every worker's share of one layer's experts: out [n, H] = MoE(x [n, H], ids, weights
    [n, K]), plus carry [n, H] where `add`; claims: [2] int64 task counters (zeros), phase 1
    and phase 2. Returns once this worker has no phase-2 task left (others may still run)."""
    n, hidden = x.shape
    inter = h.shape[1]
    slots = h.shape[0]
    gate_pk, up_pk, down_pk = (_matrix(table, layer, 0), _matrix(table, layer, 1),
                               _matrix(table, layer, 2))
    gate_type, up_type, down_type = qtypes[layer, 0], qtypes[layer, 1], qtypes[layer, 2]
    expert_ids, offsets, token_ids, slot_w = route(ids, weights, gate_pk.shape[0])
    num_used = expert_ids.shape[0]
    used_slots = token_ids.shape[0]
    quantize_groups(x, 0, xq, dx, xqsum, xsum16, worker, threads)
    barrier(bar, threads)
    num_tasks = num_used * ((gate_pk.shape[1] + 1) // 2)
    flat16 = xsum16.reshape(-1)
    task = claim(claims[0:])
    while task < num_tasks:
        gate_up_task(tiles, gate_type, gate_pk, up_type, up_pk, task, xq, dx, xqsum,
                     flat16, expert_ids, offsets, token_ids, slot_w, h, f32(limits[layer]))
        task = claim(claims[0:])
    barrier(bar, threads)
    quantize_groups(h[:used_slots], slots * inter, hq, hd, hqsum, hsum16, worker, threads)
    barrier(bar, threads)
    pairs_h = (down_pk.shape[1] + 1) // 2
    pair = claim(claims[1:])
    while pair < pairs_h:
        down_pair(tiles, down_type, down_pk, pair, hq, slots * inter, hd, hqsum,
                  hsum16.reshape(-1), expert_ids, offsets, token_ids, out)
        if add:  # the block is final: the previous layer's deferred sum joins it
            r0 = 16 * pair
            for t in range(n):
                for r in range(r0, min(r0 + 16, hidden)):
                    out[t, r] += carry[t, r]
        pair = claim(claims[1:])


@njit(parallel=True, nogil=True, cache=True)
def drive_in_one_region(tiles, ready, done, seq, n, x, ids, weights, out, table, qtypes, limits,
                        deferred, rows, threads, timeout_cycles, stamps, starts, meet_cycles):
    # x: [T, H] f32  ids: [T, K] int64  weights: [T, K] f32  out: [T, H] f32 (rows :n used)
    # table, qtypes, limits: layer_table's  deferred: [L] int64 (deferral.py)  stamps: [L, 2]
    # starts: [>= threads + 1] int64  -> layers completed (as layer_driver._drive), or
    # NOT_TOGETHER (no flag touched)
    starts[0] = cycles()
    num_layers = table.shape[0]
    hidden, top_k = x.shape[1], ids.shape[1]
    inter = 8 * table[0, 0, 2]
    slots = n * top_k
    xq = np.empty((n, hidden), np.int8)
    dx = np.empty((n, hidden // 32), f32)
    xqsum = np.empty((n, hidden // 32), f32)
    xsum16 = np.empty((n, hidden // 16), np.int32)
    h = np.empty((slots, inter), f32)  # [N, I] in slot order
    hq = np.empty((2 * slots, inter), np.int8)  # hi plane rows :slots, lo plane after
    hd = np.empty((slots, inter // 32), f32)
    hqsum = np.empty((slots, inter // 32), f32)
    hsum16 = np.empty((slots, inter // 16), np.int32)
    # deferral: worker 0 splits a layer's slots and keeps its inputs before the GO
    carry = np.empty((n, hidden), f32)  # [n, H] the last layer's deferred sum
    x_later, w_later = np.empty((n, hidden), f32), np.empty((n, top_k), f32)
    now, later = np.empty((n, top_k), np.int64), np.empty((n, top_k), np.int64)
    # counters, not np.zeros: each np.zeros here would be a parallel loop (task_queue.py)
    go = counters(num_layers)  # GO / ABORT, worker 0's decision
    claims = counters((num_layers, 4))  # next task: phases 1, 2; deferred 1, 2
    finished = counters(num_layers)
    bar = counters(2)
    reached = counters(threads)  # per worker: the layers it completed, or NOT_TOGETHER
    meet = counters(2)  # workers arrived, worker 0's word (GO / ABORT)
    for worker in prange(threads):
        starts[1 + worker] = cycles()
        reached[worker] = num_layers  # unless it stops short below
        claim(meet)
        if worker == 0:
            start = cycles()
            while load_acquire(meet, 0) < threads and cycles() - start < meet_cycles:
                spin_pause()
            store_release(meet, 1, GO if load_acquire(meet, 0) == threads else ABORT)
        while load_acquire(meet, 1) == 0:
            spin_pause()
        if load_acquire(meet, 1) != GO:
            reached[worker] = NOT_TOGETHER
            continue
        for layer in range(num_layers):
            defer = deferred[layer] > 0 and rows > 0
            held = layer > 0 and deferred[layer - 1] > 0 and rows > 0
            if worker == 0:
                ok = wait_equal(ready, layer, seq, timeout_cycles)
                stamps[layer, 0] = cycles()
                if ok:  # now: ids less the deferred slots (all of them where none defers)
                    split_deferred(ids[:n], weights[:n], deferred[layer] if defer else 0, rows,
                                   now, later)
                if ok and defer:  # once done is raised the GPU may write the next layer's
                    x_later[:, :] = x[:n]
                    w_later[:, :] = weights[:n]
                store_release(go, layer, GO if ok else ABORT)
            while load_acquire(go, layer) == 0:
                spin_pause()
            if load_acquire(go, layer) != GO:
                reached[worker] = layer
                break
            _experts(tiles, table, qtypes, limits, layer, x[:n], now, weights[:n], out[:n], held,
                     carry, xq, dx, xqsum, xsum16, h, hq, hd, hqsum, hsum16, claims[layer, 0:2],
                     bar, worker, threads)
            if claim(finished[layer:]) == threads - 1:
                stamps[layer, 1] = cycles()
                store_release(done, layer, seq)
            if defer:  # while the GPU runs the next layer's attention
                _experts(tiles, table, qtypes, limits, layer, x_later, later, w_later, carry,
                         False, carry, xq, dx, xqsum, xsum16, h, hq, hd, hqsum, hsum16,
                         claims[layer, 2:4], bar, worker, threads)
    return least(reached)
