"""Masked-diffusion conversion of Gemma 3 270M with LoRA adapters: TALoRA (three timestep
buckets, rank r each) against one LoRA of rank 3r, trained in lockstep on the same batches,
masks and t. Runs on the GPU machine; see README.md.

  python training/train.py --phase smoke   # a few steps of everything (checks the code paths)
  python training/train.py --phase a       # self-distillation + training chunk 1 (+ quick eval, export)
  python training/train.py --phase b       # training chunk 2 (resumed) + full eval, probe, export, check

Continued training (the second run): `--phase a --init-gguf <shipped lora.gguf>` starts the single LoRA
from that file instead of zero and warm-starts every TALoRA set from its rank-r truncated SVD
(`svd_init`); `--distill-temp`, `--extra-data` and `--lr` set the new run's data and schedule.

Everything it makes goes to $OUT (results.json with the log, adapters, distill.bin); the resumable checkpoint
(f32 factors + Adam moments) stays in $WORK (default /tmp/rv) while the machine is warm, and the
exported GGUFs in $OUT are themselves a checkpoint (--resume-gguf DIR).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export  # noqa: E402
from gemma import MASK_ID, PROJS, Adapter, Gemma, load_base  # noqa: E402

T0 = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.environ.get("OUT", "/tmp/rv-out")
WORK = os.environ.get("WORK", "/tmp/rv")
BUCKETS = [(0.0, 0.3), (0.3, 0.6), (0.6, 1.0)]
EPS_T = 1e-3
SUPPRESS = [0, 2, 3, MASK_ID, 105, 106]  # pad, bos, unk, mask, start/end_of_turn: never committed
LOG = []


def log(*a):
    s = " ".join(str(x) for x in a)
    print(f"[{time.time() - T0:7.1f}s] {s}", flush=True)
    LOG.append(s)


class Composite(torch.nn.Module):
    """TALoRA with a shared part: a bucket's adapter = the shared LoRA (rank rs, on every t) + the
    bucket's own residual LoRA (rank rb), both at alpha/r = 2, so the sum is one LoRA of rank
    rs + rb with the factors stacked (A = [A_s; A_r], B = [B_s, B_r]). The mask row is the shared
    one. Three buckets with rs + 3 rb = the single LoRA's rank have its parameter count."""

    def __init__(self, shared, res):
        super().__init__()
        self.shared, self.res = shared, res
        self.rank = shared.rank + res.rank
        self.alpha, self.scale = 2.0 * self.rank, 2.0
        assert shared.scale == 2.0 and res.scale == 2.0

    @property
    def mask_row(self):
        return self.shared.mask_row

    def layer(self, i):
        return tuple((torch.cat([a_s, a_r], 0), torch.cat([b_s, b_r], 1))
                     for (a_s, b_s), (a_r, b_r) in zip(self.shared.layer(i), self.res.layer(i)))

    def factors(self):
        return export.stack_factors(self.shared.factors(), self.res.factors())


class MultiOpt:
    """The optimizers of a Composite: the shared part's (stepped by every bucket) and the bucket's own."""

    def __init__(self, opts):
        self.opts = opts
        self.param_groups = [g for o in opts for g in o.param_groups]

    def step(self):
        for o in self.opts:
            o.step()

    def zero_grad(self, set_to_none=True):
        for o in self.opts:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return [o.state_dict() for o in self.opts]

    def load_state_dict(self, sd):
        for o, d in zip(self.opts, sd):
            o.load_state_dict(d)


def unique_params(mods):
    seen, n = set(), 0
    for m in mods:
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                n += p.numel()
    return n


def bucket_of(t):
    return 0 if t < 0.3 else (1 if t < 0.6 else 2)


# ---------------------------------------------------------------- self-distillation
@torch.no_grad()
def sample_ar(model, prompts, seq, temp, seed, batch=512):
    """Continue each prompt (token list, BOS first) with the AR model (causal, KV cache) to
    exactly `seq` tokens; special tokens never sampled."""
    dev = model.E.device
    g = torch.Generator(device=dev).manual_seed(seed)
    out = []
    for s0 in range(0, len(prompts), batch):
        ps = prompts[s0:s0 + batch]
        B = len(ps)
        lens = torch.tensor([len(p) for p in ps], device=dev)
        P = int(lens.max())
        G = seq - int(lens.min())
        T = P + G
        pads = P - lens
        ids = torch.zeros(B, P, dtype=torch.long, device=dev)
        for i, p in enumerate(ps):
            ids[i, P - len(p):] = torch.tensor(p, device=dev)
        ar = torch.arange(T, device=dev)
        valid = ar[None, :] >= pads[:, None]
        pos = (ar[None, :] - pads[:, None]).clamp(min=0)
        cfg = model.cfg
        caches = [(torch.zeros(B, cfg.n_kv, T, cfg.head_dim, dtype=torch.bfloat16, device=dev),
                   torch.zeros(B, cfg.n_kv, T, cfg.head_dim, dtype=torch.bfloat16, device=dev)) for _ in range(cfg.n_layer)]
        causal = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
        am = (valid[:, None, None, :P] & causal[None, None]) | torch.eye(P, dtype=torch.bool, device=dev)[None, None]
        h = model.hidden(ids, pos=pos[:, :P], attn_mask=am, caches=caches, start=0)
        toks = []
        last = h[:, -1]
        for s in range(G):
            lg = model.logits(last) / temp
            lg[:, SUPPRESS + [1]] = -float("inf")
            nxt = torch.multinomial(torch.softmax(lg, -1), 1, generator=g)  # (B, 1)
            toks.append(nxt)
            if s == G - 1:
                break
            at = P + s
            h = model.hidden(nxt, pos=pos[:, at:at + 1], attn_mask=valid[:, None, None, :at + 1], caches=caches, start=at)
            last = h[:, -1]
        gen = torch.cat(toks, 1).cpu()
        for i, p in enumerate(ps):
            out.append(list(p) + gen[i, :seq - len(p)].tolist())
    return torch.tensor(out, dtype=torch.long)


