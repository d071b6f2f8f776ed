#!/usr/bin/env bash
# On the GPU machine: build llama.cpp's llama-bench (and llama-server with TARGETS="llama-bench
# llama-server", from a tree made with --with-server) with CUDA from the trimmed source in .llama
# (../shared/scripts/llama-cpp-src --dest .llama) into /tmp/lcb/bin; ~4-5 min on 16 cores.
# Usage: bash scripts/build_llama_bench.sh LOG   (the device scripts run it in the background)
set -uo pipefail
LOG=${1:-/tmp/llama-build.log}
TARGETS=${TARGETS:-llama-bench}
SERVER=OFF
case " $TARGETS " in *" llama-server "*) SERVER=ON;; esac
cmake -S .llama -B /tmp/lcb -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=$SERVER \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON > "$LOG" 2>&1 \
  && cmake --build /tmp/lcb --target $TARGETS -j 16 >> "$LOG" 2>&1
