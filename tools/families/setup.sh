#!/usr/bin/env bash
# Creates the Python venv for tools/families (CPU-only torch, transformers, gguf-py from the
# llama.cpp sdist). Idempotent: a marker file in the venv records a finished install.
#   RUVLLM_FAMILIES_VENV  venv path (default ~/.cache/ruvllm-families/venv)
#   LLAMA_CPP_SRC         llama.cpp source tree (default: the one vendored by llama-cpp-python 0.3.36)
set -euo pipefail
VENV="${RUVLLM_FAMILIES_VENV:-$HOME/.cache/ruvllm-families/venv}"
LLAMA_CPP_SRC="${LLAMA_CPP_SRC:-$(bash "$(dirname "$0")/../../scripts/llama-src.sh")}"
MARKER="$VENV/.ruvllm-families-ok"
PY="${PYTHON:-python3}"
start=$(date +%s)
if [ -f "$MARKER" ]; then
  echo "setup.sh: venv already complete at $VENV ($(cat "$MARKER"))"
  exit 0
fi
mkdir -p "$(dirname "$VENV")"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"
$PIP install -U pip wheel >/dev/null
# torch: PyPI's Linux wheel is the only one reachable (no download.pytorch.org/whl/cpu here). Its
# libtorch.so / libtorch_python.so are linked against libcudart, cublas(Lt), cudnn, cufft, cufile,
# cusparse(Lt), curand, nccl, nvshmem and cupti, so `pip install --no-deps torch` gives a torch whose
# `import torch` fails ("libcublasLt.so.*[0-9] not found"). So the CUDA wheels are installed too
# (~3 GB on disk), though only the CPU path is used. Version as in llama.cpp's
# requirements/requirements-convert_hf_to_gguf.txt.
TORCH_VER="${TORCH_VER:-2.11.0}"
$PIP install "torch==$TORCH_VER"
$PIP install "transformers==4.57.6" safetensors "sentencepiece>=0.1.98,<0.3.0" tokenizers "numpy~=2.2.6" "protobuf>=5.26"
# (protobuf: sentencepiece 0.2.x's sentencepiece_model_pb2, used by LlamaTokenizer(legacy=False), needs >= 5.26.)
# gguf-py from the same llama.cpp source as convert_hf_to_gguf.py (editable, so that they match).
$PIP install -e "$LLAMA_CPP_SRC/gguf-py"
"$VENV/bin/python" - <<'PY'
import torch, transformers, gguf, sentencepiece, safetensors, numpy
x = torch.randn(4, 4) @ torch.randn(4, 4)
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "transformers", transformers.__version__, "gguf", gguf.__file__)
PY
end=$(date +%s)
echo "torch=$TORCH_VER installed $(date -u +%FT%TZ) in $((end-start)) s" > "$MARKER"
echo "setup.sh: done in $((end-start)) s; venv size $(du -sh "$VENV" | cut -f1)"
