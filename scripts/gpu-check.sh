#!/usr/bin/env bash
# The GPU checks, run on the lent GPU machine (NVIDIA H100/H200, CUDA 13 driver, nvcc, CMake; no
# Rust, no Node, no network). Everything it runs is built here and carried there in pieces of
# at most ~37 MB (see CONTRIBUTING.md "GPU"): `scripts/gpu-pack.sh` makes them, one folder per
# command, and each command runs `scripts/gpu-check.sh put <folder>` to add its piece.
#
#   gpu-check.sh put DIR   adds DIR's pieces to $WORK: model.part* are appended to the model,
#                          llama.tar.xz starts llama.cpp's CUDA build in the background (the
#                          anchor), node.xz / gpu_check.xz / ruvllm.node.xz / the kernel
#                          tests (mmq-test.xz, top-test.xz) are unpacked
#   gpu-check.sh check     correctness against the CPU path (examples/gpu_check.rs), the same
#                          criteria for the CPU path against itself with one weight vector
#                          perturbed by a few ulps (`--perturb`: the check's noise floor), and
#                          the JavaScript API on the GPU (benches/gpu.mjs)
#   gpu-check.sh exact     the reference mode (RUVLLM_CUDA_EXACT=1) against the CPU's scalar path
#                          (RUVLLM_FORCE_SCALAR=1) with the per-query attention the reference
#                          mode reproduces (RUVLLM_NO_FLASH=1): every operation on random inputs
#                          (examples/gpu_exact_ops.rs, no model needed), then the check's
#                          criteria on the model (gpu_check), where both must be bit-identical
#   gpu-check.sh js        only the JavaScript API on the GPU (benches/gpu.mjs)
#   gpu-check.sh serve     `ruvllm serve --gpu cuda` under `ruvllm bench serve` (CLIENTS, default
#                          16; DURATION s, default 60), the device memory in use sampled every
#                          second: the server's RSS and device memory at the start and end
#   gpu-check.sh random S  a random-weight qwen2 of shape S (1.5b, 7b) for speed runs
#   gpu-check.sh bench     speed: ours and llama-bench alternately in fresh processes (3 rounds),
#                          peak device memory and load time of each; prints the table last.
#                          ALTS="VAR=value ..." adds one arm per setting to every round (A/B);
#                          ROUNDS=N rounds instead of 3; BATCHED=1 adds llama-batched-bench, the anchor of gpu_check's
#                          concurrent-request rates (section 6) (-npp 32 -ntg 128 -npl 1,4,8,16)
set -euo pipefail
WORK=${RUVLLM_GPU_WORK:-/tmp/ruvllm-gpu}
MODEL_SHA=${MODEL_SHA:-}
# The model the pieces build and the checks run: MODEL_NAME=qwen.gguf for a second one.
M="$WORK/${MODEL_NAME:-model.gguf}"
mkdir -p "$WORK"
cd "$(dirname "$0")/.."

peak_mem() { # peak_mem OUTFILE cmd... : runs cmd, writes the peak GPU memory used (MiB) to OUTFILE
  local out=$1; shift
  local base; base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 50 > "$out.log" 2>/dev/null &
  local mon=$!
  "$@"
  local rc=$?
  kill $mon 2>/dev/null; wait $mon 2>/dev/null || true
  echo $(( $(sort -n "$out.log" | tail -1) - base )) > "$out"
  return $rc
}

case "${1:-}" in
put)
  dir=$2
  for f in $(ls "$dir" | sort); do
    case "$f" in
      model.part*) cat "$dir/$f" >> "$M" ;;
      llama.tar.xz)
        tar xJf "$dir/$f" -C "$WORK"
        (cd "$WORK/llama.cpp" && setsid nohup bash -c 'cmake -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release > build.log 2>&1 && cmake --build build --target llama-bench llama-batched-bench llama-quantize -j16 >> build.log 2>&1; echo done $? >> build.log' > /dev/null 2>&1 &) ;;
      node.xz) xz -dc "$dir/$f" > "$WORK/node" && chmod +x "$WORK/node" ;;
      gpu_*.xz | *-test.xz) xz -dc "$dir/$f" > "$WORK/${f%.xz}" && chmod +x "$WORK/${f%.xz}" ;;
      ruvllm.node.xz) xz -dc "$dir/$f" > "$WORK/ruvllm.linux-x64-gnu.node" ;;
      *.txt) cp "$dir/$f" "$WORK/$f" ;;
      *) echo "unknown piece $f" >&2; exit 1 ;;
    esac
  done
  echo "put $dir: $(du -sh "$WORK" | cut -f1) in $WORK; model $(stat -c %s "$M" 2>/dev/null || echo 0) bytes"
  ;;
check)
  sha256sum "$M"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  cp "$WORK/ruvllm.linux-x64-gnu.node" ./ruvllm.linux-x64-gnu.node
  D=crates/ruvllm-models/data/diffusion/gemma-3-270m-diffusion/lora.gguf
  rc=0
  "$WORK/gpu_check" "$M" --diffusion "$D" ${TEXT:+--text "$TEXT"} || rc=$?
  # The check's noise floor, same criteria: the CPU path against itself with one weight vector
  # moved by 2^-22 (one to four ulps), here and 2^-22 the other way.
  # PERTURB=0 skips it (it needs no GPU: the same on any machine).
  [ "${PERTURB:-1}" = 0 ] || for eps in 2.4e-7 -2.4e-7; do "$WORK/gpu_check" "$M" --perturb $eps --diffusion "$D" ${TEXT:+--text "$TEXT"}; done
  "$WORK/node" benches/gpu.mjs "$M"
  exit $rc
  ;;
