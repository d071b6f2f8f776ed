"""A CUDA graph launched through the driver without the GIL (hybrid/engine/graphs/launch.py)
does what replay() does, on the stream given, from the thread that captured it and from another
(the whole-step graphs launch their rest from a thread of their own)."""

from __future__ import annotations

import threading

import pytest
import torch

from hybrid.engine.graphs.launch import launch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


def _graph(x: torch.Tensor) -> torch.cuda.CUDAGraph:
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        x.add_(1)
    return g


def test_launch_equals_replay() -> None:
    x = torch.zeros(4, device="cuda")
    g = _graph(x)
    x.zero_()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    launch(g, stream)
    launch(g, stream)
    stream.synchronize()
    assert x.tolist() == [2.0] * 4
    g.replay()
    torch.cuda.synchronize()
    assert x.tolist() == [3.0] * 4


def test_launch_from_another_thread() -> None:
    x = torch.zeros(4, device="cuda")
    g = _graph(x)
    x.zero_()
    torch.cuda.synchronize()
    stream, errors = torch.cuda.current_stream(), []

    def other() -> None:
        try:
            torch.cuda.set_device(x.device)
            launch(g, stream)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
    t = threading.Thread(target=other)
    t.start()
    t.join()
    torch.cuda.synchronize()
    assert not errors and x.tolist() == [1.0] * 4
