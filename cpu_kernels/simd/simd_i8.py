"""256-bit intrinsics for dots of signed int8 weight rows (the decoded i-quants, iquant_decode)
with float32 or int8 activations, one row at a time.

    f32x8: <8 x float> (simd's)     i32x8: <8 x i32>

`sdot32` is the signed x signed byte dot of 32 elements into 8 lanes (lane m: bytes 4m..4m+3,
so lanes 0-3 hold elements 0-15 and 4-7 elements 16-31): |w| and x signed by w (vpsignb, as
llama.cpp's i-quant dots do), then vpdpbusd where the CPU has VNNI on ymm, vpmaddubsw + vpmaddwd
on AVX2 (exact: |w| <= 127 and |x| <= 127 keep each pair sum below 2^15), plain IR elsewhere.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from cpu_kernels.simd.simd import HAS_AVX2, HAS_VNNI_256, VecType, _element_ptr, f32x8

_I8, _I16, _I32, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()
_V32I8, _V16I16 = ir.VectorType(_I8, 32), ir.VectorType(_I16, 16)
_V8I32, _V8F32 = ir.VectorType(_I32, 8), ir.VectorType(_F32, 8)

i32x8 = VecType("i32x8", _V8I32)
SDOT_ISA = "vnni256" if HAS_VNNI_256 else "avx2" if HAS_AVX2 else "plain"


def _is_i8(a) -> bool:
    return isinstance(a, types.Array) and a.dtype in (types.int8, types.uint8)


def _is_f32(a) -> bool:
    return isinstance(a, types.Array) and a.dtype == types.float32


def _splat8(builder, value):
    v = builder.insert_element(ir.Constant(_V8F32, None), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(_V8I32, [0] * 8))


def _x86(builder, name: str, ret, args):
    fnty = ir.FunctionType(ret, [a.type for a in args])
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), args)


def _sdot_ir(builder, w, x):
    if SDOT_ISA == "plain":
        v32 = ir.VectorType(_I32, 32)
        prod = builder.mul(builder.sext(w, v32), builder.sext(x, v32))
        total = ir.Constant(_V8I32, [0] * 8)
        for k in range(4):
            idx = ir.Constant(_V8I32, [4 * i + k for i in range(8)])
            total = builder.add(total, builder.shuffle_vector(prod, prod, idx))
        return total
    mag = _x86(builder, "llvm.x86.avx2.psign.b", _V32I8, [w, w])
    signed_x = _x86(builder, "llvm.x86.avx2.psign.b", _V32I8, [x, w])
    if SDOT_ISA == "vnni256":
        zero = ir.Constant(_V8I32, [0] * 8)
        return _x86(builder, "llvm.x86.avx512.vpdpbusd.256", _V8I32,
                    [zero, builder.bitcast(mag, _V8I32), builder.bitcast(signed_x, _V8I32)])
    pairs = _x86(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [mag, signed_x])
    return _x86(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, [pairs, ir.Constant(_V16I16, [1] * 16)])


@intrinsic
def sdot32(typingctx, w, wi, x, xi):
    """Lane m = sum_k w[wi + 4m + k] * x[xi + 4m + k] (int8 arrays, signed; |x| <= 127)."""
    if not (_is_i8(w) and _is_i8(x) and isinstance(wi, types.Integer)
            and isinstance(xi, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        a = builder.load(_element_ptr(context, builder, sig.args[0], args[0], args[1],
                                      sig.args[1], _V32I8), align=1)
        b = builder.load(_element_ptr(context, builder, sig.args[2], args[2], args[3],
                                      sig.args[3], _V32I8), align=1)
        return _sdot_ir(builder, a, b)
    return i32x8(w, wi, x, xi), codegen


@intrinsic
def fma_halves(typingctx, acc, s, lo, hi):
    """acc + float(s) * (lo in lanes 0-3, hi in lanes 4-7): one scale per 16 elements."""
    if not (acc == f32x8 and s == i32x8 and isinstance(lo, types.Float)
            and isinstance(hi, types.Float)):
        return None

    def codegen(context, builder, sig, args):
        lo_v = _splat8(builder, context.cast(builder, args[2], sig.args[2], types.float32))
        hi_v = _splat8(builder, context.cast(builder, args[3], sig.args[3], types.float32))
        scale = builder.shuffle_vector(lo_v, hi_v, ir.Constant(_V8I32, [0, 1, 2, 3, 8, 9, 10, 11]))
        prod = builder.fmul(builder.sitofp(args[1], _V8F32), scale, flags=("contract",))
        return builder.fadd(prod, args[0], flags=("contract",))
    return f32x8(acc, s, lo, hi), codegen


@intrinsic
def dot16_f32(typingctx, acc, w, wi, x, xi, scale):
    """acc + scale * (float(w[wi:wi+16]) * x[xi:xi+16]) in two 8-lane halves (int8 w, f32 x)."""
    if not (acc == f32x8 and _is_i8(w) and _is_f32(x) and isinstance(scale, types.Float)
            and isinstance(wi, types.Integer) and isinstance(xi, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        v8i8 = ir.VectorType(_I8, 8)
        parts = []
        for h in (0, 1):
            wi_h = builder.add(context.cast(builder, args[2], sig.args[2], types.intp),
                               ir.Constant(ir.IntType(64), 8 * h))
            xi_h = builder.add(context.cast(builder, args[4], sig.args[4], types.intp),
                               ir.Constant(ir.IntType(64), 8 * h))
            wv = builder.load(_element_ptr(context, builder, sig.args[1], args[1], wi_h,
                                           types.intp, v8i8), align=1)
            xv = builder.load(_element_ptr(context, builder, sig.args[3], args[3], xi_h,
                                           types.intp, _V8F32), align=4)
            parts.append(builder.fmul(builder.sitofp(builder.sext(wv, _V8I32), _V8F32), xv,
                                      flags=("contract",)))
        both = builder.fadd(parts[0], parts[1], flags=("contract",))
        sc = _splat8(builder, context.cast(builder, args[5], sig.args[5], types.float32))
        return builder.fadd(builder.fmul(both, sc, flags=("contract",)), args[0],
                            flags=("contract",))
    return f32x8(acc, w, wi, x, xi, scale), codegen


@intrinsic
def hsum8(typingctx, v):
    """The sum of an f32x8's lanes."""
    if v != f32x8:
        return None

    def codegen(context, builder, sig, args):
        total = builder.extract_element(args[0], ir.Constant(_I32, 0))
        for i in range(1, 8):
            total = builder.fadd(total, builder.extract_element(args[0], ir.Constant(_I32, i)))
        return total
    return types.float32(v), codegen


