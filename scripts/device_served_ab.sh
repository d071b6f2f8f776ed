#!/usr/bin/env bash
# On the GPU machine: `hybrid serve` with its defaults, through HTTP (scripts/bench_serve_peer.py
# --only hybrid), for two trees in one run, the "before and after" of a change to the served
# path. BASE is the earlier tree, carried:
#   mkdir -p .ab/base && git archive REV | tar -x -C .ab/base   (/.ab/ in .git/info/exclude)
# Carry .whl .ab (the wheels as for scripts/device_serve_peer.sh). Each tree's first start
# compiles its kernels (numba's caches are per path), timed apart by a first start of
# scripts/profile_start_up.py. ARGS: the workload's flags (e.g. "--temperature 0.6 --top-p 0.95
# --ttft 512 --streams 16 --rates , --repeats 3"). ROUNDS: the trees alternate that many times.
set -uo pipefail
source scripts/device_common.sh
v2_lite_model
BASE=$(realpath "${BASE:-.ab/base}")
OUT=$(realpath "$OUT")
HERE=$PWD
for r in $(seq "${ROUNDS:-1}"); do
  for tree in "$BASE" "$HERE"; do
    name=$([ "$tree" = "$HERE" ] && echo after || echo before)
    cd "$tree" || exit 1
    if [ "$r" = 1 ]; then  # compile the tree's kernels outside the measured start
      PYTHONPATH=/tmp/site:$PWD timeout 300 python3 scripts/profile_start_up.py --gguf-path $M \
        > "$OUT/$name-first-start.log" 2>&1
    fi
    # shellcheck disable=SC2086
    PYTHONPATH=/tmp/site:$PWD timeout "${BENCH_TIMEOUT:-240}" python3 scripts/bench_serve_peer.py \
      --gguf-path $M --only hybrid --logs "$OUT" --json "$OUT/$name-$r.json" ${ARGS:-} \
      > "$OUT/$name-$r.log" 2>&1
    echo "$name, round $r: rc $?"
    grep -E "decode:|streams:|TTFT|^\|" "$OUT/$name-$r.log" | head -12
    cd "$HERE" || exit 1
  done
done
