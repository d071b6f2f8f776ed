"""Experts split across worker groups (NUMA nodes) by intermediate rows.

Group n computes the slice i_lo:i_hi of every expert's intermediate dimension: those rows of
gate/up, h for them, and down's matching columns, giving a partial [T, H] output; the partials
sum to the MoE because down is linear in h. Slice bounds fall on whole blocks of down's columns
(and on the packed layouts' groups of 8 rows), so every kernel runs unchanged on its slice.

In `fast` mode each slice is repacked by its own group's pinned thread: the copy's pages are
first touched, so placed, on that group's node. The GGUF blocks (`exact` mode, and types without
a packed layout) stay where they are, usually a memory map of the file: its page-cache pages
belong to whichever node first read them, first touch cannot move them, and copying them per
node would hold the experts twice. Those slices read the shared blocks through row and byte
ranges (moe.run_moe).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from cpu_kernels.fast.packed import ROWS, PackedExperts, can_pack
from cpu_kernels.formats import qtypes as qt
from cpu_kernels.formats.weights import ExpertWeights


@dataclass(frozen=True)
class ExpertSlice:
    """Intermediate rows i_lo:i_hi; `packed` holds exactly those rows (fast mode) or is None."""

    i_lo: int
    i_hi: int
    packed: PackedExperts | None = None


@dataclass(frozen=True)
class PlacedExperts:
    """One layer's experts as a pool runs them: `slices[n]` belongs to worker group n."""

    experts: ExpertWeights
    fast: bool
    slices: tuple[ExpertSlice, ...]


def slice_align(experts: ExpertWeights) -> int:
    """The granularity of slice bounds: down's block, 32-groups of h, packed row groups."""
    block = qt.BLOCK_GEOMETRY[experts.down.qtype][0]
    return math.lcm(block, qt.GROUP, ROWS)


def split_rows(inter: int, parts: int, align: int) -> list[tuple[int, int]]:
    """`parts` near-equal ranges covering 0:inter with bounds on multiples of `align`; fewer
    (never empty ones) when there are not enough aligned units."""
    units = inter // align
    if units * align != inter:
        raise ValueError(f"intermediate size {inter} is not a multiple of {align}")
    parts = max(1, min(parts, units))
    cuts = [units * i // parts * align for i in range(parts + 1)]
    return list(itertools.pairwise(cuts))


def packs(experts: ExpertWeights) -> bool:
    return all(can_pack(w.qtype) for w in (experts.gate, experts.up, experts.down))