# ---------------------------------------------------------------- loss
def make_noise(ids, bucket, gen, prefix_prob=0.5, t=None):
    """Mask pattern for one batch: t per sequence (stratified within the bucket), optional
    unmasked prefix; BOS (position 0) never masked."""
    B, L = ids.shape
    dev = ids.device
    lo, hi = BUCKETS[bucket] if bucket is not None else (0.0, 1.0)
    lo = max(lo, EPS_T)
    if t is None:
        u = torch.rand(B, generator=gen, device=dev)
        perm = torch.randperm(B, generator=gen, device=dev)
        t = lo + (hi - lo) * (perm.float() + u) / B
    pos = torch.arange(L, device=dev)
    has_prefix = torch.rand(B, generator=gen, device=dev) < prefix_prob
    plen = (torch.rand(B, generator=gen, device=dev) * 0.5 * (L - 1)).long() * has_prefix
    maskable = (pos[None, :] >= 1) & (pos[None, :] > plen[:, None])
    mask = (torch.rand(B, L, generator=gen, device=dev) < t[:, None]) & maskable
    return t, mask, maskable


def diffusion_loss(model, adapter, ids, t, mask, maskable, train=True):
    noisy = torch.where(mask, torch.full_like(ids, MASK_ID), ids)
    h = model.hidden(noisy, adapter, train=train)
    b, j = mask.nonzero(as_tuple=True)
    logits = model.logits(h[b, j - 1])  # the AR shift: position j-1 predicts token j
    ce = F.cross_entropy(logits, ids[b, j], reduction="none")
    w = 1.0 / t[b]
    return (ce * w).sum() / maskable.sum(), ce.detach()


def block_layout(L, P, bs, dev):
    """The attention our block decoder runs, as one training sequence (BD3-LM's two streams):
    a clean stream of the L tokens, then for each answer block [s, e) (s = P, P + bs, ...) a
    noisy call of the token before it and the block itself (positions s-1 .. e-1), padded to a
    fixed length per block size so the compiled layer sees one shape. The clean prompt
    (positions < P - 1) sees itself (it is evaluated in one call); a clean answer position in
    [s-1, e-1) (the rows the block's last call leaves in the cache) sees everything before e-1;
    a noisy call sees the clean positions before s-1 and its own rows. (The decoder's last call
    also showed those rows position e-1 as it stood then; letting the clean stream see it would
    leak: its final state has seen the next block, and two layers carry that back to the rows a
    noisy call reads.) Returns (src, pos, am, rows, targets): the
    clean index each row copies, its position, the boolean mask, and for every row of a noisy
    call that predicts a block position, (row, target position)."""
    starts = list(range(P, L, bs))
    calls = [(s - 1, min(s + bs, L)) for s in starts]
    n_noisy = sum(e - c0 for c0, e in calls)
    T_max = L + ((L - 1) + bs - 1) // bs * (bs + 1)
    T = L + n_noisy
    src = torch.zeros(T_max, dtype=torch.long)
    pos = torch.zeros(T_max, dtype=torch.long)
    am = torch.zeros(T_max, T_max, dtype=torch.bool)
    src[:L] = torch.arange(L)
    pos[:L] = torch.arange(L)
    # Clean: the prompt sees the prompt, an answer position its block and everything before.
    vis = torch.empty(L, dtype=torch.long)
    vis[:max(P - 1, 0)] = max(P - 1, 1)
    for (c0, e) in calls:
        vis[c0:e - 1] = e - 1
    vis[L - 1] = L
    ar = torch.arange(L)
    am[:L, :L] = ar[None, :] < vis[:, None]
    rows, tgts = [], []
    at = L
    for (c0, e) in calls:
        n = e - c0
        src[at:at + n] = torch.arange(c0, e)
        pos[at:at + n] = torch.arange(c0, e)
        am[at:at + n, :c0] = True
        am[at:at + n, at:at + n] = True
        for j in range(n - 1):
            rows.append(at + j)
            tgts.append(c0 + j + 1)
        at += n
    # Padding rows see themselves only (no loss reads them).
    idx = torch.arange(T, T_max)
    am[idx, idx] = True
    return (src.to(dev), pos.to(dev), am[None, None].to(dev), torch.tensor(rows, device=dev), torch.tensor(tgts, device=dev), T)


