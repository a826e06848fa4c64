#!/usr/bin/env python3
"""Prints a GGUF's metadata (token arrays summarized) and its tensors (blk.0 and non-block ones).
  dump_gguf.py FILE.gguf [--all-blocks]"""
import os
import sys

SRC = os.environ.get("LLAMA_CPP_SRC", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".llama", "src-0.3.36"))
sys.path.insert(0, os.path.join(SRC, "gguf-py"))
import gguf  # noqa: E402

rd = gguf.GGUFReader(sys.argv[1])
for f in rd.fields.values():
    if f.name.startswith("GGUF."):
        continue
    t = f.types[0].name + (f"[{f.types[-1].name}]" if f.types[0] == gguf.GGUFValueType.ARRAY else "")
    v = f.contents()
    if isinstance(v, list) and len(v) > 8:
        v = f"<{len(v)} items> {v[:4]}..."
    print(f"{f.name} ({t}) = {v}")
for t in rd.tensors:
    if "--all-blocks" in sys.argv or not t.name.startswith("blk.") or t.name.startswith("blk.0."):
        print(f"tensor {t.name} {t.tensor_type.name} ne={list(map(int, t.shape))}")
