"""`device_function`: the decorator for Triton helpers that kernels call (not launched alone).

Compiled (a GPU), it is `triton.jit`. Under Triton's interpreter (TRITON_INTERPRET=1: the tests
and the GPU path without a GPU) `triton.jit` makes every call of a helper patch triton.language
again (`inspect.getmembers` over tl, tl.tensor and tl.math, never undone), once per call, per
program of the grid: a helper called inside a kernel's loop cost more than the arithmetic it
does (the engine tests spent most of their time there). The launch that runs the calling kernel
has already patched triton.language for its whole grid (the module objects are shared), so the
helper runs here as the interpreter's rewritten plain function, which is what the interpreter
calls after its redundant patch.

Invariant: a helper decorated here is called only from inside a kernel launch.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import triton

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


def device_function(fn: Callable) -> Callable:
    jitted = triton.jit(fn)
    if not INTERPRETED:
        return jitted
    # the interpreter's own rewrite (chained comparisons of tensors), cached by the interpreter
    return jitted.rewrite()


# Rows of a product's output one program takes under the interpreter: it runs each block
# operation of a program as a numpy call, so its time goes per program, not per element
# (docs/gpu-path.md, "In Triton's interpreter")
INTERPRETED_ROWS = 1024


def interpreter_rows(rows: int) -> int:
    """A launch's default rows a program (`rows`, a power of two): compiled, as tuned; under the
    interpreter, at least INTERPRETED_ROWS. Explicit tiles (the tests') are left alone."""
    return max(rows, INTERPRETED_ROWS) if INTERPRETED else rows
