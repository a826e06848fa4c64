#!/usr/bin/env bash
# Installs the CUDA 13.0 compiler (nvcc and what it needs) from PyPI into .cuda/ at the repo root,
# once: the build compiles our GPU kernels with it (crates/ruvllm-core/build.rs finds it there).
# CUDA 13.0 matches the driver of the GPU machines we test on; nothing here needs a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
root=.cuda
if [ -x "$root/cu13/bin/nvcc" ]; then exit 0; fi
echo "ruvllm: installing nvcc 13.0 from PyPI into $root (once, about 200 MB)"
python3 -m venv "$root/venv"
"$root/venv/bin/pip" install --quiet --disable-pip-version-check \
  nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
  nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85
cu13="$(echo "$root"/venv/lib/python3*/site-packages/nvidia/cu13)"
[ -x "$cu13/bin/nvcc" ] || { echo "ruvllm: nvcc not found in $cu13 after pip install" >&2; exit 1; }
ln -sfn "$(realpath "$cu13")" "$root/cu13"
"$root/cu13/bin/nvcc" --version | tail -2
