#!/usr/bin/env python3
"""Trains the routing adapter of the MiniLM embedder: a low-rank (LoRA) delta on the BERT
weights of all-MiniLM-L6-v2, fitted on the agent catalogue only (crates/ruvllm-router/data/
agents.json). The held-out test split (test.json) and the paraphrase pairs (pairs.json) are never
read here.

Objective: supervised contrastive loss (Khosla et al. 2020) over catalogue examples, agents as
classes, so that tasks for the same agent type embed close together; plus two terms on general
sentences that are not catalogue tasks (everyday English from the Debian `fortunes` package and
first docstring lines of the Python standard library): one keeps their embeddings where the
original model puts them (`--keep`), the other keeps them from moving closer to catalogue tasks
than they were (`--apart`). Without these, the first adapter tried pulled everyday sentences into
the task clusters ("add a page to the photo album" came to 0.68 from "add pagination to the list
endpoint", from 0.31).

Output: a safetensors file with, per adapted weight W (shape out x in), `<name>.lora_a` (r x in)
and `<name>.lora_b` (out x r), already multiplied by the LoRA scale: W' = W + B @ A. The Rust
embedder adds B @ A to W at load time (`bert.rs`).

Not needed to run ruvllm or its CI; only to re-make the shipped adapter (about 7 minutes on
2 cores):
    apt-get install fortunes fortunes-min
    python3 -m venv /tmp/tvenv && /tmp/tvenv/bin/pip install torch safetensors tokenizers numpy
    /tmp/tvenv/bin/python tools/routing/train_adapter.py --out crates/ruvllm-embed/data/minilm-routing-adapter.safetensors
    /tmp/tvenv/bin/python tools/routing/train_adapter.py --cv 5 --folds 2   # model selection on the catalogue

How the defaults were chosen (--cv 5 --folds 2: adapter trained on 4/5 of the catalogue; k-NN
(k=10) and nearest-centroid accuracy on the other 1/5, two folds, 350 held-out examples; `leak`:
mean cosine of 500 held-out general sentences to their nearest held-out task, lower = general
text looks less like a task). Plain MiniLM: k-NN 0.689, centroid 0.791, leak 0.263.
    general = docstrings only, --keep 1, no --apart:
      query+value, 100 steps                   0.863 / 0.840
      query+value, 300 steps                   0.886 / 0.880
      query+value, 300 steps, --keep 0         0.871 / 0.874
      all six linear layers, 100 steps         0.894 / 0.891
      all six linear layers, 300 steps         0.891 / 0.900
    general = fortunes + docstrings, --keep 1 --apart 1:
      all six linear layers, 300 steps         0.903 / 0.909, leak 0.160   <- default
"""
import argparse
import inspect
import json
import os
import random
import subprocess
import sys
import time
import warnings

warnings.filterwarnings("ignore")

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AGENTS = os.path.join(ROOT, "crates/ruvllm-router/data/agents.json")
ALL_TARGETS = "attention.self.query,attention.self.key,attention.self.value,attention.output.dense,intermediate.dense,output.dense"


def model_dir():
    d = os.environ.get("RUVLLM_EMBEDDER")
    if d:
        return d
    # The model manager's copy (`npx ruvllm models download all-minilm-l6-v2` puts it there).
    out = subprocess.check_output(["node", os.path.join(ROOT, "bin/ruvllm.js"), "models", "path", "all-minilm-l6-v2"])
    return out.decode().strip()


