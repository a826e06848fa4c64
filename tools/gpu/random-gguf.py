#!/usr/bin/env python3
"""A random-weight qwen2 GGUF of a chosen shape, for speed runs on shapes no package registry
ships (1.5B, 7B): the tokenizer and every other metadata key come from a real qwen2 GGUF (the
template), the weights are random blocks written straight in Q4_K_M's types (Q4_K, with Q6_K for
attn_v, ffn_down and the embedding/head as llama.cpp's Q4_K_M mix gives them), so nothing is
quantized and the file is written in seconds. Only speed means anything on such a model: its
text is noise.

    random-gguf.py TEMPLATE.gguf OUT.gguf --shape 1.5b|7b [--seed N]

Needs numpy and gguf-py (llama.cpp's `gguf-py`, on PYTHONPATH).
"""
import argparse
import os

import numpy as np
import gguf

# Qwen2.5's published shapes: hidden, layers, heads, KV heads, FFN, tied head.
SHAPES = {
    '1.5b': (1536, 28, 12, 2, 8960, True),
    '7b': (3584, 28, 28, 4, 18944, False),
    # Small enough to check the writer on a laptop.
    'tiny': (256, 2, 4, 2, 512, True),
}

Q4_K, Q6_K, F32 = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K, gguf.GGMLQuantizationType.F32


def blocks(rng, ty, rows, cols):
    """rows x cols weights of type `ty` as random blocks of plausible magnitude (|w| <~ 0.02)."""
    assert cols % 256 == 0, cols
    n = rows * cols // 256
    if ty == Q4_K:
        b = rng.integers(0, 256, size=(n, 144), dtype=np.uint8)
        b[:, 0:2] = np.frombuffer(np.float16(2e-5).tobytes(), np.uint8)
        b[:, 2:4] = np.frombuffer(np.float16(1e-4).tobytes(), np.uint8)
    else:
        b = rng.integers(0, 256, size=(n, 210), dtype=np.uint8)
        b[:, 208:210] = np.frombuffer(np.float16(5e-6).tobytes(), np.uint8)
    return b.reshape(rows, -1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('template')
    ap.add_argument('out')
    ap.add_argument('--shape', choices=sorted(SHAPES), required=True)
    ap.add_argument('--seed', type=int, default=0)
    a = ap.parse_args()
    d, layers, heads, kv_heads, ff, tied = SHAPES[a.shape]
    hd = d // heads
    reader = gguf.GGUFReader(a.template)
    arch = str(reader.fields['general.architecture'].contents())
    if arch != 'qwen2':
        raise SystemExit(f'the template must be a qwen2 GGUF, got {arch}')
    vocab = len(reader.fields['tokenizer.ggml.tokens'].contents())
    over = {
        'qwen2.block_count': layers,
        'qwen2.embedding_length': d,
        'qwen2.feed_forward_length': ff,
        'qwen2.attention.head_count': heads,
        'qwen2.attention.head_count_kv': kv_heads,
        'general.name': f'random qwen2 {a.shape}',
        'general.file_type': 15,
    }
    tmp = a.out + '.tmp'
    w = gguf.GGUFWriter(tmp, arch)
    for f in reader.fields.values():
        if f.name == 'general.architecture' or f.name.startswith('GGUF.'):
            continue
        vt = f.types[0]
        sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        val = over.get(f.name, f.contents())
        w.add_key_value(f.name, val, vt, sub_type=sub)
    rng = np.random.default_rng(a.seed)
    # (name, type, rows, cols); norms and biases are f32.
    mats = [('token_embd.weight', Q6_K, vocab, d)]
    vecs = [('output_norm.weight', d)]
    for i in range(layers):
        p = f'blk.{i}.'
        mats += [(p + 'attn_q.weight', Q4_K, d, d), (p + 'attn_k.weight', Q4_K, kv_heads * hd, d),
                 (p + 'attn_v.weight', Q6_K if i % 2 == 0 else Q4_K, kv_heads * hd, d), (p + 'attn_output.weight', Q4_K, d, d),
                 (p + 'ffn_gate.weight', Q4_K, ff, d), (p + 'ffn_up.weight', Q4_K, ff, d),
                 (p + 'ffn_down.weight', Q6_K if i % 2 == 0 else Q4_K, d, ff)]
        vecs += [(p + 'attn_norm.weight', d), (p + 'ffn_norm.weight', d), (p + 'attn_q.bias', d),
                 (p + 'attn_k.bias', kv_heads * hd), (p + 'attn_v.bias', kv_heads * hd)]
    if not tied:
        mats.append(('output.weight', Q6_K, vocab, d))
    for name, n in vecs:
        v = np.ones(n, np.float32) if name.endswith('norm.weight') else np.zeros(n, np.float32)
        w.add_tensor_info(name, v.shape, v.dtype, v.nbytes, F32)
    for name, ty, rows, cols in mats:
        bpb = 144 if ty == Q4_K else 210
        shape = (rows, cols // 256 * bpb)
        w.add_tensor_info(name, shape, np.dtype(np.uint8), rows * shape[1], ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, n in vecs:
        w.write_tensor_data(np.ones(n, np.float32) if name.endswith('norm.weight') else np.zeros(n, np.float32))
    for name, ty, rows, cols in mats:
        w.write_tensor_data(blocks(rng, ty, rows, cols))
    w.close()
    os.replace(tmp, a.out)
    print(f'{a.out}: qwen2 {a.shape} ({d} wide, {layers} layers, {heads}/{kv_heads} heads, FFN {ff}), {os.path.getsize(a.out) / 1e9:.2f} GB')


if __name__ == '__main__':
    main()
