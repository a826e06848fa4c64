#!/usr/bin/env bash
# Makes the family fixtures that crates/ruvllm-core/tests/families.rs checks our forward pass
# against, once (a DONE marker; delete the folder to remake them): the llama.cpp source from
# PyPI's llama-cpp-python sdist (scripts/llama-src.sh), the Python venv with torch and
# transformers (setup.sh), the tiny checkpoints, their GGUF conversions and requantizations and
# the f32 transformers logits (make_fixtures.py), the families' chat templates as transformers
# renders them (templates.py), then llama.cpp's log-probabilities on every
# file through node-llama-cpp (compare_all.sh, which also prints llama.cpp's KL table), and
# llama.cpp's log-probabilities on a passage of text for the real models we can get
# (real-models.sh, real_models.mjs).
#   RUVLLM_FAMILY_FIXTURES  where (default target/families)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${RUVLLM_FAMILY_FIXTURES:-$PWD/target/families}"
if [ -f "$OUT/DONE" ]; then
  echo "families: fixtures in $OUT"
  exit 0
fi
start=$SECONDS
export LLAMA_CPP_SRC="${LLAMA_CPP_SRC:-$(bash scripts/llama-src.sh)}"
bash tools/families/setup.sh
PY="${RUVLLM_FAMILIES_VENV:-$HOME/.cache/ruvllm-families/venv}/bin/python"
rm -rf "$OUT.tmp"
"$PY" tools/families/make_fixtures.py --out "$OUT.tmp"
"$PY" tools/families/templates.py --out "$OUT.tmp"
bash tools/families/compare_all.sh "$OUT.tmp"
# The real models: SmolLM2 and Qwen2.5-Coder from PyPI, Gemma 3 270M where the quickstart put it.
gemma="$(node -e "console.log(require('./index.js').models.path('gemma-3-270m'))")"
mapfile -t real < <(bash tools/families/real-models.sh)
node tools/families/real_models.mjs "$OUT.tmp" "${real[@]}" "$gemma"
touch "$OUT.tmp/DONE"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
echo "families: fixtures made in $((SECONDS - start)) s"
