"""A 16-entry byte table lookup over a b64 vector (the IQ4 types' non-uniform levels).

One vpshufb per 128-bit lane (AVX512BW: one zmm instruction; AVX2: two ymm ones); other CPUs get
a compare-and-select per table entry, which LLVM lowers for any x86.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils
from numba.extending import intrinsic

from cpu_kernels.simd.simd import _FEATURES, HAS_AVX2
from cpu_kernels.simd.simd_pairs import b64

_I8, _I32 = ir.IntType(8), ir.IntType(32)
_V64I8, _V32I8 = ir.VectorType(_I8, 64), ir.VectorType(_I8, 32)
HAS_AVX512BW = bool(_FEATURES.get("avx512bw"))


def _call(builder, name: str, ret, args):
    fnty = ir.FunctionType(ret, [a.type for a in args])
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), args)


def lookup16(table: list[int]):
    """An intrinsic: b64 v (every byte < 16) -> b64 of table[v[i]] (table: 16 byte values)."""
    values = [v & 0xFF for v in table]

    @intrinsic
    def fn(typingctx, v):
        if v != b64:
            return None

        def codegen(context, builder, sig, args):
            if HAS_AVX512BW:
                return _call(builder, "llvm.x86.avx512.pshuf.b.512", _V64I8,
                             [ir.Constant(_V64I8, values * 4), args[0]])
            if HAS_AVX2:
                halves = []
                for h in (0, 1):
                    sel = ir.Constant(ir.VectorType(_I32, 32), list(range(32 * h, 32 * h + 32)))
                    part = builder.shuffle_vector(args[0], args[0], sel)
                    halves.append(_call(builder, "llvm.x86.avx2.pshuf.b", _V32I8,
                                        [ir.Constant(_V32I8, values * 2), part]))
                return builder.shuffle_vector(halves[0], halves[1], ir.Constant(
                    ir.VectorType(_I32, 64), list(range(64))))
            out = ir.Constant(_V64I8, [values[0]] * 64)
            for i in range(1, 16):
                hit = builder.icmp_unsigned("==", args[0], ir.Constant(_V64I8, [i] * 64))
                out = builder.select(hit, ir.Constant(_V64I8, [values[i]] * 64), out)
            return out
        return b64(v), codegen
    return fn
