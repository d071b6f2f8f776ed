"""How many compiled variants Triton holds for this package's kernels.

Triton compiles a kernel once per combination of its constexprs and of what it specializes on
(integers equal to 1 or divisible by 16, pointers aligned to 16 bytes). A serving process is
meant to compile every variant it needs at start-up (the model runner's warm-up and the decode
graphs' capture): a variant first compiled while serving costs some request a pause of a
second or more. `compiled_variants` counts them per kernel, so a check can run requests of
awkward shapes after start-up and assert the counts did not move
(scripts/device_rules_check.py does, on the GPU). Under TRITON_INTERPRET nothing compiles:
the counts are empty.
"""

from __future__ import annotations

import importlib
import pkgutil

from triton.runtime.jit import KernelInterface


def _kernels() -> dict[str, KernelInterface]:
    import gpu_kernels

    found = {}
    for info in pkgutil.iter_modules(gpu_kernels.__path__):
        module = importlib.import_module(f"gpu_kernels.{info.name}")
        for name, obj in vars(module).items():
            # .fn: the Python function (the interpreter's wrapper has no module of its own)
            if isinstance(obj, KernelInterface) and obj.fn.__module__ == module.__name__:
                found[f"{info.name}.{name}"] = obj
    return found


def compiled_variants() -> dict[str, int]:
    """{module.kernel: compiled variants on every device} for kernels with at least one."""
    out = {}
    for name, fn in _kernels().items():
        caches = getattr(fn, "device_caches", {})
        n = sum(len(c[0] if isinstance(c, tuple) else c) for c in caches.values())
        if n:
            out[name] = n
    return out


def new_variants(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The kernels that compiled variants between two counts, and how many."""
    return {k: n - before.get(k, 0) for k, n in after.items() if n > before.get(k, 0)}
