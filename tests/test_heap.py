"""The serving process's collector policy (hybrid/engine/heap.py): start-up's objects frozen,
and the pauses a benchmark attributes to its steps."""

from __future__ import annotations

import gc
import sys

from hybrid.engine.heap import CollectorPauses, freeze_start_up_heap


def test_freezing_moves_start_up_objects_out_of_collections() -> None:
    kept = [[i] for i in range(1000)]  # tracked containers alive at "start-up"
    # no other thread runs between the freeze and the count: an object it freed would leave
    # the frozen generation (threads earlier tests left in this process, idle or not)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        frozen = freeze_start_up_heap()
        count = gc.get_freeze_count()
    finally:
        sys.setswitchinterval(interval)
    try:
        assert frozen >= len(kept) and count == frozen
        assert not any(gc.is_tracked(x) and x in gc.get_objects(2) for x in kept[:3])
    finally:
        gc.unfreeze()  # this test process builds engines again and again: give them back
    assert gc.get_freeze_count() == 0


def test_pauses_are_heard_and_taken_piecewise() -> None:
    pauses = CollectorPauses()
    with pauses:
        gc.collect()
        ms, generation = pauses.take()
        assert ms > 0 and generation == 2
        assert pauses.take() == (0.0, -1)
        gc.collect(0)
        assert pauses.take()[1] == 0
    assert pauses._hear not in gc.callbacks
    gc.collect()
    assert pauses.take() == (0.0, -1)  # not listening any more
