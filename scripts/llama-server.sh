#!/usr/bin/env bash
# Builds llama.cpp's llama-server (CPU) for the serving benchmark's anchor, from the llama.cpp
# source in PyPI's llama-cpp-python sdist (the only place a registry-only machine gets it), into
# .llama/ (git-ignored). Idempotent: prints the binary's path when it is already built.
# Usage: bash scripts/llama-server.sh   (about 10-20 min on 2 cores; needs a C++ compiler)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.llama
BIN="$OUT/llama.cpp/build/bin/llama-server"
if [ -x "$BIN" ]; then echo "$PWD/$BIN"; exit 0; fi
mkdir -p "$OUT"
command -v cmake >/dev/null && command -v ninja >/dev/null || python3 -m pip install --quiet cmake ninja
if [ ! -d "$OUT/llama.cpp" ]; then
  # The sdist itself, from PyPI's simple index (pip download would start building it).
  python3 - "$OUT" <<'PY'
import re, sys, tarfile, urllib.request
out = sys.argv[1]
html = urllib.request.urlopen("https://pypi.org/simple/llama-cpp-python/").read().decode()
url = re.search(r'href="([^"]*llama_cpp_python-0\.3\.36\.tar\.gz)[^"]*"', html).group(1)
path = f"{out}/llama-cpp-python.tar.gz"
urllib.request.urlretrieve(url, path)
with tarfile.open(path) as t:
    t.extractall(f"{out}/sdist", filter="data")
PY
  mv "$OUT"/sdist/llama_cpp_python-*/vendor/llama.cpp "$OUT/llama.cpp"
fi
cd "$OUT/llama.cpp"
cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
cmake --build build --target llama-server -j"$(nproc)" >/dev/null
echo "$PWD/build/bin/llama-server"
