# Sourced by the device scripts on the GPU machine: the carried wheels installed, the paths set,
# $OUT made, and $M the V2-Lite-shaped Q4_K_M file they share (written by v2_lite_model).
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/models
M=/tmp/models/v2-lite-q4_k_m.gguf

v2_lite_model() {  # write $M once (~50 s there), its log under $OUT
  [ -f $M ] || python3 -m cli make-model --preset v2-lite --quant q4_k_m --layout legacy \
    --vocab deepseek --out $M > "$OUT/make-model.log" 2>&1
}
