"""Where the expert kernels run: NUMA nodes (sysfs), physical cores (psutil), worker groups.

A worker group is one pinned set of CPUs with a thread count: one group per NUMA node, or a
single unpinned group on a one-node machine (the default there, which changes nothing).
`numa_nodes` overrides the detected count; when it differs from the machine's, the allowed CPUs
are split into that many contiguous groups, which lets tests run the multi-node path on one node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SYS_NODES = Path("/sys/devices/system/node")


@dataclass(frozen=True)
class WorkerGroup:
    """`num_threads` kernel threads on `cpus` (None: not pinned)."""

    cpus: tuple[int, ...] | None
    num_threads: int


def parse_cpulist(text: str) -> tuple[int, ...]:
    """sysfs cpulist ("0-3,8,10-11") -> CPU ids."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            cpus += range(int(lo), int(hi or lo) + 1)
    return tuple(cpus)


def detect_nodes(root: Path = SYS_NODES) -> list[tuple[int, ...]]:
    """The CPUs of each NUMA node that this process may run on (nodes without any are left out);
    one node of all allowed CPUs where sysfs has no node directories."""
    allowed = os.sched_getaffinity(0)
    nodes = []
    for d in sorted(root.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpus = tuple(c for c in parse_cpulist((d / "cpulist").read_text()) if c in allowed)
        if cpus:
            nodes.append(cpus)
    return nodes or [tuple(sorted(allowed))]


def physical_cores() -> int:
    import psutil

    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def default_threads() -> int:
    """Physical cores minus one (left to the Python thread that drives the GPU), at least 1."""
    return max(1, physical_cores() - 1)


def plan_groups(threads: int | None = None, numa_nodes: int | None = None) -> list[WorkerGroup]:
    """Worker groups for `threads` kernel threads in all (default: `default_threads()`)."""
    threads = default_threads() if threads is None else threads
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    nodes = detect_nodes()
    if numa_nodes is not None and numa_nodes < 1:
        raise ValueError(f"numa_nodes must be at least 1, got {numa_nodes}")
    count = len(nodes) if numa_nodes is None else numa_nodes
    if count == 1:
        return [WorkerGroup(None, threads)]
    if count != len(nodes):  # simulated nodes: contiguous runs of the allowed CPUs
        cpus = [c for node in nodes for c in node]
        if count > len(cpus):
            raise ValueError(f"numa_nodes={count} needs as many CPUs, {len(cpus)} allowed")
        nodes = [tuple(cpus[len(cpus) * i // count:len(cpus) * (i + 1) // count])
                 for i in range(count)]
    if threads < count:
        raise ValueError(f"{threads} threads cannot serve {count} NUMA nodes (one each at least)")
    return [WorkerGroup(cpus, threads // count + (i < threads % count))
            for i, cpus in enumerate(nodes)]
