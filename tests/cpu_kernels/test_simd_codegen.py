"""vpdpbusd is emitted only where the CPU has it: the integer dots compile for every x86 host.

The fast kernels' dots lower to one zmm vpdpbusd (AVX512-VNNI), two ymm ones (AVX-VNNI: Alder
Lake and later desktop CPUs, which lack AVX-512) or plain vector code (AVX2 alone, e.g. AMD Zen
3). A 512-bit intrinsic on a CPU without it would not compile, or would stop the server with an
illegal instruction; these tests compile each path for named CPUs (no such CPU needed here) and
run the path this host uses against integer numpy.
"""

from __future__ import annotations

import llvmlite.binding as llb
import numpy as np
import pytest
from llvmlite import ir
from numba import njit

from cpu_kernels.simd_pairs import (
    _V16I32,
    DPBUSD_WIDTH,
    bcast4x16,
    dpbusd16,
    dpbusd_ir,
    f32x16_zero,
    fma_i32x16,
    i32x16_zero,
    load_b64,
    store_f32x16,
)

llb.initialize_native_target()
llb.initialize_native_asmprinter()


def _asm(width: int, cpu: str) -> str:
    """Assembly of f(acc, a, b) = dpbusd_ir(acc, a, b, width), built for `cpu`."""
    module = ir.Module(name="dots")
    fn = ir.Function(module, ir.FunctionType(_V16I32, [_V16I32] * 3), name="dots")
    builder = ir.IRBuilder(fn.append_basic_block())
    builder.ret(dpbusd_ir(builder, *fn.args, width))
    target = llb.Target.from_triple(llb.get_process_triple())
    machine = target.create_target_machine(cpu=cpu, opt=2)
    parsed = llb.parse_assembly(str(module))
    parsed.verify()
    return machine.emit_assembly(parsed)


@pytest.mark.parametrize("width, cpu, register", [
    (512, "sapphirerapids", "zmm"), (512, "znver4", "zmm"),
    (256, "alderlake", "ymm"), (256, "sapphirerapids", "ymm")])
def test_vnni_widths_emit_vpdpbusd(width, cpu, register):
    asm = _asm(width, cpu)
    lines = [line for line in asm.splitlines() if "vpdpbusd" in line]
    assert len(lines) == 512 // width, asm
    assert all(register in line for line in lines), lines


@pytest.mark.parametrize("cpu", ["znver3", "haswell", "x86-64"])
def test_plain_path_needs_no_vnni(cpu):
    assert "vpdpbusd" not in _asm(0, cpu)


@njit(cache=False)
def _dot_rows(codes, acts, out):
    # codes: [64] u8 (byte 4i+k: lane i)  acts: [4] i8 broadcast to every lane  out: [16] f32
    # (the sums, at most 4 * 255 * 128 in magnitude, are exact in float32)
    acc = dpbusd16(i32x16_zero(), load_b64(codes, codes[32:], 0), bcast4x16(acts, 0))
    store_f32x16(out, 0, fma_i32x16(acc, np.float32(1.0), f32x16_zero()))


def test_host_path_matches_integer_dot():
    """Whatever width this host compiles (DPBUSD_WIDTH), the lanes equal int64 numpy."""
    rng = np.random.default_rng(DPBUSD_WIDTH)
    for _ in range(20):
        codes = rng.integers(0, 256, 64, dtype=np.uint8)
        acts = rng.integers(-128, 128, 4, dtype=np.int8)
        out = np.zeros(16, np.float32)
        _dot_rows(codes, acts, out)
        want = (codes.reshape(16, 4).astype(np.int64) * acts.astype(np.int64)).sum(1)
        np.testing.assert_array_equal(out, want)
