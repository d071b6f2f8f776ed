"""One CUDA graph captured with Python's cyclic garbage collector off.

A collection that runs inside a capture (any allocation may start one) can free tensors held in
a reference cycle; freeing pinned host memory records a CUDA event on the current stream, which
is the capturing one, so CUDA invalidates the capture and torch aborts the process
(docs/gpu-path.md has the case). torch.cuda.graph collects once before it begins; here nothing
is collected until it ends. The collector's switch is the interpreter's: it is restored as
found, so a caller that had turned it off keeps it off."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def captured(graph: torch.cuda.CUDAGraph, pool=None, stream=None) -> Iterator[None]:
    """`with torch.cuda.graph(graph, pool=pool, stream=stream)`, without garbage collection
    inside. A capture on another GPU than the first one captured needs a `stream` of its own
    there: torch's default capture stream is made once, on the GPU current then."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            yield
    finally:
        if enabled:
            gc.enable()
