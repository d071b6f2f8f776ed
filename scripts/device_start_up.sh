#!/usr/bin/env bash
# On the GPU machine (carry .whl, as device_served.sh): where a first and a second start of
# `hybrid serve` go, phase by phase (scripts/profile_start_up.py), on the V2-Lite-shaped
# Q4_K_M file with the bundled rules and the defaults; then, with AFTER set, that command
# (e.g. AFTER='timeout 380 python3 scripts/device_rules_check.py'). First the compile-ahead
# tests, which need the GPU (Triton's JIT hooks), in a cache of their own.
set -uo pipefail
source scripts/device_common.sh
t0=$(date +%s)
python3 -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)" \
  > "$OUT/tests.log"
TRITON_CACHE_DIR=/tmp/triton-tests python3 -m pytest -q -p no:cacheprovider \
  tests/gpu_kernels/test_precompile.py >> "$OUT/tests.log" 2>&1
v2_lite_model
echo "make-model: $(( $(date +%s) - t0 )) s"
for start in first second; do
  s=$(date +%s)
  timeout 240 python3 scripts/profile_start_up.py --gguf-path $M \
    --optimize-rules DeepSeek-V2-Lite --json "$OUT/$start.json" > "$OUT/$start.log" 2>&1
  echo "$start start: rc $? in $(( $(date +%s) - s )) s"
  grep -A60 "Triton compile seconds" "$OUT/$start.log"
done
if [ -n "${AFTER:-}" ]; then
  eval "$AFTER" > "$OUT/after.log" 2>&1
  echo "after: rc $?"
  tail -25 "$OUT/after.log"
fi
echo "compile-ahead tests (first, in a cache of their own):"
head -1 "$OUT/tests.log"
tail -3 "$OUT/tests.log"