exact)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  export RUVLLM_CUDA_EXACT=1 RUVLLM_FORCE_SCALAR=1 RUVLLM_NO_FLASH=1
  rc=0
  "$WORK/gpu_exact_ops" || rc=$?
  if [ -s "$M" ]; then
    sha256sum "$M"
    D=crates/ruvllm-models/data/diffusion/gemma-3-270m-diffusion/lora.gguf
    "$WORK/gpu_check" "$M" --diffusion "$D" ${TEXT:+--text "$TEXT"} || rc=$?
    if [ -x "$WORK/node" ]; then
      cp "$WORK/ruvllm.linux-x64-gnu.node" ./ruvllm.linux-x64-gnu.node
      "$WORK/node" benches/gpu.mjs "$M" || rc=$?
    fi
  fi
  exit $rc
  ;;
bench)
  tail -2 "$WORK/llama.cpp/build.log"
  LB="$WORK/llama.cpp/build/bin/llama-bench"
  [ -x "$LB" ] || { echo "llama-bench is not built (see $WORK/llama.cpp/build.log)"; exit 1; }
  nvidia-smi --query-gpu=name --format=csv,noheader
  for r in $(seq 1 "${ROUNDS:-3}"); do
    echo "== round $r: ruvllm"
    peak_mem "$WORK/mem.ours.$r" "$WORK/gpu_check" "$M" --speed-only | grep -E "prefill|decode|backend|greedy:|temperature 0.7:"
    for alt in ${ALTS:-}; do
      echo "== round $r: ruvllm with $alt"
      env "$alt" "$WORK/gpu_check" "$M" --speed-only | grep -E "prefill|decode"
    done
    echo "== round $r: llama.cpp"
    peak_mem "$WORK/mem.llama.$r" "$LB" -m "$M" -p 512 -n 128 -ngl 99 -r 5 -fa 0,1 -o csv 2>/dev/null | tee "$WORK/lb.$r.csv" | cut -d, -f1-3,30- | tail -4
    if [ -n "${BATCHED:-}" ]; then
      echo "== round $r: llama-batched-bench (S_TG: aggregate decode tok/s)"
      "$WORK/llama.cpp/build/bin/llama-batched-bench" -m "$M" -c 16384 -b 2048 -ub 512 -npp 32 -ntg 128 -npl 1,4,8,16 -ngl 99 -fa on 2>/dev/null | grep -E '^\|'
    fi
  done
  echo "== load time (process wall time: load and one token)"
  for r in $(seq 1 "${ROUNDS:-3}"); do
    /usr/bin/time -f "ruvllm %e s" "$WORK/gpu_check" "$M" --load-only 2>&1 | tail -1
    /usr/bin/time -f "llama.cpp %e s" "$LB" -m "$M" -p 0 -n 1 -r 1 -ngl 99 > /dev/null 2> "$WORK/t.err"; tail -1 "$WORK/t.err"
  done
  echo "== peak device memory (MiB above idle): ruvllm $(cat $WORK/mem.ours.[0-9] | xargs), llama-bench $(cat $WORK/mem.llama.[0-9] | xargs)"
  ;;
js)
  cp "$WORK/ruvllm.linux-x64-gnu.node" ./ruvllm.linux-x64-gnu.node
  "$WORK/node" benches/gpu.mjs "$M"
  ;;
serve)
  cp "$WORK/ruvllm.linux-x64-gnu.node" ./ruvllm.linux-x64-gnu.node
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -l 1 > "$WORK/serve-mem.log" 2>/dev/null &
  mon=$!
  rc=0
  "$WORK/node" bin/ruvllm.js bench serve --model "$M" --gpu cuda --clients "${CLIENTS:-16}" --duration "${DURATION:-60}" --max-tokens 64 --max-requests 1000000 --json > "$WORK/serve.json" || rc=$?
  kill $mon 2>/dev/null; wait $mon 2>/dev/null || true
  "$WORK/node" -e '
const j = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"))
const mem = require("fs").readFileSync(process.argv[2], "utf8").trim().split("\n").map(Number).filter((x) => x > 0)
for (const r of j.rows) console.log(`clients ${r.clients}: ${r.requests} requests, ${r.errors} errors, ${r.tokensPerSecond.toFixed(0)} tok/s, TTFT p50 ${r.ttftP50.toFixed(1)} ms, ITL p50 ${r.itlP50.toFixed(2)} ms, RSS ${r.rssStartMiB.toFixed(0)} -> ${r.rssEndMiB.toFixed(0)} MiB`)
const q = Math.floor(mem.length / 4)
console.log(`device memory used (MiB, sampled each second): first quarter max ${Math.max(...mem.slice(0, q))}, last quarter max ${Math.max(...mem.slice(-q))}, overall max ${Math.max(...mem)} (${mem.length} samples)`)
' "$WORK/serve.json" "$WORK/serve-mem.log"
  exit $rc
  ;;
random)
  # A random-weight qwen2 of shape $2 (1.5b, 7b; tools/gpu/random-gguf.py) from the Qwen
  # template put as MODEL_NAME=qwen.gguf, for speed runs: MODEL_NAME=random-$2.gguf ... bench.
  PYTHONPATH="$WORK/llama.cpp/gguf-py" python3 tools/gpu/random-gguf.py "$WORK/qwen.gguf" "$WORK/random-${2:?usage: gpu-check.sh random 1.5b|7b}.gguf" --shape "$2"
  ;;
*) echo "usage: gpu-check.sh put DIR | check | exact | js | serve | bench | random SHAPE" >&2; exit 2 ;;
esac
