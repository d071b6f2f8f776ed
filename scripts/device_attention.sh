#!/usr/bin/env bash
# On the GPU machine (device tool): flashinfer's decode attention inside the engine against
# ours. Carry .whl and .fi (see scripts/device_mla_peer.sh for what .fi holds). WHAT
# (comma-separated, default rules,e2e):
#   peer   scripts/bench_mla_peer.py: the two kernels alone, same cache, one run
#   rules  scripts/device_rules_check.py: tokens of CUDA rules against cpu.yaml, and with
#          --attention-backend flashinfer against ours (graphs per step and per layer, eager)
#   e2e    scripts/bench_e2e.py on a V2-Lite-shaped Q4_K_M (fast experts) with each backend
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .fi/*.whl
tar -C /tmp/site -xJf .fi/flashinfer-trim.tar.xz
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton \
  NUMBA_CACHE_DIR=/tmp/numba MAX_JOBS=16
WHAT=${WHAT:-rules,e2e}
if [[ $WHAT == *peer* ]]; then
  timeout ${PEER_TIMEOUT:-300} python3 scripts/bench_mla_peer.py --json "$OUT/mla_peer.json" \
    2>&1 | tee "$OUT/mla_peer.log" | tail -16
fi
if [[ $WHAT == *rules* ]]; then
  timeout ${RULES_TIMEOUT:-400} python3 scripts/device_rules_check.py 2>&1 \
    | tee "$OUT/rules.log" | tail -12
fi
if [[ $WHAT == *e2e* ]]; then
  mkdir -p /tmp/v2l
  MODEL=$(python3 -c "import sys; from pathlib import Path; sys.path.insert(0, 'scripts')
from bench_e2e import build_model; print(build_model('v2-lite', Path('/tmp/v2l')))" | tail -1)
  for be in ${BACKENDS:-triton flashinfer}; do
    timeout ${E2E_TIMEOUT:-240} python3 scripts/bench_e2e.py --gguf-path $MODEL --mode fast \
      --attention-backend $be --streams ${STREAMS:-1,8} --prefill ${PREFILL:-512} \
      ${E2E_ARGS:-} --json "$OUT/e2e_$be.json" 2>&1 | tee "$OUT/e2e_$be.log" | tail -8
  done
fi
