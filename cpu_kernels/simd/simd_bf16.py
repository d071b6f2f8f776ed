"""Dequantization of packed weight codes into bfloat16 AMX weight tiles, as one intrinsic.

A bf16 AMX weight tile (B of tdpbf16ps) is 16 tile rows x 64 bytes: tile row p holds, for each of
16 weight rows n, the pair of weights (k = 2p, 2p + 1) as two bf16, i.e. 32 columns per tile.
The packed layouts (packed.py) hold per 8 rows and k-step s a 32-byte vector of 4 codes per row
(byte 4r + j = column 4s + j of row r). `store_bf16_pair_rows` turns the step-s vectors of two
row groups (rows 0-7 and 8-15 of the tile) into tile rows 2s and 2s + 1:

    w[r, j] = (code[4r + j] - zero) * scale[r] - offset[r]    (float32; per-row scale, offset)
    bf16 by round-to-nearest-even (vcvtne2ps2bf16: AVX512-BF16, which every AMX CPU has)
    tile row 2s     = (w[r, 0], w[r, 1]) for r = rows 0-7 of group a, then 0-7 of group b
    tile row 2s + 1 = (w[r, 2], w[r, 3]) likewise

Every quant type reduces to this form once its codes are unpacked to bytes, with gguf's own
scales: Q4_K code * (d * sc) - dmin * m, Q6_K (code - 32) * (d * sc), Q8_0 (code - 128) * d,
Q5_0 (code - 16) * d. The float32 values are bit-identical to gguf's dequantization: with
offset 0 the fused multiply-add is gguf's one product, and Q4_K's code * (d * sc) is exact in
float32 (an fp16 d, a 6-bit sc and a 4-bit code: at most 21 significant bits), so gguf's second
rounding, of the difference, is the only one either way.
One call writes 128 bytes at byte `idx` of a uint8 array: no scatter, two 64-byte stores.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from cpu_kernels.simd.simd import _element_ptr, b32, f32x8

_I16, _I32, _F32 = ir.IntType(16), ir.IntType(32), ir.FloatType()
_V32I32, _V32F32 = ir.VectorType(_I32, 32), ir.VectorType(_F32, 32)
_V16I32, _V16F32 = ir.VectorType(_I32, 16), ir.VectorType(_F32, 16)
_ROW_SPLAT = ir.Constant(_V32I32, [i // 4 for i in range(32)])  # lane 4r + j <- row r


def _fma(module):
    """llvm.fma on <32 x float>, declared once per module."""
    name = "llvm.fma.v32f32"
    if name in module.globals:
        return module.globals[name]
    return ir.Function(module, ir.FunctionType(_V32F32, [_V32F32] * 3), name)


def _dequant_bf16(builder, codes, zero, scale, offset):
    """<32 x i8> codes -> <32 x i16> bf16 bits of (code - zero) * scale[r] - offset[r]
    (lane 4r + j); zero an i32."""
    z = builder.insert_element(ir.Constant(_V32I32, None), zero, ir.Constant(_I32, 0))
    z = builder.shuffle_vector(z, z, ir.Constant(_V32I32, [0] * 32))
    v = builder.sitofp(builder.sub(builder.zext(codes, _V32I32), z), _V32F32)
    s = builder.shuffle_vector(scale, scale, _ROW_SPLAT)
    o = builder.shuffle_vector(offset, offset, _ROW_SPLAT)
    # one fused multiply-add: 4 fewer instructions per 64 weights than a multiply and a
    # subtract, and the same float32 values (module docstring)
    w = builder.call(_fma(builder.module), [v, s, builder.fneg(o)])
    lo = builder.shuffle_vector(w, w, ir.Constant(_V16I32, list(range(16))))
    hi = builder.shuffle_vector(w, w, ir.Constant(_V16I32, list(range(16, 32))))
    # vcvtne2ps2bf16 (AVX512-BF16, on every CPU with AMX): round to nearest even, one
    # instruction per 32 values; the result's low half comes from the last source operand
    fnty = ir.FunctionType(ir.VectorType(_I16, 32), [_V16F32, _V16F32])
    return builder.asm(fnty, "vcvtne2ps2bf16 $2, $1, $0", "=v,v,v", [hi, lo], side_effect=False)


@intrinsic
def store_bf16_pair_rows(typingctx, tile, idx, codes_a, codes_b, zero, scale_a, offset_a,
                         scale_b, offset_b):
    """tile[idx:idx+128] = bf16 tile rows 2s, 2s + 1 of the step-s codes of two row groups."""
    if not (isinstance(tile, types.Array) and tile.dtype == types.uint8
            and isinstance(idx, types.Integer) and codes_a == b32 and codes_b == b32
            and isinstance(zero, types.Integer)
            and all(v == f32x8 for v in (scale_a, offset_a, scale_b, offset_b))):
        return None

    def codegen(context, builder, sig, args):
        _, _, ca, cb, zero, sa, oa, sb, ob = args
        z = context.cast(builder, zero, sig.args[4], types.int32)
        wa = builder.bitcast(_dequant_bf16(builder, ca, z, sa, oa), _V16I32)  # dword 2r + h
        wb = builder.bitcast(_dequant_bf16(builder, cb, z, sb, ob), _V16I32)
        even = builder.shuffle_vector(wa, wb, ir.Constant(_V16I32, list(range(0, 32, 2))))
        odd = builder.shuffle_vector(wa, wb, ir.Constant(_V16I32, list(range(1, 32, 2))))
        p0 = _element_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], _V16I32)
        builder.store(even, p0, align=1)
        builder.store(odd, builder.gep(p0, [ir.Constant(_I32, 1)]), align=1)
        return context.get_dummy_value()
    return types.none(tile, idx, codes_a, codes_b, zero, scale_a, offset_a, scale_b,
                      offset_b), codegen