class Bert(torch.nn.Module):
    """BertModel forward of sentence-transformers' MiniLM (eval mode, no dropout) with LoRA."""

    def __init__(self, d, rank, alpha, targets):
        super().__init__()
        cfg = json.load(open(os.path.join(d, "config.json")))
        self.h, self.heads, self.nl = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
        self.eps = cfg["layer_norm_eps"]
        w = {k.removeprefix("bert."): v.float() for k, v in load_file(os.path.join(d, "model.safetensors")).items()}
        self.w = w
        for v in w.values():
            v.requires_grad_(False)
        self.scale = alpha / rank
        self.lora = torch.nn.ParameterDict()
        self.targets = targets
        g = torch.Generator().manual_seed(0)
        for l in range(self.nl):
            for t in targets:
                name = f"encoder.layer.{l}.{t}.weight"
                out, inp = w[name].shape
                a = torch.randn(rank, inp, generator=g) / np.sqrt(inp)
                self.lora[self.key(name) + "__a"] = torch.nn.Parameter(a)
                self.lora[self.key(name) + "__b"] = torch.nn.Parameter(torch.zeros(out, rank))

    @staticmethod
    def key(name):
        return name.replace(".", "_")

    def lin(self, x, name, use_lora):
        W, b = self.w[name + ".weight"], self.w[name + ".bias"]
        y = x @ W.T + b
        k = self.key(name + ".weight")
        if use_lora and k + "__a" in self.lora:
            y = y + (x @ self.lora[k + "__a"].T) @ self.lora[k + "__b"].T * self.scale
        return y

    def forward(self, ids, mask, use_lora=True):
        w, h = self.w, self.h
        n = ids.shape[1]
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n] + \
            w["embeddings.token_type_embeddings.weight"][0]
        x = F.layer_norm(x, (h,), w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self.eps)
        B, hd = ids.shape[0], h // self.heads
        bias = (1.0 - mask[:, None, None, :].float()) * -1e9
        for l in range(self.nl):
            p = f"encoder.layer.{l}."
            q = self.lin(x, p + "attention.self.query", use_lora).view(B, n, self.heads, hd).transpose(1, 2)
            k = self.lin(x, p + "attention.self.key", use_lora).view(B, n, self.heads, hd).transpose(1, 2)
            v = self.lin(x, p + "attention.self.value", use_lora).view(B, n, self.heads, hd).transpose(1, 2)
            att = torch.softmax(q @ k.transpose(-1, -2) / np.sqrt(hd) + bias, dim=-1)
            c = (att @ v).transpose(1, 2).reshape(B, n, h)
            x = F.layer_norm(x + self.lin(c, p + "attention.output.dense", use_lora), (h,),
                             w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"], self.eps)
            f = F.gelu(self.lin(x, p + "intermediate.dense", use_lora))
            x = F.layer_norm(x + self.lin(f, p + "output.dense", use_lora), (h,),
                             w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], self.eps)
        m = mask.unsqueeze(-1).float()
        pooled = (x * m).sum(1) / m.sum(1)
        return F.normalize(pooled, dim=-1)

    def export(self):
        out = {}
        for l in range(self.nl):
            for t in self.targets:
                name = f"encoder.layer.{l}.{t}.weight"
                k = self.key(name)
                out[name + ".lora_a"] = self.lora[k + "__a"].detach().contiguous()
                out[name + ".lora_b"] = (self.lora[k + "__b"].detach() * self.scale).contiguous()
        return out


class Tok:
    def __init__(self, d):
        self.t = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        self.t.no_padding()
        self.t.enable_truncation(128)

    def __call__(self, texts):
        enc = [self.t.encode(s).ids for s in texts]
        n = max(len(e) for e in enc)
        ids = torch.zeros(len(enc), n, dtype=torch.long)
        mask = torch.zeros(len(enc), n, dtype=torch.long)
        for i, e in enumerate(enc):
            ids[i, :len(e)] = torch.tensor(e)
            mask[i, :len(e)] = 1
        return ids, mask


FORTUNES = "/usr/share/games/fortunes"


def fortunes():
    """Everyday English (quotes, jokes, proverbs) from the Debian `fortunes` package, when it is
    installed (`apt-get install fortunes fortunes-min`): one-line fortunes of 20-120 characters."""
    out = []
    if not os.path.isdir(FORTUNES):
        return out
    for name in sorted(os.listdir(FORTUNES)):
        f = os.path.join(FORTUNES, name)
        if "." in name or not os.path.isfile(f):
            continue
        for chunk in open(f, encoding="utf-8", errors="ignore").read().split("\n%\n"):
            t = " ".join(chunk.split())
            if 20 <= len(t) <= 120 and "--" not in t:
                out.append(t)
    return out


