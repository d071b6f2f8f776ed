"""512-bit intrinsics over two packed row groups at once: 16 weight rows in 16 lanes.

The packed layouts (packed.py) keep 8 rows per group; a pair tile reads the same offsets in two
groups (a: rows 0-7, b: rows 8-15) and joins them into one zmm value, so each vpdpbusd, unpack
and epilogue instruction serves 16 rows instead of 8. On Sapphire Rapids a zmm vpdpbusd issues
as fast as a ymm one (both ~2 per cycle, measured), so the per-token work per weight halves.

    b64:    <64 x i8>   codes of both groups (bytes 0-31 from a, 32-63 from b)
    i32x16: <16 x i32>  integer dot accumulators, lane i = row i of the pair
    f32x16: <16 x float>

Loads take the two groups' arrays and one byte offset. LLVM keeps these types in zmm registers:
numba sets no "min-legal-vector-width", which LLVM reads as "any width is legal".
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from cpu_kernels.simd.simd import HAS_AVX2, HAS_VNNI_256, HAS_VNNI_512, VecType, _element_ptr

_I8, _I32, _F32 = ir.IntType(8), ir.IntType(32), ir.FloatType()
_V64I8, _V16I32, _V16F32 = ir.VectorType(_I8, 64), ir.VectorType(_I32, 16), ir.VectorType(_F32, 16)
_V32I8, _V8I32 = ir.VectorType(_I8, 32), ir.VectorType(_I32, 8)
_JOIN8 = ir.Constant(ir.VectorType(_I32, 16), list(range(16)))
_JOIN32 = ir.Constant(ir.VectorType(_I32, 64), list(range(64)))

b64 = VecType("b64", _V64I8)
i32x16 = VecType("i32x16", _V16I32)
f32x16 = VecType("f32x16", _V16F32)  # simd registered VecType's (register) data model


def _u8(a) -> bool:
    return isinstance(a, types.Array) and a.dtype in (types.uint8, types.int8)


def _splat(builder, value, vec_type):
    v = builder.insert_element(ir.Constant(vec_type, None), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, vec_type.count),
                                                    [0] * vec_type.count))


def _scalar_i32(context, builder, value, valty):
    return context.cast(builder, value, valty, types.int32)


def _load_halves(context, builder, sig, args, elem: ir.Type, n: int):
    """n elements of type `elem` at byte args[2] of arrays args[0] and args[1], joined."""
    vt = ir.VectorType(elem, n)
    halves = [builder.load(_element_ptr(context, builder, sig.args[k], args[k], args[2],
                                        sig.args[2], vt), align=1) for k in (0, 1)]
    return builder.shuffle_vector(halves[0], halves[1], _JOIN32 if n == 32 else _JOIN8)


def _pair_load(elem: ir.Type, n: int, convert=None):
    """An intrinsic loading n elements of type `elem` at byte `idx` of pa and of pb, joined
    (pa's first), converted by convert(builder, vector) if given."""
    out_type = {_I8: b64, _F32: f32x16}.get(elem) if convert is None else f32x16

    @intrinsic
    def fn(typingctx, pa, pb, idx):
        if not (_u8(pa) and _u8(pb) and isinstance(idx, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            v = _load_halves(context, builder, sig, args, elem, n)
            return v if convert is None else convert(builder, v)
        return out_type(pa, pb, idx), codegen
    return fn


# 32 code bytes of each group: the k-step vector of 16 rows
load_b64 = _pair_load(_I8, 32)
# 8 values per group from byte idx of each, as f32x16 (per-row scales in the packed blocks)
load_f32x16_at = _pair_load(_F32, 8)
load_u8x16_f32 = _pair_load(_I8, 8, lambda b, v: b.uitofp(v, _V16F32))
load_i8x16_f32 = _pair_load(_I8, 8, lambda b, v: b.sitofp(v, _V16F32))
# 8 exponent bytes k per group as the floats with bits k << 23: 2^(k - 127), and 0.0 for k = 0
# (MXFP4's E8M0 scales, which its packer stores as k = e - 1)
load_exp2x16_f32 = _pair_load(_I8, 8, lambda b, v: b.bitcast(
    b.shl(b.zext(v, _V16I32), ir.Constant(_V16I32, [23] * 16)), _V16F32))


@intrinsic
def load_u4x16_f32(typingctx, pa, pb, idx, shift):
    """The 4-bit fields at bit `shift` of 8 bytes at byte `idx` of pa and of pb, as f32x16."""
    if not (_u8(pa) and _u8(pb) and isinstance(idx, types.Integer)
            and isinstance(shift, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        wide = builder.zext(_load_halves(context, builder, sig, args, _I8, 8), _V16I32)
        s = _splat(builder, _scalar_i32(context, builder, args[3], sig.args[3]), _V16I32)
        nib = builder.and_(builder.lshr(wide, s), ir.Constant(_V16I32, [15] * 16))
        return builder.sitofp(nib, _V16F32)
    return f32x16(pa, pb, idx, shift), codegen


def _binop_b64(op: str):
    @intrinsic
    def fn(typingctx, a, b):
        if not (a == b64 and (b == b64 or isinstance(b, types.Integer))):
            return None

        def codegen(context, builder, sig, args):
            rhs = args[1]
            if sig.args[1] != b64:  # a scalar operand: splat its low byte
                rhs = _splat(builder, builder.trunc(rhs, _I8), _V64I8)
            return getattr(builder, op)(args[0], rhs)
        return b64(a, b), codegen
    return fn


b64_and = _binop_b64("and_")
b64_or = _binop_b64("or_")
b64_shl = _binop_b64("shl")
b64_shr = _binop_b64("lshr")


@intrinsic
def bcast4x16(typingctx, arr, idx):
    """The 4 bytes of an int8/uint8 array at flat index `idx`, repeated in all 16 lanes."""
    if not (_u8(arr) and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _I32)
        return builder.bitcast(_splat(builder, builder.load(ptr, align=1), _V16I32), _V64I8)
    return b64(arr, idx), codegen


def _avx2_dots(builder, a, b, small_codes: bool):
    """<8 x i32> sums of 4 products u8(a) * s8(b) per lane for <32 x i8> a, b, on AVX2.

    vpmaddubsw sums products in pairs into int16 with saturation: exact while every code is
    below 128 (|2 * 127 * -128| < 2^15). Larger codes (Q8_0's, stored + 128) are split into their
    low 7 bits and the top bit, each summed that way, the top bit's sums weighted 128 by vpmaddwd.
    """
    v16 = ir.VectorType(ir.IntType(16), 16)
    maddubs = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(v16, [_V32I8, _V32I8]), "llvm.x86.avx2.pmadd.ub.sw")
    maddwd = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_V8I32, [v16, v16]), "llvm.x86.avx2.pmadd.wd")
    ones = ir.Constant(v16, [1] * 16)
    if small_codes:
        return builder.call(maddwd, [builder.call(maddubs, [a, b]), ones])
    low = builder.and_(a, ir.Constant(_V32I8, [127] * 32))
    top = builder.lshr(a, ir.Constant(_V32I8, [7] * 32))
    return builder.add(builder.call(maddwd, [builder.call(maddubs, [low, b]), ones]),
                       builder.call(maddwd, [builder.call(maddubs, [top, b]),
                                             ir.Constant(v16, [128] * 16)]))


def dpbusd_ir(builder, acc, a, b, isa: str, small_codes: bool = False):
    """IR for acc[i] + sum_k u8(a[4i+k]) * s8(b[4i+k]) over <16 x i32> acc and <16 x i32>-sized
    a, b: one zmm vpdpbusd (isa "vnni512"), two ymm ones ("vnni256": AVX-VNNI or AVX512VL),
    vpmaddubsw + vpmaddwd per ymm half ("avx2"; cheaper when `small_codes`, every code < 128),
    or plain vector code ("plain") that LLVM lowers for any x86."""
    if isa == "vnni512":
        fnty = ir.FunctionType(_V16I32, [_V16I32] * 3)
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512.vpdpbusd.512")
        return builder.call(fn, [acc, builder.bitcast(a, _V16I32), builder.bitcast(b, _V16I32)])
    if isa in ("vnni256", "avx2"):  # per 256-bit half: lanes 0-7, then 8-15
        a8, b8 = builder.bitcast(a, _V64I8), builder.bitcast(b, _V64I8)
        halves = []
        for h in (0, 1):
            lanes_h = ir.Constant(_V8I32, list(range(8 * h, 8 * h + 8)))
            acc_h = builder.shuffle_vector(acc, acc, lanes_h)
            bytes_h = ir.Constant(ir.VectorType(_I32, 32), list(range(32 * h, 32 * h + 32)))
            a_h, b_h = (builder.shuffle_vector(v, v, bytes_h) for v in (a8, b8))
            if isa == "vnni256":
                fnty = ir.FunctionType(_V8I32, [_V8I32] * 3)
                fn = cgutils.get_or_insert_function(builder.module, fnty,
                                                    "llvm.x86.avx512.vpdpbusd.256")
                halves.append(builder.call(fn, [acc_h, builder.bitcast(a_h, _V8I32),
                                                builder.bitcast(b_h, _V8I32)]))
            else:
                halves.append(builder.add(acc_h, _avx2_dots(builder, a_h, b_h, small_codes)))
        return builder.shuffle_vector(halves[0], halves[1], _JOIN8)
    v64 = ir.VectorType(_I32, 64)
    prod = builder.mul(builder.zext(builder.bitcast(a, _V64I8), v64),
                       builder.sext(builder.bitcast(b, _V64I8), v64))
    total = acc
    for k in range(4):
        idx = ir.Constant(_V16I32, [4 * i + k for i in range(16)])
        total = builder.add(total, builder.shuffle_vector(prod, prod, idx))
    return total


# the best integer dot this CPU has
DPBUSD_ISA = ("vnni512" if HAS_VNNI_512 else "vnni256" if HAS_VNNI_256
              else "avx2" if HAS_AVX2 else "plain")
# dpbusd16_u7 compiles to other instructions than dpbusd16 only on AVX2 hosts: callers choosing
# between them test this compile-time constant first, so other hosts' code carries no choice
U7_DOT_DIFFERS = DPBUSD_ISA == "avx2"


def _dpbusd(small_codes: bool):
    @intrinsic
    def fn(typingctx, acc, a, b):
        if not (acc == i32x16 and a == b64 and b == b64):
            return None

        def codegen(context, builder, sig, args):
            return dpbusd_ir(builder, *args, DPBUSD_ISA, small_codes)
        return i32x16(acc, a, b), codegen
    return fn


# acc[i] + sum_k u8(a[4i+k]) * s8(b[4i+k]), i = 0..15: any codes; codes < 128 only (faster
# without VNNI; the same instruction with it)
dpbusd16 = _dpbusd(False)
dpbusd16_u7 = _dpbusd(True)


@intrinsic
def i32x16_zero(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_V16I32, [0] * 16)
    return i32x16(), codegen


@intrinsic
def f32x16_zero(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_V16F32, [0.0] * 16)
    return f32x16(), codegen


def _f32_operand(context, builder, value, valty):
    if valty == f32x16:
        return value
    return _splat(builder, context.cast(builder, value, valty, types.float32), _V16F32)


@intrinsic
def fma_i32x16(typingctx, s, scale, acc):
    """acc + float(s) * scale, `scale` an f32x16 or a float scalar (broadcast)."""
    if not (s == i32x16 and acc == f32x16 and (scale == f32x16 or isinstance(scale, types.Float))):
        return None

    def codegen(context, builder, sig, args):
        sc = _f32_operand(context, builder, args[1], sig.args[1])
        prod = builder.fmul(builder.sitofp(args[0], _V16F32), sc, flags=("contract",))
        return builder.fadd(prod, args[2], flags=("contract",))
    return f32x16(s, scale, acc), codegen


@intrinsic
def f32x16_mul(typingctx, a, b):
    """a * b, b an f32x16 or a float scalar (broadcast)."""
    if not (a == f32x16 and (b == f32x16 or isinstance(b, types.Float))):
        return None

    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], _f32_operand(context, builder, args[1], sig.args[1]))
    return f32x16(a, b), codegen


