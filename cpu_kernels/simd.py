"""Explicit 256-bit SIMD values for numba kernels: three vector types and the few ops we need.

numba auto-vectorizes badly on our block loops (32-element reductions get unrolled, integer dots
become vpmaddwd), so the hot kernels hold LLVM vectors in plain local variables and call these
intrinsics; each lowers to one or a few instructions:

    b32:  <32 x i8>   packed weights (unsigned codes) or int8 activations
    i32x8: <8 x i32>  integer dot accumulators, lane i sums bytes 4i..4i+3
    f32x8: <8 x float>

`dpbusd(acc, a, b)` is acc[i] + sum_k u8(a[4i+k]) * s8(b[4i+k]): one AVX-VNNI vpdpbusd where the
host has it (AVX512-VNNI+VL or AVX-VNNI), else the same sum in generic vector IR (slower, exact).
256-bit, not 512: Rocket Lake / Sapphire Rapids tuning prefers ymm, and LLVM would split zmm
types in functions without a min-legal-vector-width attribute (numba sets none).
"""

from __future__ import annotations

import llvmlite.binding as llb
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

_FEATURES = llb.get_host_cpu_features()
HAS_VNNI = bool((_FEATURES.get("avx512vnni") and _FEATURES.get("avx512vl"))
                or _FEATURES.get("avxvnni"))

_I8, _I32, _F32 = ir.IntType(8), ir.IntType(32), ir.FloatType()
_V32I8, _V8I32, _V8F32 = ir.VectorType(_I8, 32), ir.VectorType(_I32, 8), ir.VectorType(_F32, 8)


class VecType(types.Type):
    """A numba type whose LLVM value is a vector register."""

    def __init__(self, name: str, llvm_type: ir.VectorType) -> None:
        self.llvm_type = llvm_type
        super().__init__(name=name)


b32 = VecType("b32", _V32I8)
i32x8 = VecType("i32x8", _V8I32)
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


def _splat_i32(builder, value):
    """<8 x i32> of integer `value` (truncated to 32 bits)."""
    n = builder.trunc(value, _I32) if value.type.width > 32 else value
    v = builder.insert_element(ir.Constant(_V8I32, None), n, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(_V8I32, [0] * 8))


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


@intrinsic
def load_nibbles16(typingctx, arr, idx):
    """16 bytes at `idx` as b32: [low nibbles of bytes 0..15, high nibbles of bytes 0..15]."""
    if not (_is_byte_array(arr) and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        v16 = ir.VectorType(_I8, 16)
        ptr = _element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], v16)
        q = builder.load(ptr, align=1)
        both = builder.shuffle_vector(q, q, ir.Constant(ir.VectorType(_I32, 32),
                                                         [j % 16 for j in range(32)]))
        shift = ir.Constant(_V32I8, [0] * 16 + [4] * 16)
        return builder.and_(builder.lshr(both, shift), ir.Constant(_V32I8, [15] * 32))
    return b32(arr, idx), codegen


