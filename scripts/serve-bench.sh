#!/usr/bin/env bash
# The serving load test against its anchor, in alternating rounds: our server (`ruvllm serve`)
# and llama.cpp's `llama-server` (built by scripts/llama-server.sh) take turns on the same model,
# port range and client load (`ruvllm bench serve`), each started fresh for its turn, so both see
# the same machine state. Loopback only. Each turn's JSON goes to $OUT; the last lines are a
# table of tokens/s per client count, ours / llama-server, per round.
#
#   scripts/serve-bench.sh [MODEL.gguf]   (default: the test model, scripts/get-model.sh)
#
#   ROUNDS    alternating rounds (default 2)
#   DURATION  seconds per client count (default 60)
#   CLIENTS   client counts (default 1,4,8,16)
#   TOKENS    max_tokens per request (default 64)
#   CTX       context per sequence (default 1024)
#   THREADS   threads of both servers (default 2)
#   OUT       where the JSON goes (default .bench/serve-<time>)
#   LLAMA_SERVER  a llama-server binary to use instead of building one
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="${1:-$(scripts/get-model.sh)}"
[ -f "$MODEL" ] || { echo "serve-bench.sh: no model file at '$MODEL'" >&2; exit 1; }
ROUNDS="${ROUNDS:-2}" DURATION="${DURATION:-60}" CLIENTS="${CLIENTS:-1,4,8,16}" TOKENS="${TOKENS:-64}" CTX="${CTX:-1024}" THREADS="${THREADS:-2}"
OUT="${OUT:-.bench/serve-$(date -u +%Y%m%dT%H%M%S)}"
mkdir -p "$OUT"
PAR=$(echo "$CLIENTS" | tr ',' '\n' | sort -n | tail -1)
LLAMA="${LLAMA_SERVER:-$(scripts/llama-server.sh)}"
PORT=8093
PID=

stop() {
  if [ -n "$PID" ]; then
    kill -INT "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
    PID=
  fi
}
trap stop EXIT

wait_ready() {
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "serve-bench.sh: the server on port $PORT did not come up" >&2
  exit 1
}

turn() { # name round
  case "$1" in
    ours) node bin/ruvllm.js serve --model "$MODEL" --host 127.0.0.1 --port "$PORT" --parallel "$PAR" --context-size "$CTX" --threads "$THREADS" \
      >"$OUT/$1-$2.log" 2>&1 &
      PID=$! ;;
    llama) "$LLAMA" -m "$MODEL" --host 127.0.0.1 --port "$PORT" -np "$PAR" -c $((CTX * PAR)) -t "$THREADS" >"$OUT/$1-$2.log" 2>&1 &
      PID=$! ;;
  esac
  wait_ready
  echo "serve-bench.sh: round $2, $1 ..." >&2
  node bin/ruvllm.js bench serve --url "http://127.0.0.1:$PORT" --clients "$CLIENTS" --duration "$DURATION" --max-tokens "$TOKENS" --json \
    >"$OUT/$1-$2.json" || echo "serve-bench.sh: $1 round $2 had errors (see $OUT/$1-$2.json)" >&2
  stop
}

for r in $(seq 1 "$ROUNDS"); do
  turn ours "$r"
  turn llama "$r"
done

node -e '
const fs = require("fs"), out = process.argv[1], rounds = +process.argv[2]
const read = (n, r) => JSON.parse(fs.readFileSync(`${out}/${n}-${r}.json`, "utf8")).rows
console.log("| clients | round | tok/s ours | tok/s llama-server | ratio | TTFT p50 ours / llama, ms | ITL p50 ours / llama, ms | errors |")
console.log("|---:|---:|---:|---:|---:|---:|---:|---:|")
for (let r = 1; r <= rounds; r++) {
  const a = read("ours", r), b = read("llama", r)
  a.forEach((x, i) => {
    const y = b[i], f = (v) => v.toFixed(1)
    console.log(`| ${x.clients} | ${r} | ${f(x.tokensPerSecond)} | ${f(y.tokensPerSecond)} | ${(x.tokensPerSecond / y.tokensPerSecond).toFixed(2)} | ${f(x.ttftP50)} / ${f(y.ttftP50)} | ${f(x.itlP50)} / ${f(y.itlP50)} | ${x.errors} / ${y.errors} |`)
  })
}' "$OUT" "$ROUNDS"