@intrinsic
def f32x16_fnma(typingctx, acc, a, s):
    """acc - a * s, s a float scalar (broadcast)."""
    if not (acc == f32x16 and a == f32x16 and isinstance(s, types.Float)):
        return None

    def codegen(context, builder, sig, args):
        prod = builder.fmul(args[1], _f32_operand(context, builder, args[2], sig.args[2]),
                            flags=("contract",))
        return builder.fsub(args[0], prod, flags=("contract",))
    return f32x16(acc, a, s), codegen


@intrinsic
def i32x16_combine(typingctx, hi, lo, shift):
    """(hi << shift) + lo: the integer dot of two activation planes."""
    if not (hi == i32x16 and lo == i32x16 and isinstance(shift, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        s = _splat(builder, _scalar_i32(context, builder, args[2], sig.args[2]), _V16I32)
        return builder.add(builder.shl(args[0], s), args[1])
    return i32x16(hi, lo, shift), codegen


@intrinsic
def i32x16_sub_s(typingctx, a, s):
    """a - s for an integer scalar s (broadcast)."""
    if not (a == i32x16 and isinstance(s, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return builder.sub(args[0], _splat(builder, _scalar_i32(context, builder, args[1],
                                                                sig.args[1]), _V16I32))
    return i32x16(a, s), codegen


@intrinsic
def store_f32x16(typingctx, arr, idx, v):
    """arr[idx:idx+16] = v for a float32 array (flat index)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.float32
            and isinstance(idx, types.Integer) and v == f32x16):
        return None

    def codegen(context, builder, sig, args):
        ptr = _element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _V16F32)
        builder.store(args[2], ptr, align=4)
        return context.get_dummy_value()
    return types.none(arr, idx, v), codegen
