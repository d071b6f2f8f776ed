"""Compile every gpu_kernels kernel for a CUDA target without a GPU (Triton's own compiler and
ptxas), and report each variant's registers, spills and shared memory.

The interpreter (TRITON_INTERPRET=1) runs the kernels' arithmetic on a CPU but not the
compiler: code the interpreter accepts can still fail to compile (a non-constexpr global, a
block shape the layouts cannot take). `tests/gpu_kernels/test_compile.py` compiles every
variant the engine launches for sm_90, so CI catches those on a machine without a GPU.

    python -m gpu_kernels.compile_check [--arch 90]
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from gpu_kernels import qtypes as qt

_TRITON_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
                  torch.uint8: "u8", torch.int8: "i8", torch.int32: "i32", torch.int64: "i64"}


@dataclass(frozen=True)
class Variant:
    name: str
    kernel: object  # a triton JITFunction
    signature: dict[str, str]
    constexprs: dict[str, object]
    num_warps: int = 4


def _plane_types(qtype: int) -> list[str]:
    from gpu_kernels.qformat import to_planes

    block = qt.block_size(qtype)
    cols = 256 if block > 1 else 64
    size = qt.BLOCK_GEOMETRY[qtype][1] * (cols // block) if block > 1 else cols * (
        4 if qtype == qt.F32 else 2)
    planes = to_planes(torch.zeros(2 * size, dtype=torch.uint8), qtype, 2, cols).planes
    types = ["*" + _TRITON_DTYPES[p.dtype] for p in planes]
    return types + [types[0]] * (6 - len(types))


def _sig(names: str, types: list[str] | str) -> dict[str, str]:
    names_l = names.split()
    if isinstance(types, str):
        types = types.split()
    return dict(zip(names_l, types))


def variants() -> Iterator[Variant]:
    """Every kernel variant the engine launches (each type; decode and tensor-core tiles)."""
    from gpu_kernels import (
        dequant_tile,
        fused,
        handshake,
        mla_decode,
        mla_prefill,
        mla_prefill_expanded,
        qdot,
        qdot_i8,
        qdot_i8_q6k,
        qmatmul,
        qmatmul_t_kquant,
        router,
    )

    ints = "i32 " * 9
    for qtype in qt.SUPPORTED:
        planes = _plane_types(qtype)
        names = "x_ptr y_ptr p0 p1 p2 p3 p4 p5 M N K row0 gstride sxm sxg sym syg"
        sig = _sig(names, ["*fp32", "*fp32", *planes, *ints.split()])
        shapes = [(m, 2048) for m in (1, 2, 4, 8, 16, 64)]
        if qtype in qmatmul.SHORT_ROW_TILES:
            shapes.append((1, 128))
        for m, cols in shapes:
            bm, dot = qmatmul._tiles(m)
            bn, step, warps, stages = qmatmul._product_tiles(qtype, bm, dot, None, cols)
            nc = qdot.chunks_per_step(qtype, cols, max(1, step // qdot.CHUNK[qtype]))
            short = "" if cols == 2048 else f" cols={cols}"
            yield Variant(f"qmatmul {qt.name(qtype)} M={m}{short}", qmatmul._qmm_kernel,
                          {**sig, **dict.fromkeys(["QT", "BM", "BN", "NC", "STEP", "L", "DOT",
                                                   "STAGES"], "constexpr")},
                          {"QT": qtype, "BM": bm, "BN": bn, "NC": nc,
                           "STEP": nc * qdot.CHUNK[qtype], "L": nc * qdot.PART[qtype],
                           "DOT": dot, "STAGES": stages}, warps)
            if cols == 2048:
                few = qmatmul.FEW_GROUPS_TILES  # one token, V2-Lite's 16 heads
                for bn, bk, warps in ((32, 64, 8) if dot else (qmatmul.T_ROWS, 64, 4),
                                      *(() if dot else (few,))):
                    yield Variant(f"qmatmul_t {qt.name(qtype)} M={m} {bn}x{bk}",
                                  qmatmul._qmm_t_kernel,
                                  {**sig, **dict.fromkeys(["QT", "BM", "BN", "BK", "DOT"],
                                                          "constexpr")},
                                  {"QT": qtype, "BM": bm, "BN": bn, "BK": bk, "DOT": dot},
                                  warps)
        esig = _sig("ids_ptr y_ptr p0 p1 p2 p3 p4 p5 T K", ["*i64", "*fp32", *planes, "i32", "i32"])
        yield Variant(f"embedding {qt.name(qtype)}", dequant_tile._embedding_kernel,
                      {**esig, "QT": "constexpr", "BT": "constexpr", "BK": "constexpr"},
                      {"QT": qtype, "BT": 4, "BK": 64})
    tsig = {qt.Q4_K: _sig("x_ptr y_ptr qs_ptr sc_ptr mn_ptr d_ptr dm_ptr M N row0 gstride KB KS "
                          "KD sxm sxg sym syg", "*fp32 *fp32 *u8 *u8 *u8 *fp16 *fp16" + " i32" * 11),
            qt.Q6_K: _sig("x_ptr y_ptr ql_ptr qh_ptr sc_ptr d_ptr M N row0 gstride KL KH KS KD "
                          "sxm sxg sym syg", "*fp32 *fp32 *u8 *u8 *i8 *fp16" + " i32" * 12)}
    kernel_t = {qt.Q4_K: qmatmul_t_kquant._q4k_t_kernel, qt.Q6_K: qmatmul_t_kquant._q6k_t_kernel}
    for (qtype, bm), (bn, cb, warps) in qmatmul_t_kquant.TILES.items():
        yield Variant(f"qmatmul_t_kquant {qt.name(qtype)} M={bm}", kernel_t[qtype],
                      {**tsig[qtype], **dict.fromkeys(["BM", "BN", "CB"], "constexpr")},
                      {"BM": bm, "BN": bn, "CB": cb}, warps)
    i8sig = _sig("xq_p xd_p xs_p y_p qs_p sc_p mn_p d_p dm_p M N G row0 gstride KW KX KS KD "
                 "sym syg", "*i32 *fp32 *fp32 *fp32 *i32 *u8 *u8 *fp16 *fp16" + " i32" * 11)
    for bits in (16, 8):
        for bn, nc, warps in (qdot_i8.LONG_TILES, qdot_i8.SHORT_TILES):
            yield Variant(f"qmatmul_i8 x{bits} {bn}x{nc}", qdot_i8._q4k_i8_kernel,
                          {**i8sig, **dict.fromkeys(["BM", "BN", "NC", "X16", "ASM"],
                                                    "constexpr")},
                          {"BM": 1, "BN": bn, "NC": nc, "X16": bits == 16, "ASM": True}, warps)
        yield Variant(f"qmatmul_i8_q6k x{bits}", qdot_i8_q6k._q6k_i8_kernel,
                      {**_sig("xq_p xd_p y_p ql_p qh_p sc_p d_p M N G row0 gstride KL KH KX KS "
                              "KD sym syg", "*i32 *fp32 *fp32 *i32 *i32 *i8 *fp16" + " i32" * 12),
                       **dict.fromkeys(["BM", "BN", "NC", "X16", "ASM"], "constexpr")},
                      {"BM": 1, "BN": qdot_i8_q6k.Q6K_TILES[0], "NC": qdot_i8_q6k.Q6K_TILES[1],
                       "X16": bits == 16, "ASM": True}, qdot_i8_q6k.Q6K_TILES[2])
        yield Variant(f"quantize_x x{bits}", qdot_i8._quant_x_kernel,
                      {**_sig("x_ptr q_ptr d_ptr s_ptr K G sxm sxg",
                              f"*fp32 *i{bits} *fp32 *fp32 i32 i32 i32 i32"),
                       **dict.fromkeys(["NB", "QMAX", "PAIRS"], "constexpr")},
                      {"NB": 16, "QMAX": qdot_i8._QMAX[bits], "PAIRS": bits == 16}, 1)
    for heads in (16, 128):
        sig = _sig("q_ptr qr_ptr cache_ptr table_ptr lens_ptr o_ptr lse_ptr H P page_size scale "
                   "NSPLIT sqrb sqrh",
                   "*fp32 *fp32 *bf16 *i64 *i64 *fp32 *fp32 i32 i32 i32 fp32 i32 i32 i32")
        yield Variant(f"mla_decode split H={heads}", mla_decode._split_kernel,
                      {**sig, "C": "constexpr", "R": "constexpr", "BH": "constexpr",
                       "BS": "constexpr", "PREC": "constexpr"},
                      {"C": 512, "R": 64, "BH": mla_decode.decode_tiles(heads)[0],
                       "BS": mla_decode.decode_tiles(heads)[1],
                       "PREC": mla_decode.DECODE_PRECISION},
                      mla_decode.decode_tiles(heads)[2])
    for heads in (4, 16, 128):
        bh = mla_prefill._heads_per_program(heads)
        yield Variant(f"mla_prefill H={heads}", mla_prefill._prefill_kernel,
                      {**_sig("q_ptr qr_ptr cache_ptr meta_ptr slots_ptr o_ptr H scale sqn sqh "
                              "sqrn sqrh",
                              "*fp32 *fp32 *bf16 *i64 *i64 *fp32 i32 fp32 i32 i32 i32 i32"),
                       **dict.fromkeys(["C", "R", "BQ", "BH", "BS", "PREC"], "constexpr")},
                      {"C": 512, "R": 64, "BQ": max(1, mla_prefill.ROWS // bh), "BH": bh,
                       "BS": mla_prefill.BLOCK_KEYS, "PREC": mla_decode.PRECISION}, 8)
    for prec, (bq, bs, warps, stages) in mla_prefill_expanded.TILES.items():
        yield Variant(f"mla_prefill_expanded {prec}", mla_prefill_expanded._expanded_kernel,
                      {**_sig("q_ptr kn_ptr kr_ptr v_ptr meta_ptr o_ptr scale sqn sqh skn skh skr "
                              "svn svh son soh",
                              "*fp32 *fp32 *bf16 *fp32 *i64 *fp32 fp32" + " i32" * 9),
                       **dict.fromkeys(["NOPE", "R", "V", "BQ", "BS", "PREC", "STAGES"],
                                       "constexpr")},
                      {"NOPE": 128, "R": 64, "V": 128, "BQ": bq, "BS": bs,
                       "PREC": mla_prefill_expanded.KERNEL_PRECISION[prec],
                       "STAGES": stages}, warps)
    for heads in (16, 128):
        yield Variant(f"mla_decode merge H={heads}", mla_decode._merge_kernel,
                      {**_sig("o_ptr lse_ptr lens_ptr out_ptr H NSPLIT",
                              "*fp32 *fp32 *i64 *fp32 i32 i32"),
                       "C": "constexpr", "BS": "constexpr"},
                      {"C": 512, "BS": mla_decode.decode_tiles(heads)[1]})
    for h in (2048, 7168):
        for (qmax, qtype), wait in (((0.0, "*fp32"), False), ((32767.0, "*i16"), False),
                                    ((32767.0, "*i16"), True)):
            yield Variant(f"add_rmsnorm H={h}{' +int16 x' if qmax else ''}"
                          f"{' awaiting the host' if wait else ''}",
                          fused._add_rmsnorm_kernel,
                          {**_sig("x_ptr d_ptr d2_ptr w_ptr y_ptr q_ptr qd_ptr qs_ptr H eps sx "
                                  "fl_ptr fl_index seq_ptr err_ptr max_spins",
                                  f"*fp32 *fp32 *fp32 *fp32 *fp32 {qtype} *fp32 *fp32 i32 fp32 "
                                  # not awaiting, x stands in for the flag's pointers
                                  + ("i32 *i64 i32 *i64 *i32 i32" if wait
                                     else "i32 *fp32 i32 *fp32 *fp32 i32")),
                           **dict.fromkeys(["HAS_D", "HAS_D2", "AWAIT", "BH", "QMAX"],
                                           "constexpr")},
                          {"HAS_D": True, "HAS_D2": True, "AWAIT": wait,
                           "BH": 8192 if h > 4096 else 2048, "QMAX": qmax}, 8 if h > 4096 else 4)
    yield Variant("rope_cache", fused._rope_cache_kernel,
                  {**_sig("q_ptr kv_ptr pos_ptr slot_ptr nw_ptr inv_ptr cache_ptr NH q_stride "
                          "NOPE eps rope_scale sq skv",
                          "*fp32 *fp32 *i64 *i64 *fp32 *fp32 *bf16 i32 i32 i32 fp32 fp32 i32 i32"),
                   "C": "constexpr", "R": "constexpr", "BHEADS": "constexpr"},
                  {"C": 512, "R": 64, "BHEADS": 16})
    for qmax, qtype in ((0.0, "*fp32"), (32767.0, "*i16")):
        yield Variant(f"silu_mul{' +int16 x' if qmax else ''}", fused._silu_mul_kernel,
                      {**_sig("gu_ptr y_ptr q_ptr qd_ptr qs_ptr I limit",
                              f"*fp32 *fp32 {qtype} *fp32 *fp32 i32 fp32"),
                       "BI": "constexpr", "QMAX": "constexpr", "CLAMP": "constexpr"},
                      {"BI": 1024, "QMAX": qmax, "CLAMP": False})
    for (e, k, groups), send in itertools.product(((64, 6, 1), (256, 8, 8), (384, 8, 1)),
                                                  (False, True)):
        be = 1 << (e - 1).bit_length()
        # not sending, the logits stand in for the hand-over's pointers
        hand = "*fp32 *fp32 *fp32 *i64 i32 *i64 i32 *i64 *i32" if send \
            else "*fp32 *fp32 *fp32 *i64 i32 *fp32 i32 *fp32 *fp32"
        yield Variant(f"route E={e}{' sending to the host' if send else ''}",
                      router._route_kernel,
                      {**_sig("logit_ptr bias_ptr w_ptr id_ptr E scale x_ptr hx_ptr hw_ptr "
                              "hid_ptr H fl_ptr fl_index seq_ptr cnt_ptr",
                              "*fp32 *fp32 *fp32 *i64 i32 fp32 " + hand),
                       **dict.fromkeys(["SIGMOID", "HAS_BIAS", "NORM", "K", "KP", "G", "TOPK_G",
                                        "BE", "PER", "SEND", "BX"], "constexpr")},
                      {"SIGMOID": groups > 1, "HAS_BIAS": groups > 1, "NORM": groups > 1,
                       "K": k, "KP": 8, "G": groups, "TOPK_G": 4 if groups > 1 else 1,
                       "BE": be, "PER": be // groups, "SEND": send,
                       "BX": router.SEND_BLOCK})
    yield Variant("handshake signal", handshake._signal_kernel,
                  _sig("flags_ptr index seq_ptr", "*i64 i32 *i64"), {}, 1)
    yield Variant("handshake wait", handshake._wait_kernel,
                  _sig("flags_ptr index seq_ptr error_ptr max_spins", "*i64 i32 *i64 *i32 i32"),
                  {}, 1)


def compile_variant(v: Variant, arch: int = 90) -> dict:
    """Compile to a cubin for sm_<arch>; -> registers, spills, shared memory bytes."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(fn=v.kernel, signature=v.signature, constexprs=v.constexprs)
    k = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                       options={"num_warps": v.num_warps})
    return {"name": v.name, **_ptxas_report(k.asm["ptx"], arch), "shared": k.metadata.shared}


