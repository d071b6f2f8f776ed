"""Explicit SIMD values for numba kernels: vector types, their data model and shared helpers.

numba auto-vectorizes badly on our block loops (32-element reductions get unrolled, integer dots
become vpmaddwd), so the hot kernels hold LLVM vectors in plain local variables and call
intrinsics that each lower to one or a few instructions. This module has the 256-bit ones the
bf16 tile dequantization uses (amx_bf16_tiles: 8 rows' codes and scales of one packed group):

    b32:   <32 x i8>   packed weight codes (byte 4r + j: row r, column j of a k-step)
    f32x8: <8 x float> per-row scales

The integer dot products run on 512-bit pairs of row groups (simd_pairs). LLVM keeps wide
vector types whole here: numba sets no "min-legal-vector-width" on its functions, which LLVM
reads as "every width is legal".
"""

from __future__ import annotations

import llvmlite.binding as llb
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

_FEATURES = llb.get_host_cpu_features()
# vpdpbusd in zmm needs AVX512-VNNI; in ymm, AVX-VNNI (Alder Lake and later desktop parts, which
# lack AVX-512) or AVX512-VNNI with AVX512VL. Without either: vpmaddubsw + vpmaddwd with AVX2,
# plain LLVM vector code without (simd_pairs.dpbusd_ir).
HAS_VNNI_512 = bool(_FEATURES.get("avx512vnni") and _FEATURES.get("avx512bw"))
HAS_VNNI_256 = bool((_FEATURES.get("avx512vnni") and _FEATURES.get("avx512vl"))
                    or _FEATURES.get("avxvnni"))
HAS_AVX2 = bool(_FEATURES.get("avx2"))

_I8, _I32, _F32 = ir.IntType(8), ir.IntType(32), ir.FloatType()
_V32I8, _V8I32, _V8F32 = ir.VectorType(_I8, 32), ir.VectorType(_I32, 8), ir.VectorType(_F32, 8)


class VecType(types.Type):
    """A numba type whose LLVM value is a vector register."""

    def __init__(self, name: str, llvm_type: ir.VectorType) -> None:
        self.llvm_type = llvm_type
        super().__init__(name=name)


b32 = VecType("b32", _V32I8)
f32x8 = VecType("f32x8", _V8F32)


@register_model(VecType)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type: VecType) -> None:
        super().__init__(dmm, fe_type, fe_type.llvm_type)


def _element_ptr(context, builder, arrty, arr, idx, idxty, vec_type):
    ary = context.make_array(arrty)(context, builder, arr)
    i = context.cast(builder, idx, idxty, types.intp)
    return builder.bitcast(builder.gep(ary.data, [i]), vec_type.as_pointer())


def _splat_b32(builder, value):
    """<32 x i8> of the low byte of integer `value`."""
    v = builder.insert_element(ir.Constant(_V32I8, None), builder.trunc(value, _I8),
                               ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, 32), [0] * 32))



def _is_byte_array(a: types.Type) -> bool:
    return isinstance(a, types.Array) and a.dtype in (types.uint8, types.int8)


@intrinsic
def load_b32(typingctx, arr, idx):
    """32 bytes of a uint8/int8 array from flat element index `idx` (no alignment needed)."""
    if not (_is_byte_array(arr) and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _V32I8)
        return builder.load(ptr, align=1)
    return b32(arr, idx), codegen


def _binop_b32(op: str):
    @intrinsic
    def fn(typingctx, a, b):
        if not (a == b32 and (b == b32 or isinstance(b, types.Integer))):
            return None

        def codegen(context, builder, sig, args):
            rhs = args[1]
            if sig.args[1] != b32:  # a scalar operand: splat its low byte
                rhs = _splat_b32(builder, args[1])
            return getattr(builder, op)(args[0], rhs)
        return b32(a, b), codegen
    return fn


b32_and = _binop_b32("and_")
b32_or = _binop_b32("or_")
b32_shl = _binop_b32("shl")
b32_shr = _binop_b32("lshr")


@intrinsic
def f32x8_zero(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_V8F32, [0.0] * 8)
    return f32x8(), codegen


@intrinsic
def prefetch(typingctx, arr, idx):
    """Hint the cache line of &arr[idx] into L1 (prefetcht0); never faults, even past the end."""
    if not (isinstance(arr, types.Array) and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        i = context.cast(builder, args[1], sig.args[1], types.intp)
        ptr = builder.bitcast(builder.gep(ary.data, [i]), ir.IntType(8).as_pointer())
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type, _I32, _I32, _I32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [ptr, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
        return context.get_dummy_value()
    return types.none(arr, idx), codegen


def _splat_f32(context, builder, value, valty):
    v = context.cast(builder, value, valty, types.float32)
    one = builder.insert_element(ir.Constant(_V8F32, None), v, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, one, ir.Constant(_V8I32, [0] * 8))


def _load_8(ext: str, elem: ir.Type):
    @intrinsic
    def fn(typingctx, arr, idx):
        if not (_is_byte_array(arr) and isinstance(idx, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            vt = ir.VectorType(elem, 8)
            ptr = _element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], vt)
            v = builder.load(ptr, align=1)
            if ext == "f32":
                return v
            wide = getattr(builder, ext)(v, _V8I32)
            return builder.sitofp(wide, _V8F32)
        return f32x8(arr, idx), codegen
    return fn


# 8 consecutive values in a uint8 array from byte `idx`, as f32x8
load_u8x8_f32 = _load_8("zext", _I8)
load_i8x8_f32 = _load_8("sext", _I8)
load_f32x8_at = _load_8("f32", _F32)


@intrinsic
def f32x8_mul(typingctx, a, b):
    """a * b, b an f32x8 or a float scalar (broadcast)."""
    if not (a == f32x8 and (b == f32x8 or isinstance(b, types.Float))):
        return None

    def codegen(context, builder, sig, args):
        rhs = args[1] if sig.args[1] == f32x8 else _splat_f32(context, builder, args[1],
                                                              sig.args[1])
        return builder.fmul(args[0], rhs)
    return f32x8(a, b), codegen
