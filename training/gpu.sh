#!/bin/bash
# The device side of the conversion (see README.md). Run from the repository root on the GPU machine.
#   bash training/gpu.sh part N          # stash GGUF chunk N (training/carry/gN) in $WORK
#   bash training/gpu.sh train PHASE ... # reassemble + check the GGUF, unpack the gguf wheel, run train.py
set -eo pipefail
export WORK=${WORK:-/tmp/rv}
mkdir -p "$WORK"
BASE_SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
case "$1" in
part)
  cp training/carry/g"$2"/* "$WORK"/
  ls -l "$WORK"
  ;;
train)
  shift
  if [ ! -f "$WORK/base.gguf" ]; then
    cat "$WORK"/gemma.part.* > "$WORK/base.gguf"
    echo "$BASE_SHA  $WORK/base.gguf" | sha256sum -c -
    rm -f "$WORK"/gemma.part.*
  fi
  if [ -d training/carry/whl ] && [ ! -d "$WORK/site/gguf" ]; then
    mkdir -p "$WORK/site" && (cd "$WORK/site" && python3 -m zipfile -e "$OLDPWD"/training/carry/whl/gguf-*.whl .)
  fi
  if [ -f training/data/train.bin ]; then mkdir -p "$WORK/data" && cp training/data/*.bin training/data/*.json "$WORK/data/"; fi
  export PYTHONPATH="$WORK/site" PYTHONUNBUFFERED=1
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
  python3 training/train.py --gguf "$WORK/base.gguf" "$@"
  ;;
*)
  echo "usage: gpu.sh part N | train --phase smoke|a|b [...]" >&2
  exit 2
  ;;
esac