def general_sentences(limit, seed, everyday=True):
    """General sentences that are not catalogue tasks: half everyday English (fortunes, when
    installed and `everyday`), the rest first docstring lines of standard-library functions and
    classes."""
    every = fortunes() if everyday else []
    random.Random(seed).shuffle(every)
    every = every[: limit // 2]
    out = every + docstring_sentences(limit - len(every), seed)
    random.Random(seed + 1).shuffle(out)
    return out


def docstring_sentences(limit, seed):
    """First docstring lines of standard-library functions and classes."""
    seen, out = set(), []
    names = sorted(n for n in sys.stdlib_module_names if not n.startswith("_"))
    skip = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "test", "lib2to3", "ensurepip", "venv"}
    for name in names:
        if name in skip:
            continue
        try:
            mod = __import__(name)
        except BaseException:
            continue
        for _, obj in inspect.getmembers(mod):
            doc = getattr(obj, "__doc__", None)
            if not isinstance(doc, str):
                continue
            line = doc.strip().split("\n")[0].strip()
            if 25 <= len(line) <= 120 and " " in line and "(" not in line and line not in seen:
                seen.add(line)
                out.append(line)
    random.Random(seed).shuffle(out)
    return out[:limit]


def embed_all(model, tok, texts, use_lora, bs=128):
    outs = []
    with torch.no_grad():
        for i in range(0, len(texts), bs):
            outs.append(model(*tok(texts[i:i + bs]), use_lora=use_lora))
    return torch.cat(outs)


def train(model, tok, texts, labels, general, args, log=print):
    opt = torch.optim.AdamW(model.lora.parameters(), lr=args.lr, weight_decay=0.0)
    by = {}
    for i, y in enumerate(labels):
        by.setdefault(y, []).append(i)
    classes = sorted(by)
    rng = random.Random(args.seed)
    gen_ref = embed_all(model, tok, general, use_lora=False) if general else None
    cat_ref = embed_all(model, tok, texts, use_lora=False) if general and args.apart > 0 else None
    t0 = time.time()
    for step in range(args.steps):
        idx = []
        for c in classes:
            idx += rng.sample(by[c], min(args.per_class, len(by[c])))
        z = model(*tok([texts[i] for i in idx]))
        y = torch.tensor([labels[i] for i in idx])
        sim = z @ z.T / args.tau
        eye = torch.eye(len(idx), dtype=torch.bool)
        sim = sim.masked_fill(eye, -1e9)
        logp = sim - torch.logsumexp(sim, dim=1, keepdim=True)
        pos = (y[:, None] == y[None, :]) & ~eye
        loss = -(logp * pos).sum(1).div(pos.sum(1)).mean()
        if general:
            gi = rng.sample(range(len(general)), min(args.gen_batch, len(general)))
            zg = model(*tok([general[i] for i in gi]))
            loss = loss + args.keep * (1 - (zg * gen_ref[gi]).sum(-1)).mean() * 100
            if args.apart > 0:
                # General sentences must not come closer to catalogue tasks than they were.
                grow = z @ zg.T - cat_ref[idx] @ gen_ref[gi].T
                loss = loss + args.apart * F.relu(grow).mean() * 100
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0 or step == args.steps - 1:
            log(f"  step {step:4d} loss {loss.item():.4f}  {time.time() - t0:.0f}s")