def block_loss(model, adapter, ids, gen, bs, train=True):
    """The masked-diffusion loss under the block decoder's attention (`block_layout`): one prompt
    length for the batch, a mask ratio t per sequence and block, the AR shift (a call's row j
    predicts the block's position j)."""
    Bsz, L = ids.shape
    dev = ids.device
    P = int(torch.randint(1, int(L * 0.75), (1,), generator=gen, device=dev))
    src, pos, am, rows, tgts, T = block_layout(L, P, bs, dev)
    nb = (L - P + bs - 1) // bs
    t = (torch.rand(Bsz, nb, generator=gen, device=dev) * (1 - EPS_T) + EPS_T)
    blk = (tgts - P) // bs  # (R,)
    tr = t[:, blk]  # (B, R)
    masked = torch.rand(Bsz, len(tgts), generator=gen, device=dev) < tr
    x = ids[:, src]  # (B, T_max)
    noisy_at = torch.zeros(Bsz, x.shape[1], dtype=torch.bool, device=dev)
    # A masked target is masked in its call (row j + 1 holds position j + 1).
    noisy_at[:, rows + 1] = masked
    x = torch.where(noisy_at, torch.full_like(x, MASK_ID), x)
    h = model.hidden(x, adapter, pos=pos[None].expand(Bsz, -1), attn_mask=am, train=train)
    b, r = masked.nonzero(as_tuple=True)
    logits = model.logits(h[b, rows[r]])
    ce = F.cross_entropy(logits, ids[b, tgts[r]], reduction="none")
    loss = (ce / tr[b, r]).sum() / (Bsz * (L - P))
    return loss, masked


# ---------------------------------------------------------------- evaluation
@torch.no_grad()
def elbo(model, adapters, data, K=8, seed=1234, bs=16):
    """Diffusion NELBO per token (nats) on `data` (N, L): for each sequence, K stratified
    t_k = (k + u)/K; the bound is mean_k (1/t_k) sum_{masked j} -log p(x_j | x_t).
    adapters: one Adapter, a list of three (TALoRA, chosen by t), or None (the base)."""
    dev = data.device
    g = torch.Generator(device=dev).manual_seed(seed)
    N, L = data.shape
    u = torch.rand(N, generator=g, device=dev)
    total = 0.0
    per_k = [0.0] * K
    for k in range(K):
        t_all = ((k + u) / K).clamp(min=EPS_T)
        for s in range(0, N, bs):
            ids = data[s:s + bs]
            t = t_all[s:s + bs]
            _, mask, maskable = make_noise(ids, None, g, prefix_prob=0.0, t=t)
            if isinstance(adapters, list):
                bks = torch.tensor([bucket_of(float(x)) for x in t], device=dev)
                groups = [(bk, bks == bk) for bk in range(3) if bool((bks == bk).any())]
            else:
                groups = [(None, torch.ones(len(t), dtype=torch.bool, device=dev))]
            for bk, sel in groups:
                ad = adapters[bk] if bk is not None else adapters
                noisy = torch.where(mask[sel], torch.full_like(ids[sel], MASK_ID), ids[sel])
                h = model.hidden(noisy, ad)
                b, j = mask[sel].nonzero(as_tuple=True)
                ce = F.cross_entropy(model.logits(h[b, j - 1]), ids[sel][b, j], reduction="none")
                v = float((ce / t[sel][b]).sum())
                total += v
                per_k[k] += v
    n_tok = N * (L - 1)
    return total / K / n_tok, [x / (N * (L - 1)) for x in per_k]


@torch.no_grad()
def ar_nll(model, data, bs=8):
    tot = 0.0
    for s in range(0, len(data), bs):
        ids = data[s:s + bs]
        h = model.hidden(ids, None, is_causal=True)
        lg = model.logits(h[:, :-1].reshape(-1, h.shape[-1]))
        tot += float(F.cross_entropy(lg, ids[:, 1:].reshape(-1), reduction="sum"))
    return tot / (len(data) * (data.shape[1] - 1))


@torch.no_grad()
def ar_greedy(model, prompt, n):
    ids = torch.tensor([prompt], device=model.E.device)
    out = []
    for _ in range(n):
        h = model.hidden(ids, None, is_causal=True)
        nxt = int(model.logits(h[:, -1]).argmax(-1))
        out.append(nxt)
        ids = torch.cat([ids, torch.tensor([[nxt]], device=ids.device)], 1)
    return out


