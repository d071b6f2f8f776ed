#!/usr/bin/env bash
# On the GPU machine: scripts/soak.py against `hybrid serve` with its defaults on the
# V2-Lite-shaped Q4_K_M file (64 clients x 10 minutes unless CLIENTS / MINUTES say otherwise).
# A first start, the soak and its replays take longer than one call may run, so the work runs in
# a process session of its own (setsid: it outlives the call on a warm machine) writing under
# /tmp/soak, and each call waits for it up to WAIT seconds and brings back what it wrote:
#   STAGE=start  launches it (once per machine) and waits;
#   STAGE=wait   waits again (issue it at once after the last call returned, while it is warm).
# Then a second start of the same file, timed to /health (serve2.log). SHARE=F serves the
# bundled V2-Lite rules with `pcie_experts: F` instead (0 strips it: every routed expert on the
# CPU, none on the GPU in steps of host_min_rows or more);
# SERVE_ARGS adds serve flags to both starts.
# Carry .whl as for device_serve_peer.sh (the openai client's wheels included).
set -uo pipefail
STAGE=${STAGE:-start}
WAIT=${WAIT:-560}
S=/tmp/soak
mkdir -p $S  # STAGE=run may be called directly (scripts/device_stages.sh runs it so)

if [ "$STAGE" = run ]; then  # the detached part
  source scripts/device_common.sh
  t0=$(date +%s)
  say() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
  v2_lite_model
  say "model ready"
  SERVE=(--gguf-path "$M" --port 8000)
  if [ -n "${SHARE:-}" ]; then
    RULES=$(python3 -c "from pathlib import Path; from hybrid.rules.planner import with_pcie_experts
print(with_pcie_experts('DeepSeek-V2-Lite', $SHARE, Path('$S')))")
    SERVE+=(--optimize-rules "$RULES")
    say "rules: $RULES"
  fi
  # shellcheck disable=SC2086
  python3 -m cli serve "${SERVE[@]}" ${SERVE_ARGS:-} --trace-steps $S/steps.jsonl > $S/serve.log 2>&1 &
  SERVER=$!
  health() { python3 -c "import urllib.request as u; print(u.urlopen('$1').read().decode())"; }
  until health http://127.0.0.1:8000/health > /dev/null 2>&1; do
    kill -0 $SERVER 2> /dev/null || { say "server exited"; tail -30 $S/serve.log; exit 1; }
    sleep 2
  done
  say "server ready (first start)"
  grep -E "rules|chose|chunk|start-up" $S/serve.log | tail -8
  python3 scripts/soak.py --url http://127.0.0.1:8000 --clients "${CLIENTS:-64}" \
    --minutes "${MINUTES:-10}" --pid $SERVER --json $S/soak.json --trace $S/steps.jsonl \
    ${SOAK_ARGS:-} > $S/soak.out 2>&1
  say "soak exit $?"
  health http://127.0.0.1:8000/health > $S/health.json
  ts=$(date +%s.%N)
  kill -TERM $SERVER
  wait $SERVER
  rc=$?
  say "server exit $rc, $(python3 -c "print(round($(date +%s.%N) - $ts, 2))") s after SIGTERM"
  # the second start of the same file (numba's, Triton's and the packed experts' caches warm)
  ts=$(date +%s.%N)
  # shellcheck disable=SC2086
  python3 -m cli serve "${SERVE[@]}" ${SERVE_ARGS:-} > $S/serve2.log 2>&1 &
  SERVER=$!
  until health http://127.0.0.1:8000/health > /dev/null 2>&1; do
    kill -0 $SERVER 2> /dev/null || { say "second start: server exited"; break; }
    sleep 0.5
  done
  say "second start: /health after $(python3 -c "print(round($(date +%s.%N) - $ts, 1))") s"
  kill -TERM $SERVER; wait $SERVER
  say "second server exit $?"
  nvidia-smi --query-gpu=name --format=csv,noheader
  # under device_stages.sh (OUT set there) what the stage's call brings back: few files
  if [ -n "${OUT:-}" ]; then
    cp $S/soak.json "$OUT"/ 2> /dev/null
    tail -80 $S/soak.out > "$OUT/soak_tail.txt" 2> /dev/null
    grep -h "start-up \[" $S/serve.log $S/serve2.log > "$OUT/startup.txt" 2> /dev/null
  fi
  exit 0
fi

mkdir -p $S "${OUT:-/tmp/out}"
if [ "$STAGE" = start ] && [ ! -f $S/run.log ]; then
  echo "user $(whoami); launching the soak"
  STAGE=run setsid nohup bash scripts/device_soak.sh > $S/run.log 2>&1 < /dev/null &
fi
t=0
while [ $t -lt "$WAIT" ] && ! grep -q "second server exit" $S/run.log 2> /dev/null; do
  sleep 10
  t=$(( t + 10 ))
done
cp $S/* "$OUT"/ 2> /dev/null
grep -vE "^\s*$" $S/serve.log 2> /dev/null | grep -iE "error|traceback|warn" | tail -5
echo "--- run.log"; cat $S/run.log
echo "--- soak.out"; cat $S/soak.out 2> /dev/null