def softmax_regression_acc(tr, ytr, te, yte, l2=1e-3, iters=300):
    """Held-out accuracy of a class-balanced softmax regression on the embeddings (what the
    router's head does, without its word features)."""
    ncls = max(ytr + yte) + 1
    y = torch.tensor(ytr)
    counts = torch.bincount(y, minlength=ncls).float()
    wrow = (counts.mean() / counts)[y]
    W = torch.zeros(tr.shape[1], ncls, requires_grad=True)
    b = torch.zeros(ncls, requires_grad=True)
    opt = torch.optim.LBFGS([W, b], max_iter=iters, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = (F.cross_entropy(tr @ W * 10 + b, y, reduction="none") * wrow).mean() + l2 * (W * W).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return ((te @ W * 10 + b).argmax(1) == torch.tensor(yte)).float().mean().item()


def fold_scores(tr, ytr, te, yte, k=10):
    """Held-out k-NN, nearest-centroid and softmax-regression accuracy."""
    sims = te @ tr.T
    ncls = max(ytr + yte) + 1
    knn_ok = cen_ok = 0
    cents = torch.stack([F.normalize(tr[torch.tensor([y == c for y in ytr])].mean(0), dim=0) for c in range(ncls)])
    for i in range(len(yte)):
        v, j = sims[i].topk(k)
        votes = torch.zeros(ncls)
        for s, jj in zip(v, j):
            votes[ytr[jj]] += s
        knn_ok += int(votes.argmax().item() == yte[i])
        cen_ok += int((te[i] @ cents.T).argmax().item() == yte[i])
    return knn_ok / len(yte), cen_ok / len(yte), softmax_regression_acc(tr, ytr, te, yte)


def leak(model, tok, tasks, general_eval, use_lora):
    """How task-like general text looks: mean over held-out general sentences (never trained on)
    of the cosine to their nearest held-out catalogue task."""
    a, g = embed_all(model, tok, tasks, use_lora), embed_all(model, tok, general_eval, use_lora)
    return (g @ a.T).max(1).values.mean().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16)
    ap.add_argument("--targets", default=ALL_TARGETS)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--tau", type=float, default=0.1)
    ap.add_argument("--per-class", type=int, default=4)
    ap.add_argument("--keep", type=float, default=1.0, help="weight of the preservation term (0 = off)")
    ap.add_argument("--gen-batch", type=int, default=32)
    ap.add_argument("--general", type=int, default=4000)
    ap.add_argument("--apart", type=float, default=1.0, help="weight of the term that keeps general sentences from moving closer to catalogue tasks (0 = off)")
    ap.add_argument("--no-fortunes", action="store_true", help="general sentences from docstrings only")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cv", type=int, default=0, help="k-fold CV on the catalogue instead of writing an adapter")
    ap.add_argument("--folds", type=int, default=0, help="run only the first N folds of --cv")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    d = model_dir()
    tok = Tok(d)
    cat = json.load(open(AGENTS))["agents"]
    texts, labels = [], []
    for ai, a in enumerate(cat):
        for e in a["examples"]:
            texts.append(e)
            labels.append(ai)
    general = general_sentences(args.general + 500, args.seed, everyday=not args.no_fortunes)
    general, general_eval = general[500:], general[:500]
    if args.keep <= 0:
        general = []
    targets = args.targets.split(",")
    print(f"catalogue {len(texts)} examples, {len(cat)} agents; general sentences {len(general)}; {vars(args)}", flush=True)
    if args.cv:
        order = list(range(len(texts)))
        random.Random(1).shuffle(order)
        folds = [order[i::args.cv] for i in range(args.cv)]
        base, tuned = [], []
        for fi, te in enumerate(folds[: args.folds or args.cv]):
            tes = set(te)
            tr = [i for i in range(len(texts)) if i not in tes]
            model = Bert(d, args.rank, args.alpha, targets)
            trt, try_ = [texts[i] for i in tr], [labels[i] for i in tr]
            tet, tey = [texts[i] for i in te], [labels[i] for i in te]
            b = fold_scores(embed_all(model, tok, trt, False), try_, embed_all(model, tok, tet, False), tey)
            b += (leak(model, tok, tet, general_eval, False),)
            train(model, tok, trt, try_, general, args)
            t = fold_scores(embed_all(model, tok, trt, True), try_, embed_all(model, tok, tet, True), tey)
            t += (leak(model, tok, tet, general_eval, True),)
            base.append(b)
            tuned.append(t)
            print(f"fold {fi}: knn {b[0]:.3f} -> {t[0]:.3f}, centroid {b[1]:.3f} -> {t[1]:.3f}, softmax {b[2]:.3f} -> {t[2]:.3f}, leak {b[3]:.3f} -> {t[3]:.3f}", flush=True)
        mb, mt = np.mean(base, 0), np.mean(tuned, 0)
        print(f"CV mean: knn {mb[0]:.4f} -> {mt[0]:.4f}, centroid {mb[1]:.4f} -> {mt[1]:.4f}, softmax {mb[2]:.4f} -> {mt[2]:.4f}, leak {mb[3]:.4f} -> {mt[3]:.4f}")
        return
    model = Bert(d, args.rank, args.alpha, targets)
    train(model, tok, texts, labels, general, args)
    if general_eval:
        with torch.no_grad():
            g0 = embed_all(model, tok, general_eval, False)
            g1 = embed_all(model, tok, general_eval, True)
        print(f"held-out general sentences: mean cosine to the original embedding {(g0 * g1).sum(-1).mean():.4f}; "
              f"leak {leak(model, tok, texts, general_eval, False):.4f} -> {leak(model, tok, texts, general_eval, True):.4f}")
    if args.out:
        tensors = model.export()
        meta = {k: str(v) for k, v in vars(args).items() if k != "out"}
        tmp = args.out + ".tmp"
        save_file(tensors, tmp, metadata=meta)
        os.replace(tmp, args.out)
        print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes, {len(tensors)} tensors)")


if __name__ == "__main__":
    main()