@torch.no_grad()
def diffuse(model, adapters, prompt, n_gen):
    """Greedy masked-diffusion decoding, one commit a step (the most confident masked position).
    TALoRA picks its adapter by the answer's current mask ratio."""
    dev = model.E.device
    x = torch.tensor([prompt + [MASK_ID] * n_gen], device=dev)
    P = len(prompt)
    order = []
    for _ in range(n_gen):
        masked = (x[0] == MASK_ID).nonzero().flatten()
        ratio = len(masked) / n_gen
        ad = adapters[bucket_of(ratio)] if isinstance(adapters, list) else adapters
        h = model.hidden(x, ad)
        lg = model.logits(h[0, masked - 1])
        lg[:, SUPPRESS] = -float("inf")
        p = torch.softmax(lg, -1)
        conf, tok = p.max(-1)
        i = int(conf.argmax())
        x[0, masked[i]] = tok[i]
        order.append(int(masked[i]) - P)
    return x[0, P:].tolist(), order


# ---------------------------------------------------------------- checkpoints / export
def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@torch.no_grad()
def svd_init(talora, single):
    """Warm start of TALoRA at equal parameters: every bucket's rank-r set = the best rank-r
    approximation (truncated SVD) of the single LoRA's delta (alpha/R)·B·A, per projection, and
    the single LoRA's mask row. Returns the mean fraction of squared singular values kept.
    (Residual TALoRA: `talora` is [shared]; the residuals keep B = 0.)"""
    r, c = talora[0].rank, single.scale / talora[0].scale
    kept = []
    for k in range(len(single.A)):
        A, B = single.A[k].double(), single.B[k].double()  # (R, in), (out, R)
        Qb, Rb = torch.linalg.qr(B)
        Qa, Ra = torch.linalg.qr(A.T)
        U, S, Vh = torch.linalg.svd(Rb @ Ra.T)  # B·A = (Qb U) S (Vh Qa^T)
        s = (c * S[:r]).sqrt()
        Bt = (Qb @ U[:, :r]) * s[None, :]
        At = s[:, None] * (Vh[:r] @ Qa.T)
        for ad in talora:
            ad.A[k].copy_(At.float())
            ad.B[k].copy_(Bt.float())
        kept.append(float((S[:r] ** 2).sum() / (S ** 2).sum().clamp(min=1e-30)))
    for ad in talora:
        ad.mask_row.copy_(single.mask_row)
    return sum(kept) / len(kept)


def save_ckpt(path, st):
    tmp = path + ".tmp"
    torch.save(st, tmp)
    os.replace(tmp, path)


def export_all(talora, single, outdir, parts=None):
    """Writes the adapters. Residual TALoRA (`parts` = [shared, res0, res1, res2]): the parts come back
    (`export.py compose` stacks them into talora-t{k}.gguf there); the stacked files stay in WORK for the
    export check, which keeps the returned files within 8."""
    os.makedirs(outdir, exist_ok=True)
    files = []
    for bk, ad in enumerate(talora):
        p = os.path.join(outdir if parts is None else WORK, f"talora-t{bk}.gguf")
        export.write_adapter(p, ad.factors(), ad.rank, ad.alpha, ad.mask_row.detach().float().cpu().numpy(), *BUCKETS[bk])
        files.append(p)
    if parts is not None:
        mrow = parts[0].mask_row.detach().float().cpu().numpy()
        for nm, ad, (lo, hi) in zip(["talora-shared.gguf"] + [f"talora-res{k}.gguf" for k in range(3)], parts, [(0.0, 1.0)] + BUCKETS):
            export.write_adapter(os.path.join(outdir, nm), ad.factors(), ad.rank, ad.alpha, mrow, lo, hi)
    p = os.path.join(WORK, "lora.gguf")
    export.write_adapter(p, single.factors(), single.rank, single.alpha, single.mask_row.detach().float().cpu().numpy(), 0.0, 1.0)
    data = open(p, "rb").read()
    half = (len(data) + 1) // 2
    for k in range(2):  # a file back from the device is at most 16 MB
        with open(os.path.join(outdir, f"lora.gguf.part{k}"), "wb") as f:
            f.write(data[k * half:(k + 1) * half])
    files.append(p)
    log("exported", [os.path.basename(f) + f" {os.path.getsize(f) / 1e6:.1f} MB" for f in files])
    return files


