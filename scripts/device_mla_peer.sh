#!/usr/bin/env bash
# On the GPU machine (device tool): our paged MLA decode against flashinfer's, one run.
# Carry .whl (../shared/scripts/device-wheels gguf==0.19.0) and .fi: flashinfer's wheel is
# 62 MB (420 MB unpacked), past what a call carries, so .fi holds the package trimmed to its
# MLA sources (flashinfer-trim.tar.xz: the wheel's flashinfer/ with data/csrc cut to batch_mla*
# and headers) and the wheels it imports (apache-tvm-ffi einops tabulate nvidia-ml-py:
# ../shared/scripts/device-wheels --dest .fi ...). The JIT build uses the machine's nvcc.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .fi/*.whl
tar -C /tmp/site -xJf .fi/flashinfer-trim.tar.xz
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton MAX_JOBS=16
nvcc --version | tail -1
timeout ${PEER_TIMEOUT:-500} python3 scripts/bench_mla_peer.py --json "$OUT/mla_peer.json" \
  ${PEER_ARGS:-} 2>&1 | tee "$OUT/mla_peer.log" | tail -40
