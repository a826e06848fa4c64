#!/usr/bin/env python3
"""KL(ref || other) per position between two f32 [N][vocab] files, softmax in float64.
  kl.py REF.f32 OTHER.f32 --vocab V [--other-is-logprobs] [--ref-is-logprobs] [--json]
REF / OTHER are logits unless told they are log-probabilities (any constant shift per row is fine
either way: both are log-softmaxed). Prints mean and max KL, the position of the max, and the
top-1 agreement."""
import argparse
import json
import sys

import numpy as np


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ref")
    ap.add_argument("other")
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--other-is-logprobs", action="store_true", help="(log-softmax is idempotent; accepted for clarity)")
    ap.add_argument("--ref-is-logprobs", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    r = np.fromfile(a.ref, dtype="<f4").astype(np.float64)
    o = np.fromfile(a.other, dtype="<f4").astype(np.float64)
    if r.size != o.size or r.size % a.vocab:
        sys.exit(f"size mismatch: {r.size} vs {o.size} floats, vocab {a.vocab}")
    r = log_softmax(r.reshape(-1, a.vocab))
    o = log_softmax(o.reshape(-1, a.vocab))
    kl = (np.exp(r) * (r - o)).sum(-1)
    res = {"n": int(kl.size), "mean_kl": float(kl.mean()), "max_kl": float(kl.max()), "argmax_pos": int(kl.argmax()),
           "top1_agree": float((r.argmax(-1) == o.argmax(-1)).mean())}
    if a.json:
        print(json.dumps(res))
    else:
        print(f"KL(ref||other) over {res['n']} positions: mean {res['mean_kl']:.3e}  max {res['max_kl']:.3e} "
              f"(pos {res['argmax_pos']})  top1 agree {res['top1_agree']:.3f}")


if __name__ == "__main__":
    main()
