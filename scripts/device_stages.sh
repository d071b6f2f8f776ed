#!/usr/bin/env bash
# On the GPU machine: several commands one after another in a process session of their own (their
# sum outlasts one call; setsid keeps them running between calls on a warm machine), each one's
# output in /tmp/stages/<i>.log, brought back under $OUT by every call:
#   bash scripts/device_stages.sh start 'CMD 1' 'CMD 2' ...  launches them (once a machine), waits
#   bash scripts/device_stages.sh wait                       waits again (issue it at once after
#                                                            the last call returned, while warm)
# WAIT: seconds a call waits (560). Each command runs in the repository root with OUT set to
# /tmp/stages/<i>/ (what it writes there comes back too). Carry what the commands need.
set -uo pipefail
S=/tmp/stages
WAIT=${WAIT:-560}
mode=${1:-wait}
shift || true
mkdir -p $S "${OUT:-/tmp/out}"
if [ "$mode" = run ]; then  # the detached part
  i=0
  for cmd in "$@"; do
    i=$((i + 1))
    mkdir -p "$S/$i"
    echo "[$(date +%T)] stage $i: $cmd" >> $S/stages.log
    (OUT="$S/$i" bash -c "$cmd") > "$S/$i.log" 2>&1
    echo "[$(date +%T)] stage $i: exit $?" >> $S/stages.log
  done
  echo "[$(date +%T)] all done" >> $S/stages.log
  exit 0
fi
if [ "$mode" = start ] && [ ! -f $S/stages.log ]; then
  setsid nohup bash scripts/device_stages.sh run "$@" > $S/driver.log 2>&1 < /dev/null &
fi
t=0
while [ $t -lt "$WAIT" ] && ! grep -q "all done" $S/stages.log 2> /dev/null; do
  sleep 10
  t=$((t + 10))
done
cp -r $S/. "$OUT"/ 2> /dev/null
cat $S/stages.log
for log in $S/*.log; do
  case $log in */stages.log|*/driver.log) continue ;; esac
  echo "--- $log (tail)"
  grep -v "^\s*$" "$log" | tail -25
done
