#!/usr/bin/env bash
# Builds scripts/head-test.cu (the one-token LM head's check and timing at Gemma 3 270M's shape;
# see scripts/cuda-test.sh): run the binary on the GPU machine: `head-test [rows cols]`.
exec "$(dirname "$0")/cuda-test.sh" head-test "$@"
