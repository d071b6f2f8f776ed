"""Flags shared with another agent (a GPU writing through mapped pinned memory, or another
thread): acquire loads, release stores and a bounded spin-wait, usable inside numba kernels and
from Python.

A flag is one int64 of an array the other side also maps. The writer stores its data first and
then the flag with release order; the reader waits until the flag holds the value it expects
(a step's sequence number, so a flag never needs resetting) and reads the data after that with
acquire order. On x86 both orders are plain moves; the atomics keep the compiler from caching
the flag in a register or moving the data accesses across it.
"""

from __future__ import annotations

import platform

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from cpu_kernels.simd.clock import cycles

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")


def _flag_pointer(context, builder, sig, args):
    ary = context.make_array(sig.args[0])(context, builder, args[0])
    return cgutils.get_item_pointer(context, builder, sig.args[0], ary, [args[1]])


def _is_flags(flags) -> bool:
    return isinstance(flags, types.Array) and flags.dtype == types.int64 and flags.ndim == 1


@intrinsic
def load_acquire(typingctx, flags, index):
    """flags[index] (int64 array), an atomic load with acquire order."""
    if not _is_flags(flags) or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        ptr = _flag_pointer(context, builder, sig, args)
        return builder.load_atomic(ptr, "acquire", 8)
    return types.int64(flags, index), codegen


@intrinsic
def store_release(typingctx, flags, index, value):
    """flags[index] = value (int64 array), an atomic store with release order."""
    if not _is_flags(flags) or not isinstance(index, types.Integer) \
            or not isinstance(value, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        ptr = _flag_pointer(context, builder, sig, args)
        v = context.cast(builder, args[2], sig.args[2], types.int64)
        builder.store_atomic(v, ptr, "release", 8)
        return context.get_dummy_value()
    return types.void(flags, index, value), codegen


@intrinsic
def spin_pause(typingctx):
    """The CPU's spin-loop hint (x86 `pause`): a waiting core yields to its sibling thread."""
    def codegen(context, builder, sig, args):
        # the intrinsic, not inline asm: numba's JIT has no assembler parser
        if not _X86:
            return context.get_dummy_value()
        fnty = ir.FunctionType(ir.VoidType(), [])
        builder.call(cgutils.get_or_insert_function(builder.module, fnty,
                                                    "llvm.x86.sse2.pause"), [])
        return context.get_dummy_value()
    return types.void(), codegen


@njit(nogil=True, cache=True)
def wait_equal(flags: np.ndarray, index: int, value: int, timeout_cycles: int) -> bool:
    """Spin until flags[index] == value (True) or `timeout_cycles` of the TSC passed (False)."""
    if load_acquire(flags, index) == value:
        return True
    start = cycles()
    while load_acquire(flags, index) != value:
        spin_pause()
        if cycles() - start > timeout_cycles:
            return False
    return True


@njit(nogil=True, cache=True)
def wait_at_least(flags: np.ndarray, index: int, value: int, timeout_cycles: int) -> bool:
    """Spin until flags[index] >= value (True) or `timeout_cycles` of the TSC passed (False):
    for a word that only grows (a cycle stamp another thread writes)."""
    start = cycles()
    while load_acquire(flags, index) < value:
        spin_pause()
        if cycles() - start > timeout_cycles:
            return False
    return True


@njit(nogil=True, cache=True)
def set_flag(flags: np.ndarray, index: int, value: int) -> None:
    """flags[index] = value after every earlier store of this thread (release)."""
    store_release(flags, index, value)
