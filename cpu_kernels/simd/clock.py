"""A cycle counter readable inside numba kernels and from Python, for latency measurements.

`cycles()` is the CPU's time-stamp counter (one rdtsc via llvm.readcyclecounter): invariant on
the machines we run on (constant_tsc, nonstop_tsc), so stamps taken on different cores compare.
Kernels write it into a caller's `stamps` array; Python reads it through `now_cycles()`.
"""

from __future__ import annotations

import time

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def cycles(typingctx):
    """The time-stamp counter, int64."""
    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.IntType(64), [])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.readcyclecounter")
        return builder.call(fn, [])
    return types.int64(), codegen


@njit(cache=True)
def now_cycles() -> int:
    return cycles()


def cycles_per_us(interval_s: float = 0.02) -> float:
    """Counter ticks per microsecond, measured against time.perf_counter over `interval_s`."""
    now_cycles()  # compiled before timing
    t0, c0 = time.perf_counter(), now_cycles()
    while time.perf_counter() - t0 < interval_s:
        pass
    t1, c1 = time.perf_counter(), now_cycles()
    return (c1 - c0) / ((t1 - t0) * 1e6)