def _ptxas_report(ptx: str, arch: int) -> dict:
    """Registers and spilled bytes of a kernel, from `ptxas -v` (the one triton ships)."""
    import re
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    # the newest first: triton's PTX version may be newer than its older bundled ptxas
    candidates = [shutil.which("ptxas"), bundled / "ptxas-blackwell", bundled / "ptxas"]
    target = re.search(r"\.target (\S+)", ptx).group(1)  # sm_90a for arch 90
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "k.ptx"
        path.write_text(ptx)
        for binary in filter(None, candidates):
            res = subprocess.run([str(binary), f"-arch={target}", "-v", str(path), "-o",
                                  str(Path(d) / "k.o")], capture_output=True, text=True,
                                 check=False)
            if res.returncode == 0:
                break
        else:
            raise RuntimeError(f"no ptxas here assembles this PTX: {res.stderr[-500:]}")
    regs = re.search(r"Used (\d+) registers", res.stderr)
    spill = re.search(r"(\d+) bytes spill stores", res.stderr)
    return {"regs": int(regs.group(1)) if regs else -1,
            "spills": int(spill.group(1)) if spill else 0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--match", default="", help="only variants whose name contains this")
    args = ap.parse_args()
    failed = 0
    for v in variants():
        if args.match not in v.name:
            continue
        try:
            r = compile_variant(v, args.arch)
        except Exception as e:  # noqa: BLE001 - reported, and the exit status says so
            failed += 1
            print(f"{v.name:40} FAILED: {str(e).strip()[:2000]}", flush=True)
            continue
        print(f"{r['name']:40} regs {r['regs']:4} spills {r['spills']:5} "
              f"shared {r['shared']:6}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
