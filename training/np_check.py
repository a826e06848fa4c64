"""A CPU check of the exported adapters, independent of PyTorch: Gemma 3 in numpy (f32) from the
GGUF, plus a LoRA GGUF from export.py. Checks that the AR base matches the runtime's greedy tokens
and runs the greedy diffusion probe for each adapter set.

  .venv/bin/python training/np_check.py --gguf <base.gguf> --dir <folder with talora-t*.gguf / lora.gguf>
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export  # noqa: E402

MASK = 4
SUPPRESS = [0, 2, 3, MASK, 105, 106]


class Base:
    def __init__(self, path):
        from gguf import GGUFReader
        from gguf.quants import dequantize
        r = GGUFReader(path)
        self.w = {}
        for t in r.tensors:
            a = dequantize(t.data, t.tensor_type).astype(np.float32)
            self.w[t.name] = a.reshape(tuple(int(x) for x in reversed(t.shape.tolist())))
        self.n_layer, self.d, self.nh, self.hd, self.eps = 18, 640, 4, 256, 1e-6

    def rms(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def rope(self, x, base):  # x (L, H, D)
        L, _, D = x.shape
        inv = 1.0 / base ** (np.arange(0, D, 2, dtype=np.float64) / D)
        ang = np.arange(L)[:, None] * inv[None, :]
        cos = np.cos(np.concatenate([ang, ang], -1))[:, None, :].astype(np.float32)
        sin = np.sin(np.concatenate([ang, ang], -1))[:, None, :].astype(np.float32)
        h = D // 2
        xr = np.concatenate([-x[..., h:], x[..., :h]], -1)
        return x * cos + xr * sin

    def forward(self, ids, adapter=None, causal=False):
        """Final-norm hidden states (L, d). adapter: (factors, scale, mask_row) or None."""
        w = self.w
        E = w["token_embd.weight"]
        x = E[ids].copy()
        if adapter is not None:
            x[np.array(ids) == MASK] = adapter[2]
        x *= math.sqrt(self.d)
        L = len(ids)
        names = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}

        def lin(h, i, p):
            y = h @ w[f"blk.{i}.{names[p]}.weight"].T
            if adapter is not None:
                A, B = adapter[0][(i, p)]
                y = y + adapter[1] * ((h @ A.T) @ B.T)
            return y

        for i in range(self.n_layer):
            p = f"blk.{i}."
            h = self.rms(x, w[p + "attn_norm.weight"])
            q = lin(h, i, "q").reshape(L, self.nh, self.hd)
            k = lin(h, i, "k").reshape(L, 1, self.hd)
            v = lin(h, i, "v").reshape(L, 1, self.hd)
            q = self.rms(q, w[p + "attn_q_norm.weight"])
            k = self.rms(k, w[p + "attn_k_norm.weight"])
            base = 1e6 if (i + 1) % 6 == 0 else 1e4
            q, k = self.rope(q, base), self.rope(k, base)
            s = np.einsum("qhd,kd->hqk", q, k[:, 0]) / math.sqrt(self.hd)
            if causal:
                s = s + np.triu(np.full((L, L), -np.inf, dtype=np.float32), 1)[None]
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("hqk,kd->qhd", s, v[:, 0]).reshape(L, self.nh * self.hd)
            x = x + self.rms(lin(o, i, "o"), w[p + "post_attention_norm.weight"])
            h = self.rms(x, w[p + "ffn_norm.weight"])
            g = lin(h, i, "gate")
            g = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
            x = x + self.rms(lin(g * lin(h, i, "up"), i, "down"), w[p + "post_ffw_norm.weight"])
        return self.rms(x, w["output_norm.weight"])

    def logits(self, h):
        return h @ self.w["token_embd.weight"].T


def load_adapter(path):
    meta, factors, mask_row = export.read_adapter(path)
    rank = factors[(0, "q")][0].shape[0]
    return (factors, meta["adapter.lora.alpha"] / rank, mask_row), meta


def diffuse(base, pick, prompt, n, order="confidence"):
    x = list(prompt) + [MASK] * n
    P = len(prompt)
    trace = []
    for _ in range(n):
        masked = [j for j in range(P, P + n) if x[j] == MASK]
        ratio = len(masked) / n
        h = base.forward(x, pick(ratio))
        lg = base.logits(h[[j - 1 for j in masked]])
        lg[:, SUPPRESS] = -np.inf
        p = np.exp(lg - lg.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        tok, conf = p.argmax(-1), p.max(-1)
        i = int(conf.argmax()) if order == "confidence" else 0
        x[masked[i]] = int(tok[i])
        trace.append({"pos": masked[i] - P, "tok": int(tok[i]), "p": round(float(conf[i]), 3),
                      "p_first_pos_top": [int(tok[0]), round(float(conf[0]), 3)]})
    return x[P:], trace


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--ar", type=int, default=1)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    base = Base(a.gguf)
    prompts = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "prompts.json")))
    out = {}
    if a.ar:
        ref = [[15687, 236761, 669, 5279, 529, 11702, 563, 13706], [993, 11742, 496, 2523, 529, 2390, 236761, 2195]]
        for pi in (0, 1):
            ids = list(prompts[pi])
            got = []
            for _ in range(8):
                nxt = int(base.logits(base.forward(ids, None, causal=True)[-1]).argmax())
                got.append(nxt)
                ids.append(nxt)
            out[f"ar_greedy_{pi}"] = {"numpy_f32": got, "runtime": ref[pi], "match": sum(x == y for x, y in zip(got, ref[pi]))}
            print(out[f"ar_greedy_{pi}"], flush=True)
    sets = {}
    if os.path.exists(os.path.join(a.dir, "talora-t0.gguf")):
        ts = [load_adapter(os.path.join(a.dir, f"talora-t{k}.gguf"))[0] for k in range(3)]
        sets["talora"] = lambda r: ts[0 if r < 0.3 else (1 if r < 0.6 else 2)]
    if os.path.exists(os.path.join(a.dir, "lora.gguf")):
        s = load_adapter(os.path.join(a.dir, "lora.gguf"))[0]
        sets["single"] = lambda r: s
    for name, pick in sets.items():
        for order in ("confidence", "left-to-right"):
            toks, trace = diffuse(base, pick, prompts[0], 4, order)
            out[f"probe_{name}_{order}"] = {"ids": toks, "berlin_first": toks[0] == 15687, "trace": trace}
            print(name, order, toks, trace, flush=True)
    print(json.dumps({k: (v.get("berlin_first"), v["ids"]) if "ids" in v else v["match"] for k, v in out.items()}))
    if a.out:
        json.dump(out, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
