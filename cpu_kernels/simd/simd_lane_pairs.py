"""512-bit intrinsics for tiles whose vectors hold a run of 8 columns of 8 rows (the lattice
i-quants' packed tiles, packed_tiles_grid.py; the runs come from simd_grid.py's gathers):

    b64 w: byte 8r + j = weight j of the run in row r; an i32x16 accumulator's lanes 2r and
    2r + 1 both belong to row r

One vpdpbusd against the run's 8 activations broadcast to every row (`bcast8x8`) sums a run.
Per scale group the two row groups' lane pairs are summed into one vector of 16 rows
(`pair_sums16`), so the offset (`i32x16_sub_cs`), the scales (`nibbles16`, `words16`) and the
float multiply-add each take one instruction for 16 rows, not two.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from cpu_kernels.simd.simd import _element_ptr
from cpu_kernels.simd.simd_pairs import _load_halves, _splat, _u8, b64, f32x16, i32x16

_I8, _I16, _I32, _I64, _F32 = (ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64),
                               ir.FloatType())
_V8I64, _V64I8, _V16I32, _V16F32 = (ir.VectorType(_I64, 8), ir.VectorType(_I8, 64),
                                    ir.VectorType(_I32, 16), ir.VectorType(_F32, 16))
_DUP = ir.Constant(ir.VectorType(_I32, 16), [r // 2 for r in range(16)])  # lanes 2r, 2r+1 <- r


def _load(context, builder, sig, args, k: int, elem: ir.Type, n: int):
    """n elements of type `elem` at byte args[k + 1] of byte array args[k]."""
    vt = ir.VectorType(elem, n)
    return builder.load(_element_ptr(context, builder, sig.args[k], args[k], args[k + 1],
                                     sig.args[k + 1], vt), align=1)


def _splat_arg(context, builder, sig, args, k: int, vec: ir.VectorType):
    return _splat(builder, context.cast(builder, args[k], sig.args[k],
                                        types.int64 if vec.element.width == 64 else types.int32),
                  vec)


def _ints(*a) -> bool:
    return all(isinstance(v, types.Integer) for v in a)


@intrinsic
def bcast8x8(typingctx, arr, idx):
    """The 8 bytes of an int8 array at flat index `idx`, repeated for all 8 rows."""
    if not (_u8(arr) and _ints(idx)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _I64)
        return builder.bitcast(_splat(builder, builder.load(ptr, align=1), _V8I64), _V64I8)
    return b64(arr, idx), codegen


@intrinsic
def nibbles16(typingctx, pa, pb, o, shift, a, b):
    """a * n + b for the 4-bit fields n at bit `shift` of the 8 bytes at pa[o] and of the 8 at
    pb[o] (rows 0-7 and 8-15), as f32x16: one scale per row and lane."""
    if not (_u8(pa) and _u8(pb) and _ints(o, shift)
            and all(isinstance(v, types.Float) for v in (a, b))):
        return None

    def codegen(context, builder, sig, args):
        v = builder.zext(_load_halves(context, builder, sig, args, _I8, 8), _V16I32)
        s = _splat_arg(context, builder, sig, args, 3, _V16I32)
        nib = builder.and_(builder.lshr(v, s), ir.Constant(_V16I32, [15] * 16))
        av, bv = (_splat(builder, context.cast(builder, args[k], sig.args[k], types.float32),
                         _V16F32) for k in (4, 5))
        return builder.fadd(builder.fmul(builder.sitofp(nib, _V16F32), av), bv)
    return f32x16(pa, pb, o, shift, a, b), codegen


@intrinsic
def words16(typingctx, pa, pb, o, shift, mask, a, b):
    """a * f + b for the fields f = (u16 at pa[o + 2r] >> shift) & mask of rows r < 8 and the
    same at pb for rows 8-15, as i32x16."""
    if not (_u8(pa) and _u8(pb) and _ints(o, shift, mask, a, b)):
        return None

    def codegen(context, builder, sig, args):
        v = builder.zext(_load_halves(context, builder, sig, args, _I16, 8), _V16I32)
        s, m, av, bv = (_splat_arg(context, builder, sig, args, k, _V16I32) for k in (3, 4, 5, 6))
        return builder.add(builder.mul(builder.and_(builder.lshr(v, s), m), av), bv)
    return i32x16(pa, pb, o, shift, mask, a, b), codegen


@intrinsic
def i32x16_fill(typingctx, c):
    """c in every lane."""
    if not _ints(c):
        return None

    def codegen(context, builder, sig, args):
        return _splat(builder, context.cast(builder, args[0], sig.args[0], types.int32), _V16I32)
    return i32x16(c), codegen


@intrinsic
def i32x16_to_f32(typingctx, v):
    if v != i32x16:
        return None

    def codegen(context, builder, sig, args):
        return builder.sitofp(args[0], _V16F32)
    return f32x16(v), codegen


@intrinsic
def i32x16_sub_cs(typingctx, a, c, s):
    """a - c * s: c one offset per row (i32x16), s an integer."""
    if not (a == i32x16 and c == i32x16 and _ints(s)):
        return None

    def codegen(context, builder, sig, args):
        sv = _splat(builder, context.cast(builder, args[2], sig.args[2], types.int32), _V16I32)
        return builder.sub(args[0], builder.mul(args[1], sv))
    return i32x16(a, c, s), codegen


@intrinsic
def pair_sums16(typingctx, a, b):
    """Lane r < 8: a[2r] + a[2r + 1]; lane 8 + r: b[2r] + b[2r + 1]: two groups' lane-pair sums
    as one row per lane."""
    if not (a == i32x16 and b == i32x16):
        return None

    def codegen(context, builder, sig, args):
        even = ir.Constant(_V16I32, [2 * r for r in range(8)] + [16 + 2 * r for r in range(8)])
        odd = ir.Constant(_V16I32, [2 * r + 1 for r in range(8)] + [17 + 2 * r for r in range(8)])
        return builder.add(builder.shuffle_vector(args[0], args[1], even),
                           builder.shuffle_vector(args[0], args[1], odd))
    return i32x16(a, b), codegen
