"""The integer dots compile for every x86 host, with the instructions each one has.

The fast kernels' dots lower to one zmm vpdpbusd (AVX512-VNNI), two ymm ones (AVX-VNNI: Alder
Lake and later desktop CPUs, which lack AVX-512), vpmaddubsw + vpmaddwd (AVX2 alone, e.g. AMD
Zen 3) or plain vector code. A 512-bit intrinsic on a CPU without it would not compile, or would
stop the server with an illegal instruction; these tests compile each path for named CPUs (no
such CPU needed here) and run the path this host uses against integer numpy, codes up to 255
and codes below 128 (the `u7` dot).
"""

from __future__ import annotations

import llvmlite.binding as llb
import numpy as np
import pytest
from llvmlite import ir
from numba import njit

from cpu_kernels.simd.simd_pairs import (
    _V16I32,
    DPBUSD_ISA,
    bcast4x16,
    dpbusd16,
    dpbusd16_u7,
    dpbusd_ir,
    f32x16_zero,
    fma_i32x16,
    i32x16_zero,
    load_b64,
    store_f32x16,
)

llb.initialize_native_target()
llb.initialize_native_asmprinter()


def _asm(isa: str, cpu: str, small_codes: bool = False) -> str:
    """Assembly of f(acc, a, b) = dpbusd_ir(acc, a, b, isa), built for `cpu`."""
    module = ir.Module(name="dots")
    fn = ir.Function(module, ir.FunctionType(_V16I32, [_V16I32] * 3), name="dots")
    builder = ir.IRBuilder(fn.append_basic_block())
    builder.ret(dpbusd_ir(builder, *fn.args, isa, small_codes))
    target = llb.Target.from_triple(llb.get_process_triple())
    machine = target.create_target_machine(cpu=cpu, opt=2)
    parsed = llb.parse_assembly(str(module))
    parsed.verify()
    return machine.emit_assembly(parsed)


@pytest.mark.parametrize("isa, cpu, register, count", [
    ("vnni512", "sapphirerapids", "zmm", 1), ("vnni512", "znver4", "zmm", 1),
    ("vnni256", "alderlake", "ymm", 2), ("vnni256", "sapphirerapids", "ymm", 2)])
def test_vnni_emits_vpdpbusd(isa, cpu, register, count):
    asm = _asm(isa, cpu)
    lines = [line for line in asm.splitlines() if "vpdpbusd" in line]
    assert len(lines) == count, asm
    assert all(register in line for line in lines), lines


@pytest.mark.parametrize("small_codes, count", [(True, 2), (False, 4)])
def test_avx2_uses_maddubs(small_codes, count):
    asm = _asm("avx2", "znver3", small_codes)
    assert "vpdpbusd" not in asm
    assert sum("vpmaddubsw" in line for line in asm.splitlines()) == count, asm


@pytest.mark.parametrize("cpu", ["znver3", "haswell", "x86-64"])
def test_plain_path_needs_no_vnni(cpu):
    assert "vpdpbusd" not in _asm("plain", cpu)


@njit(cache=False)
def _dot_rows(codes, acts, out, small):
    # codes: [64] u8 (byte 4i+k: lane i)  acts: [4] i8 broadcast to every lane  out: [16] f32
    # (the sums, at most 4 * 255 * 128 in magnitude, are exact in float32)
    q, x = load_b64(codes, codes[32:], 0), bcast4x16(acts, 0)
    acc = dpbusd16_u7(i32x16_zero(), q, x) if small else dpbusd16(i32x16_zero(), q, x)
    store_f32x16(out, 0, fma_i32x16(acc, np.float32(1.0), f32x16_zero()))


@pytest.mark.parametrize("top_code", [255, 127, 15])
def test_host_path_matches_integer_dot(top_code):
    """Whatever this host compiles (DPBUSD_ISA), the lanes equal int64 numpy; extreme values
    (codes at their top, activations at -128 and 127) are where int16 sums would saturate."""
    rng = np.random.default_rng(top_code)
    for trial in range(30):
        codes = rng.integers(0, top_code + 1, 64, dtype=np.uint8)
        acts = rng.integers(-128, 128, 4, dtype=np.int8)
        if trial < 4:
            codes[:] = top_code
            acts[:] = [(-128, -128, 127, 127), (127, 127, 127, 127), (-128, -128, -128, -128),
                       (-128, 127, -128, 127)][trial]
        want = (codes.reshape(16, 4).astype(np.int64) * acts.astype(np.int64)).sum(1)
        for small in (False, True) if top_code < 128 else (False,):
            out = np.zeros(16, np.float32)
            _dot_rows(codes, acts, out, small)
            np.testing.assert_array_equal(out, want, err_msg=f"{DPBUSD_ISA} small={small}")
