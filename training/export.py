"""Writes ruvllm diffusion adapters as llama.cpp LoRA GGUF files (the layout of
tools/lora-files.mjs's writeLoraGguf, F16 factors) plus the diffusion metadata, and the
manifest the model registry reads.

Library use (train.py, on the GPU machine):  write_adapter(path, factors, rank, alpha, mask_row, t_min, t_max)
CLI (here, after a run):
  python training/export.py manifest --dir crates/ruvllm-models/data/diffusion/gemma-3-270m-diffusion \
      --base <gemma-3-270m-q4_k_m.gguf> --results training/results.json
  python training/export.py check <adapter.gguf>      # prints the metadata and tensor shapes
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

import numpy as np

PROJS = ("q", "k", "v", "o", "gate", "up", "down")
GGUF_PROJ = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output",
             "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}
MASK_ID = 4


def write_adapter(path, factors, rank, alpha, mask_row, t_min, t_max, n_layer=18):
    """factors: {(layer, proj): (A (rank, in), B (out, rank))} f32 numpy; mask_row (d,) f32 as
    token_embd stores it (before the sqrt(d) input scale)."""
    import gguf
    w = gguf.GGUFWriter(path, arch="gemma3")
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(alpha))
    w.add_uint32("ruvllm.diffusion.mask_token_id", MASK_ID)
    w.add_float32("ruvllm.diffusion.t_min", float(t_min))
    w.add_float32("ruvllm.diffusion.t_max", float(t_max))
    w.add_bool("ruvllm.diffusion.shift", True)
    for layer in range(n_layer):
        for p in PROJS:
            A, B = factors[(layer, p)]
            assert A.shape[0] == rank and B.shape[1] == rank
            base = f"blk.{layer}.{GGUF_PROJ[p]}.weight"
            # numpy (rank, in) -> GGUF dims [in, rank]; numpy (out, rank) -> GGUF dims [rank, out]
            w.add_tensor(f"{base}.lora_a", np.ascontiguousarray(A, dtype=np.float16))
            w.add_tensor(f"{base}.lora_b", np.ascontiguousarray(B, dtype=np.float16))
    w.add_tensor("ruvllm.diffusion.mask_embd", np.ascontiguousarray(mask_row, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def read_adapter(path):
    """(meta dict, {(layer, proj): (A f32 (rank, in), B f32 (out, rank))}, mask_row f32)."""
    from gguf import GGUFReader
    r = GGUFReader(path)
    meta = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        v = f.parts[f.data[0]]
        meta[k] = bytes(v).decode() if v.dtype == np.uint8 else v[0].item()
    inv = {v: k for k, v in GGUF_PROJ.items()}
    factors, mask_row = {}, None
    parts = {}
    for t in r.tensors:
        a = np.array(t.data)
        if t.name == "ruvllm.diffusion.mask_embd":
            mask_row = a.astype(np.float32).reshape(-1)
            continue
        _, layer, proj, _, ab = t.name.split(".")
        parts[(int(layer), inv[proj], ab)] = a.astype(np.float32)
    for (layer, p, ab) in list(parts):
        if ab == "lora_a":
            factors[(layer, p)] = (parts[(layer, p, "lora_a")], parts[(layer, p, "lora_b")])
    return meta, factors, mask_row


def stack_factors(fs, fr):
    """Two LoRAs at the same alpha/r as one: A = [A_s; A_r], B = [B_s, B_r] per (layer, proj)."""
    return {k: (np.concatenate([fs[k][0], fr[k][0]], 0), np.concatenate([fs[k][1], fr[k][1]], 1)) for k in fs}


def compose(d):
    """Residual TALoRA (train.py --talora residual) comes back as a shared LoRA and three per-bucket
    residuals, all at alpha/r = 2: bucket k's adapter is their sum, one LoRA of the stacked factors
    (A = [A_s; A_r], B = [B_s, B_r]) with the shared mask row and the residual's [t_min, t_max)."""
    ms, fs, mask_row = read_adapter(os.path.join(d, "talora-shared.gguf"))
    rs = int(fs[(0, "q")][0].shape[0])
    assert abs(ms["adapter.lora.alpha"] / rs - 2.0) < 1e-6
    for b in range(3):
        mr, fr, _ = read_adapter(os.path.join(d, f"talora-res{b}.gguf"))
        rb = int(fr[(0, "q")][0].shape[0])
        assert abs(mr["adapter.lora.alpha"] / rb - 2.0) < 1e-6
        f = stack_factors(fs, fr)
        out = os.path.join(d, f"talora-t{b}.gguf")
        tmp = out + ".tmp"
        write_adapter(tmp, f, rs + rb, 2.0 * (rs + rb), mask_row, mr["ruvllm.diffusion.t_min"], mr["ruvllm.diffusion.t_max"])
        os.replace(tmp, out)
        print(out, "rank", rs + rb)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("manifest")
    m.add_argument("--dir", required=True)
    m.add_argument("--base", required=True)
    m.add_argument("--results", required=True)
    m.add_argument("--files", nargs="+", default=["talora-t0.gguf", "talora-t1.gguf", "talora-t2.gguf"])
    c = sub.add_parser("check")
    c.add_argument("path")
    k = sub.add_parser("compose", help="residual TALoRA: talora-t{k}.gguf = talora-shared.gguf stacked with talora-res{k}.gguf")
    k.add_argument("--dir", required=True)
    a = ap.parse_args()
    if a.cmd == "compose":
        compose(a.dir)
        return
    if a.cmd == "check":
        meta, factors, mask_row = read_adapter(a.path)
        print(json.dumps(meta, indent=1))
        A, B = factors[(0, "q")]
        print(len(factors), "factor pairs; blk.0.attn_q A", A.shape, "B", B.shape, "mask_embd", mask_row.shape,
              "|A|", float(np.abs(A).mean()), "|B|", float(np.abs(B).mean()))
        return
    res = json.load(open(a.results))
    adapters = []
    for f in a.files:
        meta, _, _ = read_adapter(os.path.join(a.dir, f))
        adapters.append({"file": f, "t_min": round(meta["ruvllm.diffusion.t_min"], 6),
                         "t_max": round(meta["ruvllm.diffusion.t_max"], 6),
                         "rank": None, "alpha": meta["adapter.lora.alpha"],
                         "sha256": sha256(os.path.join(a.dir, f)),
                         "bytes": os.path.getsize(os.path.join(a.dir, f))})
        _, factors, _ = read_adapter(os.path.join(a.dir, f))
        adapters[-1]["rank"] = int(factors[(0, "q")][0].shape[0])
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    man = {
        "base": "gemma-3-270m",
        "base_file": "gemma-3-270m-q4_k_m.gguf",
        "base_sha256": sha256(a.base),
        "mask_token_id": MASK_ID,
        "shift": True,
        "adapters": adapters,
        "training": {"gpu_minutes": res["gpu_minutes"], "tokens": res["tokens_trained_per_model"],
                     "commit": res.get("code_commit") or commit, "recipe": "training/README.md"},
    }
    with open(os.path.join(a.dir, "manifest.json"), "w") as f:
        json.dump(man, f, indent=2)
        f.write("\n")
    print(json.dumps(man, indent=2))


if __name__ == "__main__":
    main()
