#!/usr/bin/env python3
"""Runs llama.cpp's convert_hf_to_gguf.py (from LLAMA_CPP_SRC) with one change: a BPE tokenizer whose
pre-tokenizer hash is unknown is written as FAMILIES_BPE_PRE (default 'qwen2') instead of failing.
The fixtures' tokenizers are tiny trained ones; the tokenizer is not what they test.
Usage: convert.py MODEL_DIR --outfile OUT.gguf --outtype f32|q8_0 [other convert_hf_to_gguf args]"""
import os
import sys

SRC = os.environ.get("LLAMA_CPP_SRC", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".llama", "src-0.3.36"))
sys.path.insert(0, os.path.join(SRC, "gguf-py"))
sys.path.insert(0, SRC)

import conversion.base as base  # noqa: E402

_orig = base.TextModel.get_vocab_base_pre


def _get_vocab_base_pre(self, tokenizer):
    try:
        return _orig(self, tokenizer)
    except NotImplementedError:
        pre = os.environ.get("FAMILIES_BPE_PRE", "qwen2")
        print(f"convert.py: unknown BPE pre-tokenizer hash, writing tokenizer.ggml.pre={pre!r}", file=sys.stderr)
        return pre


base.TextModel.get_vocab_base_pre = _get_vocab_base_pre

import convert_hf_to_gguf  # noqa: E402

if __name__ == "__main__":
    sys.argv[0] = os.path.join(SRC, "convert_hf_to_gguf.py")
    convert_hf_to_gguf.main()
