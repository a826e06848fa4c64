#!/usr/bin/env bash
# Makes the pieces scripts/gpu-check.sh puts together on the GPU machine, in .gpu/cNN folders of
# at most ~37 MB (a device command carries 64 MiB with the checkout): llama.cpp's source (from
# PyPI's llama-cpp-python sdist) with the first model bytes, the model in parts, then node, the
# gpu_check example (and gpu_exact_ops, where built) and the addon (built with `npm run build`
# and `cargo build --release -p ruvllm-eval --example gpu_check --example gpu_exact_ops` first).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:?usage: gpu-pack.sh MODEL.gguf LLAMA_TAR_XZ [SECOND_MODEL.gguf]}
LLAMA=${2:?usage: gpu-pack.sh MODEL.gguf LLAMA_TAR_XZ [SECOND_MODEL.gguf]}
PART=$((37 * 1000 * 1000))
rm -rf .gpu/c*; mkdir -p .gpu/parts
cp "$LLAMA" .gpu/llama.tar.xz
first=$((PART - $(stat -c %s .gpu/llama.tar.xz)))
head -c $first "$MODEL" > .gpu/parts/model.part00
tail -c +$((first + 1)) "$MODEL" | split -b $PART -d -a 2 --numeric-suffixes=1 - .gpu/parts/model.part
mkdir -p .gpu/c00 && mv .gpu/llama.tar.xz .gpu/parts/model.part00 .gpu/c00/
i=1
for p in .gpu/parts/model.part*; do
  # A last part of a few MB rides with the one before it (one command fewer).
  if [ $i -gt 1 ] && [ "$(stat -c %s "$p")" -lt $((4 * 1000 * 1000)) ]; then mv "$p" "$(printf ".gpu/c%02d" $((i - 1)))/"; continue; fi
  d=$(printf ".gpu/c%02d" $i); mkdir -p $d; mv "$p" $d/; i=$((i + 1))
done
d=$(printf ".gpu/c%02d" $i); mkdir -p $d
[ -f .gpu/node.xz ] || xz -9 -T2 -c "$(readlink -f "$(command -v node)")" > .gpu/node.xz
cp .gpu/node.xz $d/node.xz
xz -6 -c target/release/examples/gpu_check > $d/gpu_check.xz
# gpu_exact_ops only with EXACT=1 (the reference-mode check): it does not fit beside node otherwise.
[ -n "${EXACT:-}" ] && [ -f target/release/examples/gpu_exact_ops ] && xz -6 -c target/release/examples/gpu_exact_ops > $d/gpu_exact_ops.xz
# The kernel tests, where built (scripts/cuda-test.sh mmq-test / top-test).
for t in mmq-test top-test; do [ -f target/$t ] && xz -6 -c target/$t > $d/$t.xz; done
xz -6 -c ruvllm.linux-x64-gnu.node > $d/ruvllm.node.xz
# The natural text the log-probability comparison can use (`benches/text.mjs` fetches it).
[ -f "$HOME/.cache/ruvllm-bench/hamlet.txt" ] && cp "$HOME/.cache/ruvllm-bench/hamlet.txt" $d/hamlet.txt
# A second model (optional third argument) in .gpu/qNN: put with MODEL_NAME=qwen.gguf.
rm -rf .gpu/q[0-9]*
if [ -n "${3:-}" ]; then
  split -b $PART -d -a 2 "$3" .gpu/model.part
  for p in .gpu/model.part*; do q=.gpu/q${p##*part}; mkdir -p $q; mv "$p" $q/; done
  sha256sum "$3"
fi
du -sh .gpu/c* .gpu/q* 2>/dev/null
sha256sum "$MODEL"
