#!/usr/bin/env bash
# On the GPU machine: scripts/crosstalk.py against `hybrid serve` on the V2-Lite-shaped Q4_K_M
# file, started with its defaults plus $ARGS (e.g. --no-overlap-prefill): requests beside a
# long prompt passing the layers, each greedy answer against the same request alone.
# Carry .whl (httpx's wheels). Several settings one after another: under device_stages.sh,
#   bash scripts/device_stages.sh start 'bash scripts/device_crosstalk.sh' \
#     'ARGS=--no-overlap-prefill bash scripts/device_crosstalk.sh'
set -uo pipefail
source scripts/device_common.sh
v2_lite_model
python3 -m cli serve --gguf-path "$M" --port 8000 ${ARGS:-} > "$OUT/serve.log" 2>&1 &
SERVER=$!
until python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/health')" \
    2> /dev/null; do
  kill -0 $SERVER 2> /dev/null || { echo "server exited"; tail -30 "$OUT/serve.log"; exit 1; }
  sleep 2
done
grep -E "chose|chunk|start-up.*ready" "$OUT/serve.log" | tail -4
python3 scripts/crosstalk.py --url http://127.0.0.1:8000 --rounds "${ROUNDS:-6}" \
  --json "$OUT/crosstalk.json" ${CROSSTALK_ARGS:-}
rc=$?
kill -TERM $SERVER
wait $SERVER
echo "settings: defaults ${ARGS:-}; crosstalk exit $rc"
