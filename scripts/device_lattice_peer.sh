#!/usr/bin/env bash
# On the GPU machine (device tool; carry .whl and .llama, the latter from
# ../shared/scripts/llama-cpp-src --dest .llama): the lattice i-quants' matrix-vector speed, ours
# beside llama.cpp's, in one run.
#   1. ggml's CPU backend built alone (~1-2 min on 16 cores), scripts/probe_llama_lattice.c on it:
#      16,384 x 7,168 products of every i-quant and Q4_K, >= 400 MB a type, 16 threads.
#   2. our rows of the same types (and unsloth's two 1-bit mixes): device_files.sh's i-quant
#      item in fast mode, beside the read bandwidth of the same run (SKIP_OURS=1 to skip).
# Logs to $OUT (default /tmp/out).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cmake -S .llama -B /tmp/ggml -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF \
  -DLLAMA_OPENSSL=OFF > "$OUT/cmake.log" 2>&1
cmake --build /tmp/ggml --target ggml-cpu -j 16 >> "$OUT/cmake.log" 2>&1 || tail -20 "$OUT/cmake.log"
LIB=$(dirname "$(find /tmp/ggml -name 'libggml-cpu.so' | head -1)")
gcc -O2 scripts/probe_llama_lattice.c -I.llama/ggml/include -L"$LIB" -lggml-cpu -lggml-base \
  -Wl,-rpath,"$LIB" -o /tmp/probe_llama_lattice
echo "llama.cpp (ggml CPU), 16 threads:"
/tmp/probe_llama_lattice 16 | tee "$OUT/llama.md"
if [[ -z ${SKIP_OURS:-} ]]; then
  echo "hybrid (bench_cpu_moe.py, V3 layer, 1 token, fast):"
  OUT=$OUT WHAT=iquant MODES=fast bash scripts/device_files.sh
fi