@intrinsic
def bits_to_b32(typingctx, bits, value):
    """b32 with byte j = `value` where bit j of the 32-bit `bits` is set, else 0."""
    if not (isinstance(bits, types.Integer) and isinstance(value, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        b = builder.trunc(args[0], _I32) if args[0].type.width > 32 else args[0]
        mask = builder.bitcast(b, ir.VectorType(ir.IntType(1), 32))
        return builder.select(mask, _splat_b32(builder, args[1]), ir.Constant(_V32I8, [0] * 32))
    return b32(bits, value), codegen


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
b32_xor = _binop_b32("xor")
b32_shl = _binop_b32("shl")
b32_shr = _binop_b32("lshr")


@intrinsic
def dpbusd(typingctx, acc, a, b):
    """acc[i] + sum_k u8(a[4i+k]) * s8(b[4i+k]), i = 0..7."""
    if not (acc == i32x8 and a == b32 and b == b32):
        return None

    def codegen(context, builder, sig, args):
        acc_v, a_v, b_v = args
        if HAS_VNNI:
            fnty = ir.FunctionType(_V8I32, [_V8I32, _V8I32, _V8I32])
            fn = cgutils.get_or_insert_function(builder.module, fnty,
                                                "llvm.x86.avx512.vpdpbusd.256")
            return builder.call(fn, [acc_v, builder.bitcast(a_v, _V8I32),
                                     builder.bitcast(b_v, _V8I32)])
        v32 = ir.VectorType(_I32, 32)
        prod = builder.mul(builder.zext(a_v, v32), builder.sext(b_v, v32))
        total = acc_v
        for k in range(4):
            idx = ir.Constant(_V8I32, [4 * i + k for i in range(8)])
            total = builder.add(total, builder.shuffle_vector(prod, prod, idx))
        return total
    return i32x8(acc, a, b), codegen


@intrinsic
def i32x8_zero(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_V8I32, [0] * 8)
    return i32x8(), codegen


@intrinsic
def f32x8_zero(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_V8F32, [0.0] * 8)
    return f32x8(), codegen


@intrinsic
def load_i32x8(typingctx, arr, idx):
    """8 int32 of an int32 array from flat index `idx`."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int32):
        return None

    def codegen(context, builder, sig, args):
        ptr = _element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _V8I32)
        return builder.load(ptr, align=4)
    return i32x8(arr, idx), codegen


@intrinsic
def i32x8_shl(typingctx, a, shift):
    """a << shift on i32x8."""
    if not (a == i32x8 and isinstance(shift, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return builder.shl(args[0], _splat_i32(builder, args[1]))
    return i32x8(a, shift), codegen


@intrinsic
def sub_shl(typingctx, a, b, shift):
    """a - (b << shift) on i32x8 (removes a code offset 2**shift times the activation sums b)."""
    if not (a == i32x8 and b == i32x8 and isinstance(shift, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return builder.sub(args[0], builder.shl(args[1], _splat_i32(builder, args[2])))
    return i32x8(a, b, shift), codegen


@intrinsic
def fma_i32(typingctx, s, scale, acc):
    """acc + float(s) * scale, with `scale` a float32 scalar (broadcast) or an f32x8."""
    if not (s == i32x8 and acc == f32x8 and (scale == f32x8 or isinstance(scale, types.Float))):
        return None

    def codegen(context, builder, sig, args):
        sc = args[1]
        if sig.args[1] != f32x8:
            sc = context.cast(builder, sc, sig.args[1], types.float32)
            one = builder.insert_element(ir.Constant(_V8F32, None), sc, ir.Constant(_I32, 0))
            sc = builder.shuffle_vector(one, one, ir.Constant(_V8I32, [0] * 8))
        fs = builder.sitofp(args[0], _V8F32)
        prod = builder.fmul(fs, sc, flags=("contract",))
        return builder.fadd(prod, args[2], flags=("contract",))
    return f32x8(s, scale, acc), codegen


@intrinsic
def f32x8_halves(typingctx, lo, hi):
    """[lo x 4, hi x 4] from two float32 scalars."""
    if not (isinstance(lo, types.Float) and isinstance(hi, types.Float)):
        return None

    def codegen(context, builder, sig, args):
        a = context.cast(builder, args[0], sig.args[0], types.float32)
        b = context.cast(builder, args[1], sig.args[1], types.float32)
        v = builder.insert_element(ir.Constant(_V8F32, None), a, ir.Constant(_I32, 0))
        v = builder.insert_element(v, b, ir.Constant(_I32, 1))
        return builder.shuffle_vector(v, v, ir.Constant(_V8I32, [0, 0, 0, 0, 1, 1, 1, 1]))
    return f32x8(lo, hi), codegen


@intrinsic
def hsum(typingctx, v):
    """Sum of the 8 lanes of an f32x8, as float32."""
    if v != f32x8:
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        for half in (4, 2, 1):
            idx = ir.Constant(_V8I32, [j + half for j in range(half)] + [0] * (8 - half))
            v = builder.fadd(v, builder.shuffle_vector(v, v, idx))
        return builder.extract_element(v, ir.Constant(_I32, 0))
    return types.float32(v), codegen


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
