"""Tasks of unequal cost shared out as threads free up, inside numba's parallel loops.

numba's prange splits its range into one contiguous block per thread up front (the omp layer
ignores `set_parallel_chunksize` here: measured, numba 0.68). The MoE's phase-1 tasks are
(expert, rows) pairs whose cost follows the expert's token count (1 to 9 at T=32 over 64
experts, or AMX next to VNNI experts in one call), so a static split left the busiest thread
~20% over the mean (simulated over random routings). Instead every thread runs

    for w in prange(threads):
        c = claim(counter)
        while c < num_chunks:
            ... tasks c * CHUNK ... (c + 1) * CHUNK - 1 ...
            c = claim(counter)

where `claim` is one atomic fetch-and-add on counter[0] (an int64 array of 1, zeroed per call:
`counters`). Each task's output is its own, so results do not depend on which thread ran it.

Why `counters` and not np.zeros: in a parallel=True function numba turns np.zeros (np.ones,
array expressions) outside the prange into a parallel loop of its own, one more start and join
of the thread team (docs/serving.md has what that cost); an njit function without `parallel`
keeps it one serial loop.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic


@njit(cache=True)
def counters(shape) -> np.ndarray:
    """int64 zeros of `shape` (an int or a tuple), allocated without a parallel loop."""
    return np.zeros(shape, np.int64)


@intrinsic
def claim(typingctx, counter):
    """The value of counter[0] before adding 1 to it, atomically (sequentially consistent)."""
    if not (isinstance(counter, types.Array) and counter.dtype == types.int64):
        return None

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        return builder.atomic_rmw("add", ary.data, ir.Constant(ir.IntType(64), 1), "seq_cst")
    return types.int64(counter), codegen

