"""More 256-bit intrinsics, for kernels whose vector lanes are 8 weight rows (packed layouts).

With rows in lanes, an activation is the same for every lane: `bcast4` splats 4 int8 activations
(one dpbusd step of k) to all 8 lanes, and LLVM folds it into vpdpbusd's broadcast memory operand.
Per-row scales and results are f32x8 loaded from / stored to the packed bytes and caller arrays.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from cpu_kernels.simd import _V8F32, _V8I32, _V32I8, _element_ptr, _splat_i32, b32, f32x8, i32x8

_I8, _I32, _F32 = ir.IntType(8), ir.IntType(32), ir.FloatType()


def _splat_f32(context, builder, value, valty):
    v = context.cast(builder, value, valty, types.float32)
    one = builder.insert_element(ir.Constant(_V8F32, None), v, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, one, ir.Constant(_V8I32, [0] * 8))


def _is_array(a, *dtypes) -> bool:
    return isinstance(a, types.Array) and a.dtype in dtypes


@intrinsic
def bcast4(typingctx, arr, idx):
    """The 4 bytes of an int8/uint8 array at flat index `idx`, repeated in all 8 lanes."""
    if not (_is_array(arr, types.int8, types.uint8) and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _I32)
        return builder.bitcast(_splat_i32(builder, builder.load(ptr, align=1)), _V32I8)
    return b32(arr, idx), codegen


def _load_8(ext: str, elem: ir.Type):
    @intrinsic
    def fn(typingctx, arr, idx):
        if not (_is_array(arr, types.uint8) and isinstance(idx, types.Integer)):
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
def load_u4x8_f32(typingctx, arr, idx, shift):
    """The 4-bit fields at bit `shift` of 8 consecutive bytes from byte `idx`, as f32x8."""
    if not (_is_array(arr, types.uint8) and isinstance(idx, types.Integer)
            and isinstance(shift, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1],
                           ir.VectorType(_I8, 8))
        wide = builder.zext(builder.load(ptr, align=1), _V8I32)
        s = context.cast(builder, args[2], sig.args[2], types.int32)
        nib = builder.and_(builder.lshr(wide, _splat_i32(builder, s)), _splat_i32(
            builder, ir.Constant(_I32, 15)))
        return builder.sitofp(nib, _V8F32)
    return f32x8(arr, idx, shift), codegen


@intrinsic
def store_f32x8(typingctx, arr, idx, v):
    """arr[idx:idx+8] = v for a float32 array (flat index)."""
    if not (_is_array(arr, types.float32) and isinstance(idx, types.Integer) and v == f32x8):
        return None

    def codegen(context, builder, sig, args):
        ptr = _element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _V8F32)
        builder.store(args[2], ptr, align=4)
        return context.get_dummy_value()
    return types.none(arr, idx, v), codegen


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


@intrinsic
def f32x8_fnma(typingctx, acc, a, s):
    """acc - a * s, s a float scalar (broadcast)."""
    if not (acc == f32x8 and a == f32x8 and isinstance(s, types.Float)):
        return None

    def codegen(context, builder, sig, args):
        prod = builder.fmul(args[1], _splat_f32(context, builder, args[2], sig.args[2]),
                            flags=("contract",))
        return builder.fsub(args[0], prod, flags=("contract",))
    return f32x8(acc, a, s), codegen


@intrinsic
def i32x8_combine(typingctx, hi, lo, shift):
    """(hi << shift) + lo: the integer dot of two activation planes."""
    if not (hi == i32x8 and lo == i32x8 and isinstance(shift, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return builder.add(builder.shl(args[0], _splat_i32(builder, args[2])), args[1])
    return i32x8(hi, lo, shift), codegen


@intrinsic
def i32x8_sub_s(typingctx, a, s):
    """a - s for an integer scalar s (broadcast)."""
    if not (a == i32x8 and isinstance(s, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        s = context.cast(builder, args[1], sig.args[1], types.int32)
        return builder.sub(args[0], _splat_i32(builder, s))
    return i32x8(a, s), codegen


@intrinsic
def load_f32x8(typingctx, arr, idx):
    """arr[idx:idx+8] of a float32 array (flat index), as f32x8."""
    if not (_is_array(arr, types.float32) and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _V8F32)
        return builder.load(ptr, align=4)
    return f32x8(arr, idx), codegen


@intrinsic
def store_b32(typingctx, arr, idx, v):
    """arr[idx:idx+32] = v for a uint8 array (flat index)."""
    if not (_is_array(arr, types.uint8) and isinstance(idx, types.Integer) and v == b32):
        return None

    def codegen(context, builder, sig, args):
        ptr = _element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _V32I8)
        builder.store(args[2], ptr, align=1)
        return context.get_dummy_value()
    return types.none(arr, idx, v), codegen
