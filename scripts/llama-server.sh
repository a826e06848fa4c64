#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (CPU) as the anchor for load tests. The source is the
# llama.cpp vendored in PyPI's llama-cpp-python sdist, because package registries are all these
# machines reach. Release, the host's own CPU flags (GGML_NATIVE), only the server target; no
# libcurl, OpenSSL or web UI download (the server is only ever asked on loopback, and a download
# at build time would fail offline). The build goes to .llama/ (git-ignored). An existing binary
# is reused, so running it again costs nothing. Prints the binary's path; progress goes to stderr.
# `scripts/llama-server.sh llama-perplexity` builds that tool instead (the KL-divergence oracle's
# anchor, benches/kl.mjs), from the same configured tree; `llama-bench` builds llama.cpp's own
# benchmark (the race's third runtime, benches/race.mjs).
#
#   LLAMA_CPU                 native (default: -march=native, every flag the host has), avx2
#                             (AVX2 + FMA + F16C + BMI2 only, no AVX-512 or AVX-VNNI: what a CPU
#                             without AVX-512 runs; its own build directory, ...-avx2) or avxvnni
#                             (the same plus AVX-VNNI: Alder Lake and later, Zen 5 without
#                             AVX-512; build directory ...-avxvnni)
#   LLAMA_NO_BUILD            1: print the binary's path if it is built, else exit 3 (builds nothing)
#   LLAMA_CPP_PYTHON_VERSION  the sdist to build from (default 0.3.36)
#   LLAMA_SRC_TARBALL         a tarball with llama.cpp/ at its top, used instead of the download
#   JOBS                      parallel compile jobs (default 2)
#
# Then, for the same model and parallelism as ours:
#   "$(scripts/llama-server.sh)" -m MODEL.gguf --host 127.0.0.1 --port 8091 --parallel 4 -c 8192 -t 2
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
ROOT="$PWD/.llama"
CPU="${LLAMA_CPU:-native}"
case "$CPU" in
  native) BUILD="$ROOT/build-$VERSION"; CPU_FLAGS=(-DGGML_NATIVE=ON) ;;
  avx2)
    BUILD="$ROOT/build-$VERSION-avx2"
    CPU_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
      -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF) ;;
  avxvnni)
    BUILD="$ROOT/build-$VERSION-avxvnni"
    CPU_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
      -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=ON) ;;
  *) echo "llama-server.sh: LLAMA_CPU is native, avx2 or avxvnni, not '$CPU'" >&2; exit 2 ;;
esac
TARGET="${1:-llama-server}"
case "$TARGET" in
  llama-server | llama-perplexity | llama-bench) ;;
  *) echo "llama-server.sh: builds llama-server, llama-perplexity or llama-bench, not '$TARGET'" >&2; exit 2 ;;
esac
BIN="$BUILD/bin/$TARGET"

if [ -x "$BIN" ]; then
  echo "$BIN"
  exit 0
fi
[ "${LLAMA_NO_BUILD:-}" = 1 ] && exit 3
for tool in cmake c++ make; do
  command -v "$tool" >/dev/null || { echo "llama-server.sh: '$tool' is missing (apt-get install cmake g++ make, or pip install cmake)" >&2; exit 1; }
done

SRC="$(bash scripts/llama-src.sh)"

echo "== configuring llama.cpp ($CPU) from llama-cpp-python $VERSION in $BUILD" >&2
# The source has no git history of its own: keep git from finding this repository above it
# (ggml would take our commit for its own), and name the sdist as llama.cpp's build commit.
export GIT_CEILING_DIRECTORIES="$ROOT"
cmake -S "$SRC" -B "$BUILD" \
  -DCMAKE_BUILD_TYPE=Release \
  "${CPU_FLAGS[@]}" \
  -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF \
  -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_COMMIT="llama-cpp-python-$VERSION" >&2
echo "== building $TARGET (-j ${JOBS:-2})" >&2
start=$SECONDS
cmake --build "$BUILD" --target "$TARGET" -j "${JOBS:-2}" >&2
echo "== built in $((SECONDS - start)) s" >&2
echo "$BIN"
