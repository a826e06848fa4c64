#!/usr/bin/env bash
# Unpacks the llama.cpp source vendored in PyPI's llama-cpp-python sdist into .llama/src-VERSION
# (git-ignored) once, and prints its path: the anchor builds (scripts/llama-server.sh) and the
# family fixtures (tools/families: llama.cpp's convert_hf_to_gguf.py and gguf-py) read it.
#
#   LLAMA_CPP_PYTHON_VERSION  the sdist (default 0.3.36)
#   LLAMA_SRC_TARBALL         a tarball with llama.cpp/ at its top, used instead of the download
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
ROOT="$PWD/.llama"
SRC="$ROOT/src-$VERSION"
mkdir -p "$ROOT"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  tmp="$(mktemp -d "$ROOT/unpack.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  if [ -n "${LLAMA_SRC_TARBALL:-}" ]; then
    tar -xf "$LLAMA_SRC_TARBALL" -C "$tmp"
    top="$tmp/llama.cpp"
  else
    echo "== downloading the llama-cpp-python $VERSION sdist" >&2
    # From PyPI's simple index (its JSON form, PEP 691), the sha256 it lists checked. Not `pip
    # download --no-binary :all:`: to read an sdist's metadata, pip then builds the build
    # requirements from source too (cmake among them: most of an hour on 2 cores).
    "${PYTHON:-python3}" - "$VERSION" "$tmp" "${PIP_INDEX_URL:-https://pypi.org/simple}" >&2 <<'PY'
import hashlib, json, os, sys, urllib.parse, urllib.request
version, dest, index = sys.argv[1], sys.argv[2], sys.argv[3].rstrip('/')
req = urllib.request.Request(f'{index}/llama-cpp-python/', headers={'Accept': 'application/vnd.pypi.simple.v1+json'})
with urllib.request.urlopen(req, timeout=60) as r:
    files = [f for f in json.load(r)['files'] if f['filename'].replace('-', '_') == f'llama_cpp_python_{version}.tar.gz']
if not files:
    sys.exit(f'llama-src.sh: {index} lists no sdist of llama-cpp-python {version}')
f = files[0]
path = os.path.join(dest, f['filename'])
with urllib.request.urlopen(urllib.parse.urljoin(f'{index}/llama-cpp-python/', f['url']), timeout=600) as r, open(path, 'wb') as out:
    while chunk := r.read(1 << 20):
        out.write(chunk)
got = hashlib.sha256(open(path, 'rb').read()).hexdigest()
if got != f['hashes']['sha256']:
    sys.exit(f"llama-src.sh: {f['filename']}: sha256 {got}, the index says {f['hashes']['sha256']}")
PY
    # The sdist's file name spells the project with underscores or dashes depending on its age.
    sdist="$(ls "$tmp"/llama[-_]cpp[-_]python-"$VERSION".tar.gz)"
    tar -xzf "$sdist" -C "$tmp"
    top="$(dirname "$sdist")/$(basename "$sdist" .tar.gz)/vendor/llama.cpp"
  fi
  [ -f "$top/CMakeLists.txt" ] || { echo "llama-src.sh: no llama.cpp source in the archive" >&2; exit 1; }
  rm -rf "$SRC"
  mv "$top" "$SRC"
fi
echo "$SRC"