def load_gguf_into(ad, path):
    _, factors, mask_row = export.read_adapter(path)
    n = len(PROJS)
    with torch.no_grad():
        for k in range(len(ad.A)):
            A, B = factors[(k // n, PROJS[k % n])]
            ad.A[k].copy_(torch.from_numpy(A))
            ad.B[k].copy_(torch.from_numpy(B))
        ad.mask_row.copy_(torch.from_numpy(mask_row))


@torch.no_grad()
def check_export(model, ad, path, data, seed=7):
    """(base + LoRA) logits from the exported f16 factors vs the trained f32 ones."""
    dev = model.E.device
    re = Adapter(model.cfg, ad.rank, ad.alpha, ad.mask_row, 0).to(dev)
    load_gguf_into(re, path)
    g = torch.Generator(device=dev).manual_seed(seed)
    ids = data[:4]
    meta, _, _ = export.read_adapter(path)
    tmid = torch.full((len(ids),), (meta["ruvllm.diffusion.t_min"] + meta["ruvllm.diffusion.t_max"]) / 2, device=dev)
    _, mask, _ = make_noise(ids, None, g, prefix_prob=0.0, t=tmid)
    noisy = torch.where(mask, torch.full_like(ids, MASK_ID), ids)
    b, j = mask.nonzero(as_tuple=True)
    b, j = b[:64], j[:64]
    la = model.logits(model.hidden(noisy, ad)[b, j - 1])
    lb = model.logits(model.hidden(noisy, re)[b, j - 1])
    l0 = model.logits(model.hidden(noisy, None)[b, j - 1])
    r = {"positions": int(len(b)), "max_abs_diff": float((la - lb).abs().max()),
         "rel_diff": float((la - lb).norm() / la.norm()),
         "adapter_effect_rel": float((la - l0).norm() / la.norm()),
         "top1_agree": float((la.argmax(-1) == lb.argmax(-1)).float().mean())}
    r["ok"] = r["rel_diff"] < 0.02 and r["top1_agree"] >= 0.95 and r["rel_diff"] < 0.1 * r["adapter_effect_rel"]
    return r


# ---------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", choices=["smoke", "a", "b"], required=True)
    ap.add_argument("--gguf", default=os.path.join(WORK, "base.gguf"))
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--train-seconds", type=float, default=420)
    ap.add_argument("--total-seconds", type=float, default=780, help="LR schedule length (both chunks)")
    ap.add_argument("--eval-seqs", type=int, default=0, help="0: all held-out sequences")
    ap.add_argument("--distill-rounds", type=int, default=2)
    ap.add_argument("--compile", type=int, default=1)
    ap.add_argument("--resume-gguf", default="")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init-gguf", default="", help="phase a/smoke: continue the single LoRA from this file; TALoRA from its truncated SVD")
    ap.add_argument("--distill-temp", type=float, default=0.9)
    ap.add_argument("--distill-seed", type=int, default=100)
    ap.add_argument("--distill-batch", type=int, default=512)
    ap.add_argument("--extra-data", default="", help="comma-separated token files (uint32, 512 a row) in the data dir, added to train")
    ap.add_argument("--distill-temps", default="", help="comma-separated temperature per distillation round (overrides --distill-temp)")
    ap.add_argument("--talora", choices=["split", "residual"], default="split",
                    help="split: three rank-r sets; residual: a shared LoRA (--shared-rank) + three residuals, same parameters")
    ap.add_argument("--shared-rank", type=int, default=24)
    ap.add_argument("--objective", choices=["full", "block"], default="full",
                    help="full: masks anywhere, fully bidirectional; block: the block decoder's attention (block_layout)")
    ap.add_argument("--blocks", default="8,16,32", help="--objective block: block sizes, one per step in turn")
    ap.add_argument("--single-only", type=int, default=0, help="train the single LoRA alone (no TALoRA lockstep)")
    a = ap.parse_args()
    smoke = a.phase == "smoke"
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(WORK, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: only for a dry run of the code
    dname = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    log("phase", a.phase, dname, "torch", torch.__version__)

    cfg, w = load_base(a.gguf, dev, cache_path=os.path.join(WORK, "base_dequant.pt"))
    model = Gemma(cfg, w)
    log("base loaded", cfg.n_layer, "layers")
    data_dir = os.environ.get("DATA") or (os.path.join(WORK, "data") if os.path.exists(os.path.join(WORK, "data", "train.bin")) else os.path.join(HERE, "data"))
    L = 512
    train = torch.from_numpy(np.fromfile(os.path.join(data_dir, "train.bin"), dtype=np.uint32).astype(np.int64)).view(-1, L)
    held = torch.from_numpy(np.fromfile(os.path.join(data_dir, "heldout.bin"), dtype=np.uint32).astype(np.int64)).view(-1, L).to(dev)
    prompts = json.load(open(os.path.join(data_dir, "prompts.json")))
    results = {"phase": a.phase, "device": dname}

    # The AR model rebuilt here must match the runtime's greedy output (from `llm.generate`, temperature 0).
    ref = {"The capital of France is Paris. The capital of Germany is": [15687, 236761, 669, 5279, 529, 11702, 563, 13706],
           "Once upon a time, in a small village by the sea,": [993, 11742, 496, 2523, 529, 2390, 236761, 2195]}
    if a.phase != "b":
        match = []
        for p_text, p_ids in [(prompts[0], ref["The capital of France is Paris. The capital of Germany is"]),
                              (prompts[1], ref["Once upon a time, in a small village by the sea,"])]:
            got = ar_greedy(model, p_text, 8)
            match.append(sum(int(x == y) for x, y in zip(got, p_ids)))
            log("AR greedy", got, "runtime", p_ids)
        results["ar_greedy_match_of_8"] = match

    # self-distillation (phase a; the smoke test a little of it)
    dpath = os.path.join(WORK, "distill.bin")
    if a.phase in ("smoke", "a") and (smoke or a.distill_rounds > 0):
        t1 = time.time()
        ps = prompts[1:33] if smoke else prompts[1:]  # prompts[0] is the probe: never distilled
        rounds = 1 if smoke else a.distill_rounds
        seq = 64 if smoke else L
        temps = [float(x) for x in a.distill_temps.split(",")] if a.distill_temps else [a.distill_temp] * rounds
        if len(temps) != rounds:
            raise SystemExit(f"--distill-temps has {len(temps)} values for {rounds} rounds")
        d = torch.cat([sample_ar(model, ps, seq, temps[r], a.distill_seed + r, batch=a.distill_batch) for r in range(rounds)] or [torch.zeros(0, seq, dtype=torch.long)])
        sync()
        log(f"self-distillation: {d.shape[0]} sequences x {seq} tokens in {time.time() - t1:.1f}s")
        log("sample:", d[0, :48].tolist() if len(d) else [])
        results["distill"] = {"sequences": int(d.shape[0]), "tokens": int(d.numel()), "seconds": time.time() - t1,
                              "temperature": temps if len(set(temps)) > 1 else temps[0], "prompts": len(ps), "rounds": rounds,
                              "seeds": [a.distill_seed + r for r in range(rounds)]}
        if not smoke:
            d.numpy().astype(np.uint32).tofile(dpath)
            d.numpy().astype(np.uint32).tofile(os.path.join(OUT, "distill.bin"))
    n_extra = 0
    for x in filter(None, a.extra_data.split(",")):  # earlier runs' self-distilled sequences
        d = torch.from_numpy(np.fromfile(os.path.join(data_dir, x), dtype=np.uint32).astype(np.int64)).view(-1, L)
        train = torch.cat([train, d])
        n_extra += d.shape[0]
    if os.path.exists(dpath) and not smoke:
        d = torch.from_numpy(np.fromfile(dpath, dtype=np.uint32).astype(np.int64)).view(-1, L)
        train = torch.cat([train, d])
        log("train set", train.shape[0], "sequences incl.", d.shape[0], "self-distilled now and", n_extra, "earlier")
    train = train.to(dev)

    # adapters + optimizers
    r = a.rank
    mrow = w["mask_row_f32"]
    single = Adapter(cfg, 3 * r, 2.0 * 3 * r, mrow, seed=20).to(dev)
    mk = lambda ad: torch.optim.AdamW([p for p in ad.parameters() if p.requires_grad], lr=a.lr, betas=(0.9, 0.99),
                                      weight_decay=0.0, fused=dev.type == "cuda")
    if a.talora == "split":
        talora = [Adapter(cfg, r, 2.0 * r, mrow, seed=10 + k).to(dev) for k in range(3)]
        parts = None
        opt_t = [mk(ad) for ad in talora]
        desc = f"3 x rank {r}"
    else:
        rs = a.shared_rank
        rb = (3 * r - rs) // 3
        if rs <= 0 or rb <= 0 or rs + 3 * rb != 3 * r:
            raise SystemExit(f"--shared-rank {rs}: the shared rank plus three equal residual ranks must be {3 * r}")
        shared = Adapter(cfg, rs, 2.0 * rs, mrow, seed=10).to(dev)
        res = [Adapter(cfg, rb, 2.0 * rb, mrow, seed=11 + k).to(dev) for k in range(3)]
        for x in res:
            x.mask_row.requires_grad_(False)  # a bucket uses the shared mask row
        talora = [Composite(shared, x) for x in res]
        parts = [shared] + res
        o_sh = mk(shared)
        opt_t = [MultiOpt([o_sh, mk(x)]) for x in res]
        desc = f"shared rank {rs} + 3 x residual rank {rb}"
    n_t = unique_params(talora)
    n_s = unique_params([single])
    log(f"params: TALoRA {desc} = {n_t:,}; single rank {3 * r} = {n_s:,}")
    opt_s = mk(single)
    st = {"step": 0, "train_seconds": 0.0, "tokens": 0, "masked_tokens": 0, "history": []}
    ck = os.path.join(WORK, "ckpt.pt")
    if a.init_gguf and a.phase != "b":
        load_gguf_into(single, a.init_gguf)
        kept = svd_init(talora if parts is None else parts[:1], single)
        st["init_from"] = os.path.basename(a.init_gguf)
        st["svd_energy_kept"] = kept
        log(f"single LoRA from {a.init_gguf}; TALoRA ({a.talora}) from its rank-{talora[0].rank if parts is None else parts[0].rank} SVD (mean energy kept {kept:.4f})")
        ev0 = held[:4 if smoke else (a.eval_seqs or 64)]
        e0_s, _ = elbo(model, single, ev0, K=2 if smoke else 8)
        e0_t, _ = (e0_s, None) if a.single_only else elbo(model, talora, ev0, K=2 if smoke else 8)
        results["eval_at_init"] = {"heldout_sequences": len(ev0), "elbo_ppl_single": math.exp(e0_s), "elbo_ppl_talora": math.exp(e0_t),
                                   "svd_energy_kept": kept}
        log(f"at init on {len(ev0)} held-out: ELBO ppl single {math.exp(e0_s):.2f}, TALoRA (truncated) {math.exp(e0_t):.2f}")
    if a.phase == "b":
        if os.path.exists(ck):
            c = torch.load(ck, map_location=dev)
            for k in range(3):
                talora[k].load_state_dict(c["talora"][k])
                opt_t[k].load_state_dict(c["opt_t"][k])
            single.load_state_dict(c["single"])
            opt_s.load_state_dict(c["opt_s"])
            st = c["state"]
            log("resumed from", ck, "step", st["step"])
        elif a.resume_gguf:
            if parts is None:
                for k in range(3):
                    load_gguf_into(talora[k], os.path.join(a.resume_gguf, f"talora-t{k}.gguf"))
            else:
                for ad, nm in zip(parts, ["talora-shared.gguf"] + [f"talora-res{k}.gguf" for k in range(3)]):
                    load_gguf_into(ad, os.path.join(a.resume_gguf, nm))
            lp = os.path.join(a.resume_gguf, "lora.gguf")
            if not os.path.exists(lp):
                lp = os.path.join(WORK, "lora-resume.gguf")
                with open(lp, "wb") as f:
                    for k in range(2):
                        f.write(open(os.path.join(a.resume_gguf, f"lora.gguf.part{k}"), "rb").read())
            load_gguf_into(single, lp)
            st = json.load(open(os.path.join(a.resume_gguf, "results.json")))["state"]
            log("resumed from GGUFs in", a.resume_gguf, "(fresh Adam moments) step", st["step"])
        else:
            raise SystemExit("phase b needs a checkpoint")
    if a.compile:
        model.compile()

    # ------------------------------------------------------------ training (lockstep)
    budget = 25.0 if smoke else a.train_seconds
    max_steps = 6 if smoke else 10 ** 9
    B = a.batch
    block_sizes = [int(x) for x in a.blocks.split(",")]
    t_start = time.time()
    steps0 = st["step"]
    sync()
    acc = {"t": [], "s": []}
    while True:
        el = time.time() - t_start
        if el >= budget or st["step"] - steps0 >= max_steps:
            break
        step = st["step"]
        prog = min(1.0, (st["train_seconds"] + el) / a.total_seconds)
        warm = min(1.0, (step + 1) / 30)
        lr = a.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog)))
        g = torch.Generator(device=dev).manual_seed(a.seed * 1_000_003 + step)
        idx = torch.randint(0, train.shape[0], (B,), generator=g, device=dev)
        ids = train[idx]
        bk = step % 3
        if a.objective == "block":
            bsz = block_sizes[step % len(block_sizes)]
            gstate = g.get_state()
            lossf = lambda ad: block_loss(model, ad, ids, g, bsz)
        else:
            t, mask, maskable = make_noise(ids, bk, g)
            lossf = lambda ad: diffusion_loss(model, ad, ids, t, mask, maskable)
        pairs = ((single, opt_s, "s"),) if a.single_only else ((talora[bk], opt_t[bk], "t"), (single, opt_s, "s"))
        for ad, opt, key in pairs:
            for pg in opt.param_groups:
                pg["lr"] = lr
            if a.objective == "block":
                g.set_state(gstate)  # the same prompt length and masks for both adapters
            try:
                loss, mask = lossf(ad)
                loss.backward()
            except Exception as e:  # torch.compile trouble: fall back to eager
                if model.layer_train is model.layer:
                    raise
                log("compiled step failed, eager from now on:", repr(e)[:300])
                model.layer_train = model.layer
                opt.zero_grad(set_to_none=True)
                if a.objective == "block":
                    g.set_state(gstate)
                loss, mask = lossf(ad)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(ad.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            acc[key].append(loss.detach())
        st["step"] += 1
        st["tokens"] += ids.numel()
        st["masked_tokens"] += int(mask.sum()) if mask.dtype == torch.bool else int(mask.numel())
        if st["step"] % 30 == 0 or st["step"] - steps0 <= 3:
            lt = float(torch.stack(acc["t"]).mean()) if acc["t"] else float("nan")
            ls = float(torch.stack(acc["s"]).mean())
            acc = {"t": [], "s": []}
            el = time.time() - t_start
            tps = (st["step"] - steps0) * ids.numel() / el
            st["history"].append([st["step"], round(lt, 4), round(ls, 4)])
            log(f"step {st['step']:5d} lr {lr:.2e} loss TALoRA {lt:.3f} single {ls:.3f} | {tps:,.0f} tok/s per model, {el:.0f}s")
    sync()
    st["train_seconds"] += time.time() - t_start
    log(f"trained {st['step'] - steps0} steps this chunk, {st['step']} in all, {st['tokens']:,} tokens per model")
    if not smoke:
        save_ckpt(ck, {"talora": [ad.state_dict() for ad in talora], "single": single.state_dict(),
                       "opt_t": [o.state_dict() for o in opt_t], "opt_s": opt_s.state_dict(), "state": st})
        log("checkpoint", ck)
    results["training"] = {k: st[k] for k in ("step", "train_seconds", "tokens", "masked_tokens")}
    results["training"].update({"rank_talora": r, "talora_mode": a.talora, "shared_rank": a.shared_rank if a.talora == "residual" else None, "rank_single": 3 * r, "alpha_over_rank": 2.0, "lr": a.lr,
                                "batch": B, "seq": L, "params_talora": n_t, "params_single": n_s,
                                "train_sequences": int(train.shape[0]), "history": st["history"],
                                "init_from": st.get("init_from"), "svd_energy_kept": st.get("svd_energy_kept")})
    results["tokens_trained_per_model"] = st["tokens"]

    # ------------------------------------------------------------ export (before eval: a crash there loses nothing)
    files = export_all(talora, single, OUT, parts)
    results["state"] = st

    # ------------------------------------------------------------ evaluation
    n_eval = 4 if smoke else (a.eval_seqs or held.shape[0])
    K = 2 if smoke else 8
    ev = held[:n_eval]
    t1 = time.time()
    nll_ar = ar_nll(model, ev)
    e_s, pk_s = elbo(model, single, ev, K=K)
    e_t, pk_t = (e_s, pk_s) if a.single_only else elbo(model, talora, ev, K=K)
    res_eval = {"heldout_sequences": n_eval, "tokens": n_eval * (L - 1), "K": K,
                "ar_ppl": math.exp(nll_ar), "elbo_ppl_talora": math.exp(e_t), "elbo_ppl_single": math.exp(e_s),
                "ar_nll": nll_ar, "elbo_nll_talora": e_t, "elbo_nll_single": e_s,
                "per_stratum_nll_talora": pk_t, "per_stratum_nll_single": pk_s}
    if a.phase == "b" and "init_from" not in st:  # (the continued run skips it: known from the first)
        e_0, _ = elbo(model, None, ev, K=K)
        res_eval["elbo_ppl_base_untrained"] = math.exp(e_0)
    res_eval["seconds"] = time.time() - t1
    results["eval"] = res_eval
    log(f"eval on {n_eval} held-out x {L - 1} tokens: AR ppl {math.exp(nll_ar):.2f} | ELBO ppl TALoRA {math.exp(e_t):.2f} single {math.exp(e_s):.2f} ({time.time() - t1:.0f}s)")

    # probe + samples (token ids; detokenized here afterwards)
    probe = prompts[0]
    results["probe"] = {"prompt_ids": probe}
    for name, ads in (("talora", talora), ("single", single)):
        if a.single_only and name == "talora":
            results["probe"][name] = {"ids": [], "order": [], "berlin_first": None}
            continue
        toks, order = diffuse(model, ads, probe, 4)
        results["probe"][name] = {"ids": toks, "order": order, "berlin_first": toks[0] == 15687}
        log(f"probe {name}: {toks} commit order {order} -> {'Berlin' if toks[0] == 15687 else 'NOT Berlin'}")
    if not smoke:
        results["samples"] = {}
        for pi in (1, 4, 16):
            for name, ads in (("talora", talora), ("single", single))[1 if a.single_only else 0:]:
                toks, order = diffuse(model, ads, prompts[pi], 32)
                results["samples"][f"{pi}-{name}"] = {"prompt_ids": prompts[pi], "ids": toks, "order": order}

    # sanity: the exported f16 factors reproduce the trained adapter's logits
    chk = {}
    for k in [] if a.single_only else range(3) if a.phase != "a" else [1]:
        chk[f"talora-t{k}"] = check_export(model, talora[k], files[k], held)
    chk["lora"] = check_export(model, single, files[3], held)
    results["export_check"] = chk
    log("export check", json.dumps(chk))
    results["wall_seconds"] = time.time() - T0
    results["log"] = LOG
    json.dump(results, open(os.path.join(OUT, "results.json"), "w"), indent=1)
    # summary table last
    print("\n| phase | steps | tokens/model | AR ppl | ELBO TALoRA | ELBO single | probe T/S | export ok | wall s |")
    print(f"| {a.phase} | {st['step']} | {st['tokens']:,} | {math.exp(nll_ar):.2f} | {math.exp(e_t):.2f} | {math.exp(e_s):.2f} | "
          f"{results['probe']['talora']['berlin_first']}/{results['probe']['single']['berlin_first']} | "
          f"{all(v['ok'] for v in chk.values())} | {time.time() - T0:.0f} |")


if __name__ == "__main__":
    main()
