#!/usr/bin/env bash
# For every DIR/CASE/model-*.gguf: llama.cpp log-probs (llamacpp_logits.mjs) and KL against ref.f32.
# Prints a markdown table. Usage: compare_all.sh [DIR] [extra llamacpp_logits.mjs args, e.g. --kv f16]
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DIR="${1:-$HERE/../../target/families}"; shift || true
PY="${RUVLLM_FAMILIES_VENV:-$HOME/.cache/ruvllm-families/venv}/bin/python"
echo "| case | file | mean KL | max KL | top-1 agree | sampler probs sum-1 |"
echo "|---|---|---|---|---|---|"
for c in "$DIR"/*/; do
  c="${c%/}"; case_name="$(basename "$c")"
  [ -f "$c/meta.json" ] || continue
  vocab="$("$PY" -c "import json,sys;print(json.load(open(sys.argv[1]))['vocab'])" "$c/meta.json")"
  for g in "$c"/model-*.gguf; do
    t="$(basename "$g" .gguf)"; t="${t#model-}"
    out="$c/llamacpp-$t.f32"
    if ! info="$(node "$HERE/llamacpp_logits.mjs" "$g" "$c/tokens.bin" "$out" "$@" 2>&1)"; then
      echo "| $case_name | $t | FAILED: $(echo "$info" | tail -1 | cut -c1-120) | | | |"; continue
    fi
    s="$(echo "$info" | tail -1 | "$PY" -c "import json,sys;print('%.1e'%json.load(sys.stdin)['sampler_probabilities']['max_abs_sum_minus_1'])")"
    "$PY" "$HERE/kl.py" "$c/ref.f32" "$out" --vocab "$vocab" --other-is-logprobs --json |
      "$PY" -c "import json,sys;r=json.load(sys.stdin);print('| $case_name | $t | %.2e | %.2e | %.3f | $s |'%(r['mean_kl'],r['max_kl'],r['top1_agree']))"
  done
done
