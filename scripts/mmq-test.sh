#!/usr/bin/env bash
# Builds scripts/mmq-test.cu (the many-token product kernels' check and timing at Gemma 3 270M's
# prefill shapes; see scripts/cuda-test.sh): run the binary on the GPU machine: `mmq-test [n_tokens]`.
exec "$(dirname "$0")/cuda-test.sh" mmq-test "$@"
