#!/usr/bin/env python3
"""Diagnostic for the router's learning target: would another kind of classifier over the same
MiniLM embeddings learn more from the fed half than the router does? Chooses nothing; it reads
the held-out split, so nothing it prints may be used to pick a router parameter.

For each model class, trained on embeddings only (no word features, no outcome memory):
  - catalogue: 5-fold CV over the catalogue examples (descriptions always in training); each
    held-out fold split into two halves (alternating after a seeded shuffle); the "reference"
    adds one half with its true agents to the training set and measures the other half, both ways.
  - held-out: trained on the whole catalogue, measured on one half of the test split, before and
    after adding the other half with its true agents (the benchmark's `labelled examples` row),
    with the benchmark's halves.
A class that makes more of an example than the router would gain here where the router does not.

    cargo build --release -p ruvllm-eval --example dump_catalogue
    ./target/release/examples/dump_catalogue > /tmp/cat.jsonl
    ./target/release/examples/dump_catalogue --test > /tmp/test.jsonl
    /tmp/tvenv/bin/python tools/routing/model_classes.py /tmp/cat.jsonl /tmp/test.jsonl

Needs numpy and torch (CPU); about a minute on 2 cores.
"""
import json
import sys

import numpy as np
import torch

K = 13


def load(path):
    rows = [json.loads(line) for line in open(path)]
    return rows, np.array([r["v"] for r in rows], dtype=np.float32), np.array([r["agent"] for r in rows])


def softmax_head(X, y, Xt, hidden=0):
    """Class-balanced softmax regression (hidden=0) or a one-hidden-layer GELU MLP, full batch Adam."""
    torch.manual_seed(0)
    X, y, Xt = torch.tensor(X), torch.tensor(y), torch.tensor(Xt)
    counts = torch.bincount(y, minlength=K).float().clamp(min=1)
    cw = len(y) / (K * counts)
    if hidden:
        m = torch.nn.Sequential(torch.nn.Linear(X.shape[1], hidden), torch.nn.GELU(), torch.nn.Linear(hidden, K))
        lr, l2, steps, scale = 0.01, 1e-4, 400, 1.0
    else:
        m = torch.nn.Linear(X.shape[1], K)
        lr, l2, steps, scale = 0.05, 1e-3, 300, 10.0
    opt = torch.optim.Adam(m.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(X) * scale, y, weight=cw) + l2 * sum((p ** 2).sum() for p in m.parameters())
        loss.backward()
        opt.step()
    with torch.no_grad():
        return m(Xt).argmax(1).numpy()


def knn(X, y, Xt, k=10, tau=0.05):
    """Similarity-weighted vote of the k nearest (the router's k-NN feature)."""
    out = []
    for s in Xt @ X.T:
        o = np.argsort(-s)[:k]
        score = np.zeros(K)
        for j in o:
            score[y[j]] += np.exp((s[j] - s[o[0]]) / tau)
        out.append(score.argmax())
    return np.array(out)


def centroid(X, y, Xt):
    c = np.stack([X[y == a].mean(0) for a in range(K)])
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    return (Xt @ c.T).argmax(1)


MODELS = {
    "softmax regression": softmax_head,
    "MLP, 256 hidden": lambda X, y, Xt: softmax_head(X, y, Xt, hidden=256),
    "k-NN, k=10": knn,
    "k-NN, k=3": lambda X, y, Xt: knn(X, y, Xt, k=3),
    "nearest centroid": centroid,
}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    cat, CV, CY = load(sys.argv[1])
    tests, V, Y = load(sys.argv[2])
    H = np.array([t["half"] for t in tests])
    desc = np.array([r["source"] == "description" for r in cat])
    ex = np.where(~desc)[0]
    rng = np.random.default_rng(0)
    folds = np.array_split(rng.permutation(ex), 5)
    print("| model class (MiniLM embeddings only) | catalogue CV: before -> with the other half as examples | held-out A->B | held-out B->A |")
    print("|---|---|---|---|")
    for name, f in MODELS.items():
        before = after = n = 0
        for k in range(5):
            train = np.concatenate([np.where(desc)[0]] + [folds[j] for j in range(5) if j != k])
            halves = (folds[k][::2], folds[k][1::2])
            for fed, measured in (halves, halves[::-1]):
                before += (f(CV[train], CY[train], CV[measured]) == CY[measured]).sum()
                both = np.concatenate([train, fed])
                after += (f(CV[both], CY[both], CV[measured]) == CY[measured]).sum()
                n += len(measured)
        cells = []
        for fed in (0, 1):
            m, fd = H != fed, H == fed
            b = (f(CV, CY, V[m]) == Y[m]).sum()
            a = (f(np.vstack([CV, V[fd]]), np.concatenate([CY, Y[fd]]), V[m]) == Y[m]).sum()
            cells.append(f"{b} -> {a} of {m.sum()}")
        print(f"| {name} | {before} -> {after} of {n} | {cells[0]} | {cells[1]} |", flush=True)


if __name__ == "__main__":
    main()
