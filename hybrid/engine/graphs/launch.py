"""A CUDA graph launched without holding the GIL.

torch's CUDAGraph.replay() holds the GIL through cudaGraphLaunch, whose host time grows with the
graph's nodes (hundreds of microseconds for the rest of a V2-Lite decode step). A thread that
launches the rest of a whole-step graph while the caller drives the CPU experts
(whole_step.py) then holds the caller back at its next Python line, before the experts' driver
is entered. A foreign call through ctypes releases the GIL, so this launches the instantiated
graph through the driver API: cuGraphLaunch on the graph's exec handle (the runtime's
cudaGraphExec_t is the driver's CUgraphExec, a stream the same in both APIs). That is all
replay() does for a graph that draws no random numbers (it would first advance the captured
generators' offsets): invariant, the decode step's graphs draw none (sampling runs after them).
Where the driver library or the handle cannot be had, or the driver refuses, replay() runs.
"""

from __future__ import annotations

import ctypes
import functools
import logging

import torch

log = logging.getLogger("hybrid.engine")


@functools.cache
def _cu_graph_launch():
    """libcuda's cuGraphLaunch(CUgraphExec, CUstream) -> CUresult, or None without it."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    fn = lib.cuGraphLaunch
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
    return fn


def launch(graph, stream: torch.cuda.Stream | None) -> None:
    """graph.replay() on `stream` (None: the current one), the GIL released during the launch
    where the driver can be called (the thread's current device must be the graph's)."""
    raw = getattr(graph, "raw_cuda_graph_exec", None)
    fn = _cu_graph_launch() if raw is not None and stream is not None else None
    if fn is not None:
        result = fn(raw(), stream.cuda_stream)
        if result == 0:
            return
        # nothing was launched: torch's own launch raises what is wrong, or works
        log.warning("cuGraphLaunch failed (CUresult %d); launching through torch", result)
    with torch.cuda.stream(stream):
        graph.replay()
