"""captured(): a CUDA graph's capture with Python's garbage collector off and restored as found
(a collection inside a capture that frees pinned memory aborts the process). The capture itself
needs CUDA (tests/gpu_kernels capture real graphs through it); here torch.cuda.graph is a
stand-in that records what the collector's switch was while it ran."""

from __future__ import annotations

import gc
from contextlib import contextmanager

import pytest
import torch

from hybrid.engine.graphs.capture import captured


@pytest.fixture
def seen(monkeypatch):
    states = []

    @contextmanager
    def graph(g, pool=None, stream=None):
        states.append(("enter", gc.isenabled(), g, pool))
        yield
        states.append(("exit", gc.isenabled(), g, pool))
    monkeypatch.setattr(torch.cuda, "graph", graph)
    enabled = gc.isenabled()
    yield states
    if enabled:
        gc.enable()


def test_no_collection_inside_and_the_switch_restored(seen):
    gc.enable()
    with captured("g", "pool"):
        assert not gc.isenabled()
    assert gc.isenabled()
    assert seen == [("enter", False, "g", "pool"), ("exit", False, "g", "pool")]


def test_a_failed_capture_restores_it_too(seen):
    gc.enable()
    with pytest.raises(RuntimeError, match="capture failed"), captured("g"):
        raise RuntimeError("capture failed")
    assert gc.isenabled()


def test_a_caller_that_turned_it_off_keeps_it_off(seen):
    gc.disable()
    with captured("g"):
        pass
    assert not gc.isenabled()
