#!/usr/bin/env bash
# CPU MoE benchmark on the GPU machine (16 Sapphire Rapids cores): V3 and V2-Lite shapes,
# T = 1..1024, 16 threads; JSON rows and the log under $OUT (the device tool's output folder).
# Usage (from the repo root): OUT=/tmp/out bash scripts/device_cpu_moe.sh
# SHAPES, MODES (exact, fast, fast-vnni), TOKENS and RESIDENT (experts held: V3 has 256, the
# default 64 keeps each mode's setup short) override the defaults below. With kt-kernel's
# extension unpacked into .kt/ (kt_kernel/_kt_kernel_ext_amx*.so and kt_kernel.libs/ from its
# cp312 wheel; carry ".kt"), its llamafile and AMX int4/int8 MoEs run side by side.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/cpu_moe_out}
[ -d .kt/kt_kernel ] && KT_ROOT=${KT_ROOT:-.kt}
mkdir -p "$OUT"
lscpu | grep -E "Model name|^CPU\\(s\\)|NUMA node\\(s\\)" | tee "$OUT/cpu.txt"
timeout "${BENCH_TIMEOUT:-500}" python scripts/bench_cpu_moe.py --threads "${THREADS:-16}" \
    --shapes "${SHAPES:-v3,lite}" --modes "${MODES:-exact,fast,fast-vnni}" \
    --tokens "${TOKENS:-1,2,4,8,32,128,512,1024}" --exact-tokens 1 --resident "${RESIDENT:-64}" \
    ${KT_ROOT:+--kt-root "$KT_ROOT"} --json "$OUT/bench_cpu_moe.json" 2>&1 | tee "$OUT/bench_cpu_moe.log"
