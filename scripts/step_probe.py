"""Where an engine step's time went, step by step: a benchmark's tool for the rare slow step
(issue 16's inter-token latency beside a long prompt: one step in a hundred took 40-55 ms more).

Per step it records the wall time and
- the host's time inside the model runner's parts (the batch's forward, starting a layered
  prompt chunk and its next layers: layered_prefill.py), and the GPU's time for each (CUDA
  events around them on the model's stream; the sampling after them is the rest);
- what the process paid the OS meanwhile (page faults, context switches, getrusage) and the
  CUDA caching allocator's new device allocations, retries and whole-device syncs;
- the time Python's cyclic collector ran (hybrid/engine/heap.py).
It wraps the runner's methods on the instance (nothing in hybrid/ changes) and costs a few
microseconds a step.
"""

from __future__ import annotations

import resource
import time

import torch

from hybrid.engine.heap import CollectorPauses

_ALLOCATOR = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")
_RUSAGE = ("ru_minflt", "ru_majflt", "ru_nvcsw", "ru_nivcsw")
# the runner's parts timed: the batch's forward, starting a layered chunk (its ForwardBatch and
# the first expert copies), the stream's part of that, the chunk's next layers
_HALVES = ("forward", "start", "stream_begin", "layered")


class StepProbe:
    def __init__(self, runner) -> None:
        self.runner = runner
        self.cuda = runner.device.type == "cuda"
        self.pauses = CollectorPauses()
        self.rows: list[dict] = []
        self._host = dict.fromkeys(_HALVES, 0.0)
        self._marks: list = []
        self._wrapped: list[tuple[object, str]] = []

    def __enter__(self) -> None:
        self.pauses.__enter__()
        targets = [(self.runner, "_run", "forward"), (self.runner, "_start_job", "start"),
                   (self.runner, "_advance_job", "layered")]
        if self.runner.stream is not None:
            targets.append((self.runner.stream, "begin", "stream_begin"))
        for owner, name, key in targets:
            setattr(owner, name, self._timed(getattr(owner, name), key))
            self._wrapped.append((owner, name))

    def __exit__(self, *exc) -> None:
        self.pauses.__exit__(*exc)
        for owner, name in self._wrapped:
            delattr(owner, name)  # the class's method again
        self._wrapped.clear()

    def _timed(self, fn, key: str):
        def run(*args, **kwargs):
            t = time.perf_counter()
            self._mark(f"{key}_start")
            try:
                return fn(*args, **kwargs)
            finally:
                self._mark(f"{key}_end")
                self._host[key] += (time.perf_counter() - t) * 1e3
        return run

    def _mark(self, name: str) -> None:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self._marks.append((name, e))

    def _counters(self) -> dict:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        out = {k: getattr(ru, k) for k in _RUSAGE}
        if self.cuda:
            stats = torch.cuda.memory_stats(self.runner.device)
            out.update({k: stats.get(k, 0) for k in _ALLOCATOR})
        return out

    def step(self, step_fn) -> dict:
        """Run `step_fn()` (one engine step) and record it; -> its row."""
        before, t0 = self._counters(), time.perf_counter()
        self._host = dict.fromkeys(_HALVES, 0.0)
        self._marks = []
        self._mark("start")
        step_fn()
        wall = (time.perf_counter() - t0) * 1e3
        self._mark("end")
        after = self._counters()
        row = {"wall_ms": round(wall, 2)}
        row.update({f"host_{k}_ms": round(v, 2) for k, v in self._host.items()})
        if self.cuda:
            self._marks[-1][1].synchronize()
            marks = dict(self._marks)
            start = marks["start"]
            for key in _HALVES:
                if f"{key}_end" in marks:
                    row[f"gpu_{key}_ms"] = round(
                        marks[f"{key}_start"].elapsed_time(marks[f"{key}_end"]), 2)
            row["gpu_step_ms"] = round(start.elapsed_time(marks["end"]), 2)
        row.update({k.removeprefix("ru_").removeprefix("num_"): after[k] - before[k]
                    for k in after})
        row["gc_ms"], row["gc_generation"] = self.pauses.take()
        self.rows.append(row)
        return row


def slowest(rows: list[dict], n: int = 3) -> list[dict]:
    """The n slowest steps, each with its index and the median step beside it for contrast."""
    if not rows:
        return []
    walls = sorted(r["wall_ms"] for r in rows)
    median = walls[len(walls) // 2]
    ranked = sorted(range(len(rows)), key=lambda i: -rows[i]["wall_ms"])[:n]
    return [{"step": i, "median_wall_ms": median, **rows[i]} for i in ranked]
