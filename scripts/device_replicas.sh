#!/usr/bin/env bash
# On the GPU machine with two GPUs (device kind nvidia-h200-x2): scripts/bench_replicas.py,
# `hybrid cluster` with one replica and with two (one a GPU) on the V2-Lite-shaped Q4_K_M file.
# Carry .whlr alone, which holds Ray and what it imports beside our serving wheels, inside the
# 64 MiB carry: Ray's cp312 wheel stripped (scripts/strip_ray_wheel.py) and the wheels that
# docs/tuning.md ("Replicas on two GPUs") lists, from ../shared/scripts/device-wheels, with
# .whl's less the openai client's and llguidance. ARGS: more of the bench's flags, CLUSTER_ARGS:
# more `hybrid cluster` flags (e.g. "--optimize-rules DeepSeek-V2-Lite-gpu.yaml --cpu-threads 8",
# each replica's experts on its GPU); SWEEP="R:T ..." instead runs R replicas with
# --cpu-threads T, one cluster each.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whlr/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton \
  NUMBA_CACHE_DIR=/tmp/numba RAY_USAGE_STATS_ENABLED=0
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/models
M=/tmp/models/v2-lite-q4_k_m.gguf
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
lscpu | grep -E "^(CPU\(s\)|Thread|Core|Socket|NUMA)" | tee "$OUT/lscpu.txt"
t0=$(date +%s)
[ -f $M ] || python3 -m cli make-model --preset v2-lite --quant q4_k_m --layout legacy \
  --vocab deepseek --out $M > "$OUT/make-model.log" 2>&1
echo "model ready: $(( $(date +%s) - t0 )) s"
if [ -n "${SWEEP:-}" ]; then  # SWEEP="R:T ..." : R replicas with --cpu-threads T, one run each
  for rt in $SWEEP; do
    name=sweep-${rt/:/-}  # no ':' in a file name that comes back
    # shellcheck disable=SC2086
    python3 scripts/bench_replicas.py --gguf-path $M --replicas ${rt%%:*} \
      --cluster-args "--cpu-threads ${rt##*:}" --json "$OUT/$name.json" ${ARGS:-} \
      > "$OUT/$name.log" 2>&1
    echo "$rt: $(grep "replicas, .* streams:\|Error" "$OUT/$name.log" | tr '\n' ' ')"
  done
  exit 0
fi
# shellcheck disable=SC2086
timeout ${TIMEOUT:-520} python3 -X faulthandler scripts/bench_replicas.py --gguf-path $M \
  --logs "$OUT" --json "$OUT/replicas.json" --cluster-args "${CLUSTER_ARGS:-}" ${ARGS:-} 2>&1 \
  | tee "$OUT/replicas.log" | tail -20
STATUS=${PIPESTATUS[0]}
[ "$STATUS" = 0 ] || for f in "$OUT"/cluster-*.log; do echo "== $f"; tail -25 "$f"; done
exit "$STATUS"
