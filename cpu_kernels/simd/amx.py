"""AMX tile instructions (Sapphire Rapids and later) for numba kernels, as inline assembly.

AMX multiplies bf16 tiles at ~16x the rate of AVX-512 FMAs. The kernels use it through a few
intrinsics, one instruction each, on fixed tile registers:

    tile_config(cfg)         ldtilecfg: the shapes of tmm0..7 (cfg: 64 bytes, tile_shapes_bf16)
    tile_release()           tilerelease (the thread's tile state back to init)
    tile_zero_{0,1,6,7}()    tilezero: the float32 accumulators
    tile_load_{2,5}(arr, idx, stride)       tileloadd activations (row stride in bytes)
    tile_load_{3,4}(arr, idx, stride)       tileloadd weights
    tile_store_{0,1,6,7}(arr, idx, stride)  tilestored an accumulator to &arr[idx]
    bf16_dp_0_2_3(), bf16_dp_1_2_4(), bf16_dp_6_5_3(), bf16_dp_7_5_4()
                             tdpbf16ps C += A . B (C_A_B registers)

tdpbf16ps: C[m, n] (float32) += sum_k A[m, k] * B[k/2, 2n + k%2] on bf16: A holds 16 activation
rows of 32 values, B 16 weight rows as pairs of columns (simd_bf16.py builds it). Inline
assembly, not LLVM's AMX intrinsics: those need the tile shapes visible to LLVM's tile register
allocator, which ran out of registers on our loops.
NOTE: LLVM never emits AMX itself, so the configuration loaded by tile_config stays in force
until tile_release in the same thread; every kernel task configures before its first tile op.

Linux hands out AMX state only on request (arch_prctl ARCH_REQ_XCOMP_PERM): HAS_AMX is true
when the CPU has AMX-BF16 (and with it AVX512-BF16) and the request succeeded (once per
process, at import).
"""

from __future__ import annotations

import ctypes
import platform
import sys

import llvmlite.binding as llb
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

_I64, _I8P = ir.IntType(64), ir.IntType(8).as_pointer()
_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18


def _request_amx() -> bool:
    features = llb.get_host_cpu_features()
    if not (sys.platform == "linux" and platform.machine() == "x86_64"
            and features.get("amx-bf16") and features.get("amx-tile")
            and features.get("avx512bf16")):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0


HAS_AMX = _request_amx()
if HAS_AMX:
    llb.initialize_native_asmparser()  # numba's codegen needs it for inline assembly


def tile_shapes_bf16() -> np.ndarray:
    """The tile configuration of the bf16 kernels: all 8 tiles 16 rows x 64 bytes (accumulators
    16 x 16 float32, activations 16 rows x 32 bf16, weights 16 pair rows x 16 rows x 2 bf16)."""
    cfg = np.zeros(64, np.uint8)
    cfg[0] = 1  # palette 1
    cfg[16:32].view(np.uint16)[:] = 64
    cfg[48:56] = 16
    return cfg


def _ptr(context, builder, arrty, arr, idx, idxty):
    ary = context.make_array(arrty)(context, builder, arr)
    i = context.cast(builder, idx, idxty, types.intp)
    return builder.bitcast(builder.gep(ary.data, [i]), _I8P)


def _asm(builder, text: str, constraints: str, args: list, arg_types: list) -> None:
    builder.asm(ir.FunctionType(ir.VoidType(), arg_types), text, constraints, args,
                side_effect=True)


def _memory_op(text: str):
    """An intrinsic f(arr, idx, stride) running `text` on the address &arr[idx] ($0), stride $1."""
    @intrinsic
    def op(typingctx, arr, idx, stride):
        if not (isinstance(arr, types.Array) and isinstance(idx, types.Integer)
                and isinstance(stride, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            p = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            s = context.cast(builder, args[2], sig.args[2], types.int64)
            _asm(builder, text, "r,r,~{memory}", [p, s], [_I8P, _I64])
            return context.get_dummy_value()
        return types.none(arr, idx, stride), codegen
    return op


def _plain_op(text: str):
    @intrinsic
    def op(typingctx):
        def codegen(context, builder, sig, args):
            _asm(builder, text, "~{memory}", [], [])
            return context.get_dummy_value()
        return types.none(), codegen
    return op


@intrinsic
def tile_config(typingctx, cfg):
    if not (isinstance(cfg, types.Array) and cfg.dtype == types.uint8):
        return None

    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], ir.Constant(_I64, 0), types.int64)
        _asm(builder, "ldtilecfg ($0)", "r,~{memory}", [p], [_I8P])
        return context.get_dummy_value()
    return types.none(cfg), codegen


tile_release = _plain_op("tilerelease")
tile_zero_0 = _plain_op("tilezero %tmm0")
tile_zero_1 = _plain_op("tilezero %tmm1")
tile_zero_6 = _plain_op("tilezero %tmm6")
tile_zero_7 = _plain_op("tilezero %tmm7")
tile_load_2 = _memory_op("tileloadd ($0,$1,1), %tmm2")
tile_load_3 = _memory_op("tileloadd ($0,$1,1), %tmm3")
tile_load_4 = _memory_op("tileloadd ($0,$1,1), %tmm4")
tile_load_5 = _memory_op("tileloadd ($0,$1,1), %tmm5")
tile_store_0 = _memory_op("tilestored %tmm0, ($0,$1,1)")
tile_store_1 = _memory_op("tilestored %tmm1, ($0,$1,1)")
tile_store_6 = _memory_op("tilestored %tmm6, ($0,$1,1)")
tile_store_7 = _memory_op("tilestored %tmm7, ($0,$1,1)")
# AT&T order: B, A, C (C += A . B)
bf16_dp_0_2_3 = _plain_op("tdpbf16ps %tmm3, %tmm2, %tmm0")
bf16_dp_1_2_4 = _plain_op("tdpbf16ps %tmm4, %tmm2, %tmm1")
bf16_dp_6_5_3 = _plain_op("tdpbf16ps %tmm3, %tmm5, %tmm6")
bf16_dp_7_5_4 = _plain_op("tdpbf16ps %tmm4, %tmm5, %tmm7")
