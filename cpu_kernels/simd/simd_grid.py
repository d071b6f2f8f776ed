"""512-bit intrinsics for the lattice i-quants' packed tiles (packed_tiles_grid.py): a run of 8
weights of each of 8 rows comes from one gather of 8 grid rows.

A lattice code names 8 weights at once (a row of the type's grid table, held as one uint64 of
8 bytes), so decoding one byte at a time costs ~1 cycle a weight where the memory streams a
2-bit weight in ~0.1. Here one vpgatherqq fetches the grid rows of 8 weight rows for the same
run of 8 columns:

    b64 w: byte 8r + j = weight j of the run in row r (lanes 2r, 2r+1 of an i32x16 hold row r)

and one vpdpbusd sums it (simd_lane_pairs.py has the rest of that layout's intrinsics).
vpdpbusd multiplies unsigned weights by signed activations, so signed weights are stored as
C + w and C * (the group's activation sum) comes off later. The grid tables of the signed types
already hold C + |w| (C = 64 keeps every grid type's |w| <= 62 in 2..126), so a negative weight
costs one masked subtract from 2C (`signed_run`), not an add and a select.

LLVM lowers llvm.masked.gather to vpgatherqq (zmm with AVX-512, two ymm with AVX2) and the
select on 64 sign bits to a masked vpsubb with AVX512BW.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from cpu_kernels.simd.simd import _element_ptr
from cpu_kernels.simd.simd_lane_pairs import _DUP, _ints, _load, _splat_arg
from cpu_kernels.simd.simd_pairs import _splat, _u8, b64

_I1, _I8, _I16, _I32, _I64 = (ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32),
                              ir.IntType(64))
_V8I64, _V64I8, _V16I32 = (ir.VectorType(_I64, 8), ir.VectorType(_I8, 64),
                           ir.VectorType(_I32, 16))


def _gather(context, builder, sig, table_arg: int, args, idx):
    """The rows table[idx] for an index vector idx (<8 x i64>: uint64 rows; <16 x i32>: uint32
    rows), as <64 x i8>."""
    n = idx.type.count
    elem = _I64 if n == 8 else _I32
    vec = ir.VectorType(elem, n)
    tab = context.make_array(sig.args[table_arg])(context, builder, args[table_arg])
    base = builder.ptrtoint(tab.data, _I64)
    off = builder.zext(idx, _V8I64) if n == 8 else builder.zext(idx, ir.VectorType(_I64, 16))
    step = ir.Constant(off.type, [3 if n == 8 else 2] * n)
    addr = builder.add(_splat(builder, base, off.type), builder.shl(off, step))
    ptrs = builder.inttoptr(addr, ir.VectorType(elem.as_pointer(), n))
    mask_t = ir.VectorType(_I1, n)
    fnty = ir.FunctionType(vec, [ptrs.type, _I32, mask_t, vec])
    name = f"llvm.masked.gather.v{n}i{elem.width}.v{n}p0"
    fn = cgutils.get_or_insert_function(builder.module, fnty, name)
    rows = builder.call(fn, [ptrs, ir.Constant(_I32, elem.width // 8), ir.Constant(mask_t, [1] * n),
                             ir.Constant(vec, None)])
    return builder.bitcast(rows, _V64I8)


def _u64_table(a) -> bool:
    return isinstance(a, types.Array) and a.dtype == types.uint64


def _u32_table(a) -> bool:
    return isinstance(a, types.Array) and a.dtype == types.uint32


@intrinsic
def grid_run(typingctx, table, pk, o):
    """The grid rows table[pk[o + r]] of 8 rows r (8-bit codes at byte o), as b64."""
    if not (_u64_table(table) and _u8(pk) and _ints(o)):
        return None

    def codegen(context, builder, sig, args):
        idx = builder.zext(_load(context, builder, sig, args, 1, _I8, 8), _V8I64)
        return _gather(context, builder, sig, 0, args, idx)
    return b64(table, pk, o), codegen


def _grid_run_high(high: ir.IntType):
    @intrinsic
    def fn(typingctx, table, pk, o, oh, shift, mask):
        if not (_u64_table(table) and _u8(pk) and _ints(o, oh, shift, mask)):
            return None

        def codegen(context, builder, sig, args):
            low = builder.zext(_load(context, builder, sig, args, 1, _I8, 8), _V8I64)
            words = builder.zext(builder.load(_element_ptr(
                context, builder, sig.args[1], args[1], args[3], sig.args[3],
                ir.VectorType(high, 8)), align=1), _V8I64)
            s, m = (_splat_arg(context, builder, sig, args, k, _V8I64) for k in (4, 5))
            field = builder.and_(builder.lshr(words, s), m)
            idx = builder.or_(low, builder.shl(field, ir.Constant(_V8I64, [8] * 8)))
            return _gather(context, builder, sig, 0, args, idx)
        return b64(table, pk, o, oh, shift, mask), codegen
    return fn


# table[pk[o + r] | ((high field at oh of row r >> shift) & mask) << 8] of 8 rows r: codes whose
# high bits sit in a 16-bit word (IQ1_S) or a byte (IQ2_S, IQ1_M) per row
grid_run_high16 = _grid_run_high(_I16)
grid_run_high8 = _grid_run_high(_I8)


@intrinsic
def grid_run_u16(typingctx, table, pk, o, mask):
    """table[u16 at pk[o + 2r] & mask] of 8 rows r (IQ2_XS: 9-bit code, 7 sign bits above)."""
    if not (_u64_table(table) and _u8(pk) and _ints(o, mask)):
        return None

    def codegen(context, builder, sig, args):
        words = builder.zext(_load(context, builder, sig, args, 1, _I16, 8), _V8I64)
        idx = builder.and_(words, _splat_arg(context, builder, sig, args, 3, _V8I64))
        return _gather(context, builder, sig, 0, args, idx)
    return b64(table, pk, o, mask), codegen


@intrinsic
def grid_run4(typingctx, table, pk, o):
    """Two 4-value grid rows per run: row r's bytes are table[pk[o + 2r]], table[pk[o + 2r + 1]]
    (IQ3_XXS), from one 16-lane gather."""
    if not (_u32_table(table) and _u8(pk) and _ints(o)):
        return None

    def codegen(context, builder, sig, args):
        idx = builder.zext(_load(context, builder, sig, args, 1, _I8, 16), _V16I32)
        return _gather(context, builder, sig, 0, args, idx)
    return b64(table, pk, o), codegen


@intrinsic
def grid_run4_high(typingctx, table, pk, o, oq, k):
    """As grid_run4 with 9-bit codes (IQ3_S): the high bit of code 2k + h of row r is bit
    2k + h of byte pk[oq + r]."""
    if not (_u32_table(table) and _u8(pk) and _ints(o, oq, k)):
        return None

    def codegen(context, builder, sig, args):
        low = builder.zext(_load(context, builder, sig, args, 1, _I8, 16), _V16I32)
        q8 = builder.zext(builder.load(_element_ptr(
            context, builder, sig.args[1], args[1], args[3], sig.args[3],
            ir.VectorType(_I8, 8)), align=1), ir.VectorType(_I32, 8))
        q = builder.shuffle_vector(q8, q8, _DUP)
        two_k = builder.shl(_splat_arg(context, builder, sig, args, 4, _V16I32),
                            ir.Constant(_V16I32, [1] * 16))
        shift = builder.add(two_k, ir.Constant(_V16I32, [r % 2 for r in range(16)]))
        bit = builder.and_(builder.lshr(q, shift), ir.Constant(_V16I32, [1] * 16))
        idx = builder.or_(low, builder.shl(bit, ir.Constant(_V16I32, [8] * 16)))
        return _gather(context, builder, sig, 0, args, idx)
    return b64(table, pk, o, oq, k), codegen


def _flip(builder, neg, w, two_c):
    """2C - w where the sign bit is set, w elsewhere: w holds C + |weight| (one masked vpsubb)."""
    cc = _splat(builder, builder.trunc(two_c, _I8), _V64I8)
    return builder.select(neg, builder.sub(cc, w), w)


@intrinsic
def signed_run(typingctx, w, pk, o, two_c):
    """C + |w| -> C - |w| where bit j of byte pk[o + r] is set (weight j of row r): 64 sign bits.
    w comes from a table of C + |w| rows; two_c is 2C."""
    if not (w == b64 and _u8(pk) and _ints(o, two_c)):
        return None

    def codegen(context, builder, sig, args):
        bits = builder.load(_element_ptr(context, builder, sig.args[1], args[1], args[2],
                                         sig.args[2], _I64), align=1)
        neg = builder.bitcast(bits, ir.VectorType(_I1, 64))
        return _flip(builder, neg, args[0], context.cast(builder, args[3], sig.args[3],
                                                          types.int32))
    return b64(w, pk, o, two_c), codegen


@intrinsic
def signed_run7(typingctx, w, pk, o, two_c):
    """signed_run with the signs of row r in bits 9-15 of the u16 at pk[o + 2r] (IQ2_XS): 7 sign
    bits, the 8th their parity (an even count of minus signs)."""
    if not (w == b64 and _u8(pk) and _ints(o, two_c)):
        return None

    def codegen(context, builder, sig, args):
        v8 = ir.VectorType(_I16, 8)
        s7 = builder.lshr(_load(context, builder, sig, args, 1, _I16, 8), ir.Constant(v8, [9] * 8))
        fnty = ir.FunctionType(v8, [v8])
        ctpop = cgutils.get_or_insert_function(builder.module, fnty, "llvm.ctpop.v8i16")
        parity = builder.and_(builder.call(ctpop, [s7]), ir.Constant(v8, [1] * 8))
        byte = builder.or_(s7, builder.shl(parity, ir.Constant(v8, [7] * 8)))
        bits = builder.bitcast(builder.trunc(byte, ir.VectorType(_I8, 8)), _I64)
        neg = builder.bitcast(bits, ir.VectorType(_I1, 64))
        return _flip(builder, neg, args[0], context.cast(builder, args[3], sig.args[3],
                                                          types.int32))
    return b64(w, pk, o, two_c), codegen
