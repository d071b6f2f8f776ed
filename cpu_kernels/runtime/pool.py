"""A persistent worker pool that runs the routed-expert MoE asynchronously.

`submit()` checks its inputs and returns a `MoEJob` at once; `job.wait()` returns `out` when the
kernels are done (or raises their exception), so the caller's thread can drive the GPU meanwhile.

Each worker group (topology.plan_groups: one per NUMA node, or one unpinned group) is a Python
thread that pins itself to its node's CPUs, sets numba's thread count to its share and then
waits on a queue; it runs the numba kernels, which release the GIL (nogil) and spread over
numba's threading layer, whose threads inherit the pin. Group n computes slice n of the
intermediate rows (placement.py) into its own partial output; the last group to finish adds the
partials into `out` in group order. Jobs run in submission order; several can be in flight.

NOTE: with more than one group, kernels run concurrently from several threads, which numba's
`workqueue` threading layer does not support: the pool then needs the `omp` or `tbb` layer.
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future

import numba
import numpy as np

from cpu_kernels.exact.matmul import check_mode
from cpu_kernels.fast.packed import PackedExperts, pack
from cpu_kernels.fast.q8_activations import Q8Activations
from cpu_kernels.fast.tile_set import TileSet, tile_set
from cpu_kernels.formats.weights import ExpertWeights
from cpu_kernels.moe import check_inputs, run_moe
from cpu_kernels.runtime.placement import ExpertSlice, PlacedExperts, packs, slice_align, split_rows
from cpu_kernels.runtime.topology import WorkerGroup, plan_groups
from cpu_kernels.simd.clock import now_cycles


class MoEJob:
    """One submitted MoE call. `stamps[n]` (cycle counter, for latency reports): group n took
    the job from its queue, its kernel started, its kernel ended; `submitted` when submit began."""

    def __init__(self, out: np.ndarray, partials: list[np.ndarray], num_parts: int) -> None:
        self.submitted = now_cycles()
        self.out = out
        self._partials = partials  # [T, H] each, groups 1..
        self._left = num_parts
        self._error: BaseException | None = None
        self._count_lock = threading.Lock()
        # NOTE: a bare lock, held until the job is done, is the done signal: releasing and
        # acquiring it are single C calls (threading.Event's Python-level Condition costs
        # ~50-100 us on cold caches after a kernel).
        self._done = threading.Lock()
        self._done.acquire()
        self.stamps = np.zeros((num_parts, 3), np.int64)

    def done(self) -> bool:
        return not self._done.locked()

    def wait(self, timeout: float | None = None) -> np.ndarray:
        """Block until the job is done; return `out` or raise the first worker exception."""
        if not self._done.acquire(timeout=-1 if timeout is None else timeout):
            raise TimeoutError(f"MoE job not done after {timeout} s")
        self._done.release()  # later wait() calls return at once
        if self._error is not None:
            raise self._error
        return self.out

    def _part_done(self, error: BaseException | None) -> None:
        with self._count_lock:
            self._error = self._error or error
            self._left -= 1
            last = self._left == 0
        if last:
            if self._error is None:
                for p in self._partials:  # group order, whichever group finished last
                    self.out += p
            self._done.release()


def _run_part(job: MoEJob, n: int, x: np.ndarray, topk_ids: np.ndarray,
              topk_weights: np.ndarray, placed: PlacedExperts, out: np.ndarray,
              tiles: TileSet) -> None:
    job.stamps[n, 0] = now_cycles()
    error = None
    try:
        sl = placed.slices[n]
        run_moe(x, topk_ids, topk_weights, placed.experts, sl.packed, sl.i_lo, out, placed.fast,
                job.stamps[n, 1:], sl.i_hi, tiles=tiles)
    except BaseException as e:  # noqa: BLE001 - handed to wait()
        error = e
    job._part_done(error)


class _GroupThread:
    """One worker group: a thread running the callables put on its queue, in order."""

    def __init__(self, index: int, group: WorkerGroup) -> None:
        self.group = group
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=f"cpu-moe-{index}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        if self.group.cpus is not None:
            os.sched_setaffinity(0, self.group.cpus)  # this thread; threads it starts inherit it
        numba.set_num_threads(self.group.num_threads)  # per calling thread
        while (item := self._queue.get()) is not None:
            fn, args = item
            fn(*args)

    def run(self, fn: Callable, *args) -> None:
        self._queue.put((fn, args))

    def call(self, fn: Callable, *args) -> Future:
        """Run fn(*args) on this thread; its result or exception comes back in a Future."""
        fut: Future = Future()

        def task() -> None:
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001
                fut.set_exception(e)
        self.run(task)
        return fut

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join()


def _stop_all(threads: list[_GroupThread]) -> None:
    for t in threads:
        t.stop()


class MoEPool:
    """Persistent kernel threads: `threads` in all (default: physical cores - 1, at least 1),
    one group per NUMA node (`numa_nodes` overrides the detected count, see topology.py)."""

    def __init__(self, threads: int | None = None, numa_nodes: int | None = None) -> None:
        groups = plan_groups(threads, numa_nodes)
        most = max(g.num_threads for g in groups)
        if most > numba.config.NUMBA_NUM_THREADS:
            raise ValueError(f"{most} threads in a group, numba allows {numba.config.NUMBA_NUM_THREADS}"
                             " (NUMBA_NUM_THREADS)")
        if len(groups) > 1:
            _require_threadsafe_layer()
        self._threads = [_GroupThread(i, g) for i, g in enumerate(groups)]
        self._tiles = tile_set(())  # every type of the packed layers placed here
        self._finalizer = weakref.finalize(self, _stop_all, self._threads)

    @property
    def groups(self) -> list[WorkerGroup]:
        return [t.group for t in self._threads]

    @property
    def tiles(self) -> TileSet:
        """The tile set the pool's kernels compile in: every type of the packed layers placed
        so far (one kernel for all layers; placing a layer of a new type later compiles
        another)."""
        return self._tiles

    def place(self, experts: ExpertWeights, mode: str = "exact") -> PlacedExperts:
        """The layer's experts split over the groups; `fast` packs each slice on its group's
        thread (first touch places it on the node). Call once per layer, at load time."""
        placed = self._place(experts, mode)
        added = [m.qtype for sl in placed.slices if sl.packed is not None
                 for m in (sl.packed.gate, sl.packed.up, sl.packed.down)]
        if added:  # once a layer, not per job: submit and run_inline pass it every call
            self._tiles = tile_set((*self._tiles.qtypes, *added))
        return placed

    def _place(self, experts: ExpertWeights, mode: str) -> PlacedExperts:
        fast = check_mode(mode)
        inter = experts.intermediate_size
        if len(self._threads) == 1:
            packed = pack(experts).packed if fast else None
            return PlacedExperts(experts, fast, (ExpertSlice(0, inter, packed),))
        bounds = split_rows(inter, len(self._threads), slice_align(experts))
        if not (fast and packs(experts)):
            return PlacedExperts(experts, fast, tuple(ExpertSlice(lo, hi) for lo, hi in bounds))
        futures = [t.call(PackedExperts.of, experts, lo, hi)
                   for t, (lo, hi) in zip(self._threads, bounds)]
        return PlacedExperts(experts, fast, tuple(ExpertSlice(lo, hi, f.result())
                                                  for (lo, hi), f in zip(bounds, futures)))

    def submit(self, x: np.ndarray, topk_ids: np.ndarray, topk_weights: np.ndarray,
               experts: PlacedExperts, out: np.ndarray) -> MoEJob:
        """Start moe_forward(x, topk_ids, topk_weights, experts, out) and return at once.

        Shapes: see moe_forward. Bad inputs raise here; errors in the kernels raise from
        `wait()`. NOTE: x, topk_ids, topk_weights and out must stay unchanged until then.
        """
        if not self._finalizer.alive:
            raise RuntimeError("submit() on a closed MoEPool")
        if len(experts.slices) > len(self._threads):
            raise ValueError(f"experts placed for {len(experts.slices)} groups, pool has "
                             f"{len(self._threads)}: place them with this pool")
        check_inputs(x, topk_ids, topk_weights, experts.experts, out)
        partials = [np.empty_like(out) for _ in experts.slices[1:]]
        job = MoEJob(out, partials, len(experts.slices))
        for n, dst in enumerate([out, *partials]):
            self._threads[n].run(_run_part, job, n, x, topk_ids, topk_weights, experts, dst,
                                 self.tiles)
        return job

    @property
    def can_run_inline(self) -> bool:
        """One unpinned group: the caller's thread may run the kernels itself (run_inline)."""
        return len(self._threads) == 1 and self._threads[0].group.cpus is None

    def run_inline(self, x: np.ndarray, topk_ids: np.ndarray, topk_weights: np.ndarray,
                   experts: PlacedExperts, out: np.ndarray, stamps: np.ndarray | None = None
                   ) -> np.ndarray:
        """moe_forward(x, topk_ids, topk_weights, experts, out) in the calling thread, on the
        group's thread count: for a caller that would only wait for the job, it saves the two
        thread hand-offs of submit() and wait() (~40 us each). Needs `can_run_inline` and no
        job in flight. stamps: [2] int64, the kernel's cycle stamps (optional)."""
        self.use_inline_threads()
        if len(experts.slices) != 1:
            raise ValueError("run_inline needs a pool of one unpinned group")
        check_inputs(x, topk_ids, topk_weights, experts.experts, out)
        sl = experts.slices[0]
        run_moe(x, topk_ids, topk_weights, experts.experts, sl.packed, sl.i_lo, out,
                experts.fast, np.empty(2, np.int64) if stamps is None else stamps, sl.i_hi,
                tiles=self.tiles)
        return out

    def use_inline_threads(self) -> None:
        """Give the calling thread the group's numba thread count (numba keeps one per thread),
        so kernels it calls itself run as the group's would. Needs `can_run_inline`."""
        if not self.can_run_inline:
            raise ValueError("run_inline needs a pool of one unpinned group")
        threads = self._threads[0].group.num_threads
        if numba.get_num_threads() != threads:
            numba.set_num_threads(threads)

    def close(self) -> None:
        """Stop the threads after the jobs already submitted."""
        self._finalizer()

    def __enter__(self) -> MoEPool:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _require_threadsafe_layer() -> None:
    Q8Activations.of(np.empty((0, 32), np.float32))  # a parallel kernel: starts numba's layer
    if numba.threading_layer() == "workqueue":
        raise RuntimeError("several NUMA worker groups need numba's omp or tbb threading layer "
                           "(workqueue runs one parallel kernel at a time)")