def levels_intrinsic(levels: list[int]):
    """An intrinsic writing 32 int8 `levels[nibble]` from the 16 bytes at row[qi] (element j:
    low nibble of byte j, element 16 + j: its high nibble; IQ4_NL/IQ4_XS) into out[oi:oi+32]:
    one vpshufb against the 16 levels (AVX2 only: callers test HAS_AVX2 first)."""
    table = ir.Constant(_V32I8, [v & 0xFF for v in levels] * 2)

    @intrinsic
    def fn(typingctx, row, qi, out, oi):
        if not (_is_i8(row) and _is_i8(out) and isinstance(qi, types.Integer)
                and isinstance(oi, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            v16 = ir.VectorType(_I8, 16)
            q = builder.load(_element_ptr(context, builder, sig.args[0], args[0], args[1],
                                          sig.args[1], v16), align=1)
            lo = builder.and_(q, ir.Constant(v16, [15] * 16))
            hi = builder.lshr(q, ir.Constant(v16, [4] * 16))
            nib = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_I32, 32), list(range(32))))
            vals = _x86(builder, "llvm.x86.avx2.pshuf.b", _V32I8, [table, nib])
            builder.store(vals, _element_ptr(context, builder, sig.args[2], args[2], args[3],
                                             sig.args[3], _V32I8), align=1)
            return context.get_dummy_value()
        return types.none(row, qi, out, oi), codegen
    return fn
