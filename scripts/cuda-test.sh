#!/usr/bin/env bash
# Builds one of the standalone CUDA kernel tests (scripts/NAME.cu: mmq-test, head-test) for sm_90
# with CUDA 13's nvcc (.cuda/ or PATH), statically linked to the CUDA runtime, so the binary runs
# on the GPU machine as it is: `cuda-test.sh NAME [OUT]` (OUT defaults to target/NAME).
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: cuda-test.sh NAME [OUT]}
root=$(git rev-parse --path-format=absolute --git-common-dir)/..
lib=
for d in "${CUDA_ROOT:-}" .cuda/cu13 "$root/.cuda/cu13"; do [ -n "$d" ] && [ -x "$d/bin/nvcc" ] && export PATH="$d/bin:$PATH" && lib="-L$(readlink -f "$d")/lib" && break; done
out=${2:-target/$name}
mkdir -p "$(dirname "$out")"
nvcc $lib -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -o "$out" "scripts/$name.cu"
echo "built $out"
