#!/usr/bin/env python3
"""Requantizes an f32 GGUF with llama.cpp's own quantizer (ggml_quantize_chunk from node-llama-cpp's
prebuilt libggml-base.so, through ctypes), writing with gguf-py (all metadata, tokenizer included,
copied unchanged except general.file_type).

  requant.py IN.gguf OUT.gguf TYPE [--embd keep|q8_0|TYPE] [--from-quantized]

Every 2-D f32 '*.weight' tensor except token_embd.weight (and except norms, which are 1-D) becomes
TYPE; output.weight too. token_embd.weight stays as it is by default. No imatrix is used.
TYPE: Q2_K Q3_K IQ4_NL IQ4_XS Q4_1 Q5_K Q4_K Q6_K (also Q4_0 Q5_0 Q5_1 Q8_0)."""
import argparse
import ctypes
import os
import sys

import numpy as np

SRC = os.environ.get("LLAMA_CPP_SRC", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".llama", "src-0.3.36"))
sys.path.insert(0, os.path.join(SRC, "gguf-py"))
import gguf  # noqa: E402

LIB = os.environ.get("GGML_BASE_LIB", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                     "node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so"))

# enum ggml_type, ggml/include/ggml.h of that llama.cpp (same numbers as gguf.GGMLQuantizationType)
GGML_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10, "Q3_K": 11,
             "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "IQ4_NL": 20, "IQ4_XS": 23}
# enum llama_ftype for general.file_type (the "mostly" type)
FILE_TYPE = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K": 12, "Q4_K": 15,
             "Q5_K": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30}

# llama-quantize's type for a tensor whose rows are not a multiple of 256 (--from-quantized only)
FALLBACK = {"Q2_K": "IQ4_NL", "Q3_K": "IQ4_NL", "IQ4_XS": "IQ4_NL", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def load_ggml():
    lib = ctypes.CDLL(os.path.realpath(LIB))
    lib.ggml_quantize_init.argtypes = [ctypes.c_int]
    lib.ggml_quantize_init.restype = None
    lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_blck_size.argtypes = [ctypes.c_int]
    lib.ggml_blck_size.restype = ctypes.c_int64
    return lib


def quantize(lib, t: int, data: np.ndarray) -> np.ndarray:
    """data: f32 [nrows][n_per_row] -> uint8 [nrows][row_bytes]"""
    data = np.ascontiguousarray(data, dtype=np.float32)
    nrows, n_per_row = data.shape
    row_bytes = lib.ggml_row_size(t, n_per_row)
    out = np.zeros((nrows, row_bytes), dtype=np.uint8)
    n = lib.ggml_quantize_chunk(t, data.ctypes.data, out.ctypes.data, 0, nrows, n_per_row, None)
    assert n == out.nbytes, (n, out.nbytes)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("inp")
    ap.add_argument("out")
    ap.add_argument("type", choices=sorted(GGML_TYPE))
    ap.add_argument("--embd", default="keep", help="token_embd.weight: keep (default), or a type")
    ap.add_argument("--from-quantized", action="store_true",
                    help="also requantize quantized 2-D weights (dequantized by gguf-py first): a real model "
                         "in another type, for benchmarks")
    args = ap.parse_args()
    lib = load_ggml()
    qt = GGML_TYPE[args.type]
    if lib.ggml_quantize_requires_imatrix(qt):
        sys.exit(f"{args.type} needs an imatrix")
    lib.ggml_quantize_init(qt)  # builds the IQ grids where a type has them; a no-op otherwise
    blck = lib.ggml_blck_size(qt)

    rd = gguf.GGUFReader(args.inp)
    arch_f = rd.fields["general.architecture"]
    arch = bytes(arch_f.parts[arch_f.data[0]]).decode()
    align_f = rd.fields.get("general.alignment")
    w = gguf.GGUFWriter(args.out, arch, **({"use_temp_file": False}))
    if align_f is not None:
        w.data_alignment = int(align_f.contents())
    for f in rd.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        vt = f.types[0]
        st = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        val = f.contents()
        if f.name == "general.file_type":
            val = FILE_TYPE.get(args.type, val)
        w.add_key_value(f.name, val, vt, sub_type=st)

    counts = {}
    out_tensors = []
    for t in rd.tensors:
        data = np.asarray(t.data)
        ttype = gguf.GGMLQuantizationType(int(t.tensor_type))
        if (args.from_quantized and t.name.endswith(".weight") and t.name != "token_embd.weight" and len(t.shape) == 2
                and ttype not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType(qt))):
            data = gguf.quants.dequantize(data, ttype).astype(np.float32)
            ttype = gguf.GGMLQuantizationType.F32
        target = None
        if ttype == gguf.GGMLQuantizationType.F32 and data.ndim == 2 and t.name.endswith(".weight"):
            if t.name == "token_embd.weight":
                target = None if args.embd == "keep" else GGML_TYPE[args.embd.upper()]
            else:
                target = qt
        if (args.from_quantized and target is not None and data.shape[-1] % lib.ggml_blck_size(target) != 0
                and args.type in FALLBACK):
            # llama-quantize's choice for rows that do not fill a super-block (llama_tensor_get_type)
            target = GGML_TYPE[FALLBACK[args.type]]
        if target is not None and data.shape[-1] % lib.ggml_blck_size(target) != 0:
            print(f"requant: {t.name} row {data.shape[-1]} not a multiple of {blck}, kept f32", file=sys.stderr)
            target = None
        if target is None:
            out_tensors.append((t.name, data, ttype))
            counts[ttype.name] = counts.get(ttype.name, 0) + 1
        else:
            q = quantize(lib, target, data.reshape(-1, data.shape[-1]))
            q = q.reshape(*data.shape[:-1], q.shape[-1])
            tt = gguf.GGMLQuantizationType(target)
            out_tensors.append((t.name, q, tt))
            counts[tt.name] = counts.get(tt.name, 0) + 1
    for name, data, tt in out_tensors:
        w.add_tensor(name, data, raw_dtype=tt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"requant: {args.out}: {counts} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    main()
