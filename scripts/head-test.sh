#!/usr/bin/env bash
# Builds scripts/head-test.cu (the one-token LM head's check and timing at Gemma 3 270M's
# shape) for sm_90 with CUDA 13's nvcc (.cuda/ or PATH), statically linked to the CUDA runtime,
# so the binary runs on the GPU machine as it is: `head-test [rows cols]`.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(git rev-parse --path-format=absolute --git-common-dir)/..
lib=
for d in "${CUDA_ROOT:-}" .cuda/cu13 "$root/.cuda/cu13"; do [ -n "$d" ] && [ -x "$d/bin/nvcc" ] && export PATH="$d/bin:$PATH" && lib="-L$(readlink -f "$d")/lib" && break; done
out=${1:-target/head-test}
mkdir -p "$(dirname "$out")"
nvcc $lib -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -o "$out" scripts/head-test.cu
echo "built $out"
