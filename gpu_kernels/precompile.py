"""Triton variants compiled on many threads: a dry run records the variants some work would
compile, then a pool of threads compiles them side by side.

Triton compiles a kernel variant the first time a launch needs it, on the launching thread,
and the launch waits: a serving process's warm-up steps compile their variants one after
another. Triton's compiler spends its time outside the GIL (its MLIR and LLVM passes release
it, ptxas is a process of its own), so threads compile variants side by side.

    if available(device):
        with recording() as recorded:      # a launch of a variant not compiled yet is recorded
            work()                         # and skipped: what it would write stays garbage
        pool = Precompile(recorded, threads)
        other_work()                       # runs while the pool compiles
        pool.wait()
        work()                             # compiles nothing it recorded

A dry run suits work whose results are thrown away and whose host-side flow and indexing
never read what a skipped launch writes: indices made on the host, or by torch ops that keep
them in range (the warm-up steps with their routed experts left out). Launches of variants
already compiled run as usual inside it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import torch

log = logging.getLogger("gpu_kernels")


def available(device: torch.device) -> bool:
    """Whether this Triton can record variants and compile them from the record (its JIT
    cache hook and JITFunction.preload) for launches on `device`."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    try:
        from triton import knobs
        from triton.runtime.jit import JITFunction
    except ImportError:
        return False
    return hasattr(knobs.runtime, "jit_cache_hook") and hasattr(JITFunction, "preload")


@contextmanager
def recording() -> Iterator[dict[tuple, tuple[object, str, int]]]:
    """Inside: each launch of a variant not compiled yet is skipped and recorded as
    {(id(kernel), device, its cache key): (the JITFunction, Triton's specialization data, the
    CUDA device index)}, once per variant and device. Not reentrant; no other thread may launch
    Triton kernels meanwhile (the hook is process-wide)."""
    from triton import knobs

    recorded: dict[tuple, tuple[object, str, int]] = {}

    def hook(*, key, fn, compile, **_) -> bool:
        data = compile.get("specialization_data") if isinstance(compile, dict) else None
        device = compile.get("device") if isinstance(compile, dict) else None
        if data is None or not isinstance(device, int):
            return False  # nothing to compile it from later: compile it now
        recorded.setdefault((id(fn.jit_function), device, str(key)),
                            (fn.jit_function, data, device))
        return True  # skip: no compile, no launch

    previous = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = hook
    try:
        yield recorded
    finally:
        knobs.runtime.jit_cache_hook = previous


class Precompile:
    """Compiles `recorded` (recording's) on `threads` threads from construction on; `wait`
    joins them. A variant whose compile fails on a thread is compiled again alone on the
    waiting thread (Triton's front end has raced between threads); one that fails there too
    is left to its first launch, which compiles it again and raises with the launch's
    context."""

    def __init__(self, recorded: dict[tuple, tuple[object, str, int]], threads: int) -> None:
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="triton-compile")
        self._futures: list[tuple[Future, tuple]] = [(self._pool.submit(_compile, *v), v)
                                                     for v in recorded.values()]

    def wait(self) -> int:
        """Block until every variant compiled or failed twice; -> how many failed twice (each
        logged)."""
        failed = 0
        try:
            for f, v in self._futures:
                if f.exception() is None:
                    continue
                log.debug("compiling a Triton variant on a thread failed: %s", _why(f.exception()))
                try:
                    _compile(*v)
                except Exception as e:  # noqa: BLE001 - its first launch raises it in context
                    failed += 1
                    log.warning("compiling a Triton variant ahead failed (its first launch "
                                "compiles it): %s", _why(e))
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
        return failed

    def cancel(self) -> None:
        """Drop the variants not started (start-up failed); running compiles finish."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _why(e: BaseException) -> str:
    # Triton's CompilationError names the source line; what went wrong is its cause
    cause = e.__cause__ or e.__context__
    return f"{type(e).__name__}: {e}" + (f" (from {type(cause).__name__}: {cause})"
                                          if cause is not None else "")


def _compile(kernel, data: str, device: int) -> None:
    # preload compiles for the current device (Triton's device caches are per device); the
    # compiled binary itself lands in Triton's on-disk cache, which every device shares
    with torch.cuda.device(device):
        kernel.preload(data)
