"""The f32 reference for the KL-divergence oracle (benches/kl.mjs): next-token distributions of
Gemma 3 computed in numpy from the GGUF's weights dequantized to f32, with no activation
quantization (training/np_check.py's model), written in llama.cpp's `--kl-divergence-base`
format so that llama.cpp's own `llama-perplexity --kl-divergence` and our `examples/kl` read the
same file and score the same positions.

  python benches/kl_reference.py --gguf MODEL.gguf --tokens TOKENS.bin --ctx 512 --bos 2 --out REF.kld

TOKENS.bin: little-endian int32 token ids, a whole number of chunks of `--ctx` (the text
tokenized without special tokens). As llama-perplexity does, each chunk's first token is
replaced by BOS, and the positions from ctx/2 to ctx-2 are scored (each predicts the next).

File layout (llama.cpp tools/perplexity): "_logits_", u32 n_ctx, i32 n_vocab, i32 n_chunk,
n_ctx*n_chunk i32 tokens, then per scored position `n_vocab + 4` u16 (even vocabulary): f32
scale and f32 min log-probability, then each token's log-probability as
`min + scale * u16` (0 for anything more than 16 nats below the top logit).
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "training"))
from np_check import Base  # noqa: E402


def encode(logits):
    """llama.cpp's `log_softmax(n_vocab, logits, log_prob, tok)` for a block of rows: (rows, n_vocab + 4) u16."""
    rows, n_vocab = logits.shape
    assert n_vocab % 2 == 0, "an odd vocabulary needs llama.cpp's padding"
    max_l = logits.max(axis=1)
    min_l = np.maximum(logits.min(axis=1), max_l - 16)
    sum_exp = np.exp((logits - max_l[:, None]).astype(np.float32)).astype(np.float64).sum(axis=1)
    lse = np.log(sum_exp).astype(np.float32)
    min_log_prob = (min_l - max_l - lse).astype(np.float32)
    scale = ((max_l - min_l) / np.float32(65535.0)).astype(np.float32)
    out = np.zeros((rows, n_vocab + 4), dtype=np.uint16)
    head = np.zeros((rows, 2), dtype=np.float32)
    head[:, 0], head[:, 1] = scale, min_log_prob
    out[:, :4] = head.view(np.uint16)
    inv = np.where(scale > 0, 1.0 / np.where(scale > 0, scale, 1), 0).astype(np.float32)
    # nearest_int: round half to even through the 1.5 * 2^23 trick, as llama.cpp.
    q = ((logits - min_l[:, None]) * inv[:, None] + np.float32(12582912.0)).astype(np.float32) - np.float32(12582912.0)
    q = np.where(logits > min_l[:, None], q, 0)
    out[:, 4:] = np.clip(q, 0, 65535).astype(np.uint16)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--bos", type=int, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    tokens = np.fromfile(a.tokens, dtype="<i4")
    n_ctx = a.ctx
    if len(tokens) == 0 or len(tokens) % n_ctx:
        sys.exit(f"kl_reference: {len(tokens)} tokens is not a whole number of {n_ctx}-token chunks")
    n_chunk = len(tokens) // n_ctx
    t0 = time.time()
    base = Base(a.gguf)
    n_vocab = base.w["token_embd.weight"].shape[0]
    print(f"kl_reference: weights dequantized in {time.time() - t0:.1f} s; {n_chunk} chunks of {n_ctx}, vocabulary {n_vocab}", file=sys.stderr)
    first = n_ctx // 2
    tmp = a.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"_logits_")
        np.array([n_ctx], dtype="<u4").tofile(f)
        np.array([n_vocab, n_chunk], dtype="<i4").tofile(f)
        tokens.astype("<i4").tofile(f)
        for c in range(n_chunk):
            t = time.time()
            ids = tokens[c * n_ctx:(c + 1) * n_ctx].copy()
            ids[0] = a.bos
            h = base.forward(ids.tolist(), causal=True)
            logits = base.logits(h[first:n_ctx - 1]).astype(np.float32)
            encode(logits).astype("<u2").tofile(f)
            print(f"kl_reference: chunk {c + 1}/{n_chunk} in {time.time() - t:.1f} s", file=sys.stderr)
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
