"""Gemma 3 270M in plain PyTorch, rebuilt from ruvllm's Q4_K_M GGUF (dequantized, frozen),
with optional LoRA adapters on every projection, a replaceable `<mask>` embedding row,
bidirectional or causal attention, and a KV cache for sampling.

Weights keep llama.cpp's layout: `[out, in]` matrices; the RMSNorm weights as the GGUF stores
them (Gemma's `1 + w`, so they multiply directly). Shapes come from the GGUF metadata.
"""
import math
import os

import numpy as np
import torch
import torch.nn.functional as F

PROJS = ("q", "k", "v", "o", "gate", "up", "down")
GGUF_PROJ = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output",
             "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}
MASK_ID = 4


class Config:
    def __init__(self, fields):
        self.n_layer = int(fields["gemma3.block_count"])
        self.d_model = int(fields["gemma3.embedding_length"])
        self.n_head = int(fields["gemma3.attention.head_count"])
        self.n_kv = int(fields["gemma3.attention.head_count_kv"])
        self.head_dim = int(fields["gemma3.attention.key_length"])
        self.d_ff = int(fields["gemma3.feed_forward_length"])
        self.eps = float(fields["gemma3.attention.layer_norm_rms_epsilon"])
        self.rope_global = float(fields["gemma3.rope.freq_base"])
        self.rope_local = 10000.0
        self.window = int(fields["gemma3.attention.sliding_window"])
        self.sliding_pattern = 6  # every 6th layer global

    def is_global(self, i):
        return (i + 1) % self.sliding_pattern == 0

    def proj_shape(self, p):  # (out, in)
        d, q, kv, ff = self.d_model, self.n_head * self.head_dim, self.n_kv * self.head_dim, self.d_ff
        return {"q": (q, d), "k": (kv, d), "v": (kv, d), "o": (d, q),
                "gate": (ff, d), "up": (ff, d), "down": (d, ff)}[p]


def _field(r, k):
    f = r.fields[k]
    v = f.parts[f.data[0]]
    if v.dtype == np.uint8:
        return bytes(v).decode()
    return v[0].item()


def load_base(gguf_path, device, cache_path=None):
    """Dequantized GGUF tensors (bf16 matrices, f32 norms) on `device`, plus the Config."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    r = GGUFReader(gguf_path)
    fields = {k: _field(r, k) for k in r.fields if k.startswith("gemma3.")}
    cfg = Config(fields)
    if cache_path and os.path.exists(cache_path):
        w = torch.load(cache_path, map_location=device)
        return cfg, w
    w = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type)
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        a = np.ascontiguousarray(a, dtype=np.float32).reshape(shape)
        x = torch.from_numpy(a)
        x = x if x.ndim == 1 else x.to(torch.bfloat16)
        w[t.name] = x.to(device)
    # The mask row as stored (f32, before the sqrt(d) input scale), from the f32 dequantization.
    w["mask_row_f32"] = w["token_embd.weight"][MASK_ID].float().clone()
    if cache_path:
        torch.save(w, cache_path)
    return cfg, w


def rope_tables(cfg, n, device):
    out = {}
    for base in (cfg.rope_local, cfg.rope_global):
        inv = 1.0 / (base ** (torch.arange(0, cfg.head_dim, 2, device=device, dtype=torch.float32) / cfg.head_dim))
        ang = torch.arange(n, device=device, dtype=torch.float32)[:, None] * inv[None, :]
        ang = torch.cat([ang, ang], dim=-1)
        out[base] = (ang.cos(), ang.sin())
    return out


def rms(x, w, eps):
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w


def rot(x, cos, sin):
    # x (B, H, L, D) f32; cos/sin (B or 1, 1, L, D)
    h = x.shape[-1] // 2
    xr = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * cos + xr * sin


def lin(x, W, ab, scale):
    y = F.linear(x, W)
    if ab is not None:
        A, B = ab
        y = y + scale * F.linear(F.linear(x, A.to(x.dtype)), B.to(x.dtype))
    return y


def layer_fn(x, cos, sin, Wq, Wk, Wv, Wo, Wg, Wu, Wd, n_attn, n_post_attn, n_ffn, n_post_ffw, n_q, n_k,
             lora, scale, is_causal, n_head, n_kv, head_dim, eps, attn_mask=None, cache=None, start=0):
    """One Gemma 3 block. x (B, L, d) f32 residual stream; matmuls in bf16.
    lora: None or a tuple of 7 (A, B) pairs in PROJS order."""
    Bsz, L, _ = x.shape
    la = lora if lora is not None else (None,) * 7
    h = rms(x, n_attn, eps).to(torch.bfloat16)
    q = lin(h, Wq, la[0], scale).view(Bsz, L, n_head, head_dim).transpose(1, 2)
    k = lin(h, Wk, la[1], scale).view(Bsz, L, n_kv, head_dim).transpose(1, 2)
    v = lin(h, Wv, la[2], scale).view(Bsz, L, n_kv, head_dim).transpose(1, 2)
    q = rot(rms(q, n_q, eps), cos, sin).to(torch.bfloat16)
    k = rot(rms(k, n_k, eps), cos, sin).to(torch.bfloat16)
    if cache is not None:
        kc, vc = cache
        kc[:, :, start:start + L] = k
        vc[:, :, start:start + L] = v
        k, v = kc[:, :, :start + L], vc[:, :, :start + L]
    rep = n_head // n_kv
    k = k.repeat_interleave(rep, dim=1) if rep > 1 else k
    v = v.repeat_interleave(rep, dim=1) if rep > 1 else v
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=(is_causal and attn_mask is None),
                                       scale=1.0 / math.sqrt(head_dim))
    o = o.transpose(1, 2).reshape(Bsz, L, n_head * head_dim)
    o = lin(o, Wo, la[3], scale)
    x = x + rms(o, n_post_attn, eps)
    h = rms(x, n_ffn, eps).to(torch.bfloat16)
    g = lin(h, Wg, la[4], scale)
    u = lin(h, Wu, la[5], scale)
    m = lin(F.gelu(g.float(), approximate="tanh").to(torch.bfloat16) * u, Wd, la[6], scale)
    return x + rms(m, n_post_ffw, eps)


class Gemma:
    def __init__(self, cfg, w, max_len=640):
        self.cfg, self.w = cfg, w
        dev = w["token_embd.weight"].device
        self.rope = rope_tables(cfg, max_len, dev)
        self.E = w["token_embd.weight"]  # (vocab, d) bf16
        self.layer = layer_fn
        self.layer_train = layer_fn

    def compile(self):
        self.layer_train = torch.compile(layer_fn, dynamic=False)

    def lw(self, i):
        w, p = self.w, f"blk.{i}."
        return (w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"], w[p + "attn_output.weight"],
                w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"], w[p + "ffn_down.weight"],
                w[p + "attn_norm.weight"], w[p + "post_attention_norm.weight"], w[p + "ffn_norm.weight"],
                w[p + "post_ffw_norm.weight"], w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"])

    def embed(self, ids, mask_row=None):
        x = self.E[ids].float()
        if mask_row is not None:
            x = torch.where((ids == MASK_ID)[..., None], mask_row.float()[None, None, :], x)
        return x * math.sqrt(self.cfg.d_model)

    def hidden(self, ids, adapter=None, mask_row=None, is_causal=False, pos=None, attn_mask=None,
               caches=None, start=0, train=False):
        """Final-norm hidden states (B, L, d) f32. adapter: None or an Adapter."""
        cfg = self.cfg
        Bsz, L = ids.shape
        x = self.embed(ids, mask_row if mask_row is not None else (adapter.mask_row if adapter is not None else None))
        fn = self.layer_train if train else self.layer
        for i in range(cfg.n_layer):
            cos, sin = self.rope[cfg.rope_global if cfg.is_global(i) else cfg.rope_local]
            if pos is None:
                c, s = cos[start:start + L][None, None], sin[start:start + L][None, None]
            else:  # (B, L) positions
                c, s = cos[pos][:, None], sin[pos][:, None]
            lora = adapter.layer(i) if adapter is not None else None
            scale = adapter.scale if adapter is not None else 0.0
            x = fn(x, c, s, *self.lw(i), lora, scale, is_causal, cfg.n_head, cfg.n_kv, cfg.head_dim, cfg.eps,
                   attn_mask=attn_mask, cache=None if caches is None else caches[i], start=start)
        return rms(x, self.w["output_norm.weight"], cfg.eps)

    def logits(self, h):
        return F.linear(h.to(torch.bfloat16), self.E).float()


class Adapter(torch.nn.Module):
    """LoRA factors (f32) on every projection of every block, plus the mask token's embedding row."""

    def __init__(self, cfg, rank, alpha, mask_row_init, seed):
        super().__init__()
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank
        g = torch.Generator().manual_seed(seed)
        self.A = torch.nn.ParameterList()
        self.B = torch.nn.ParameterList()
        for i in range(cfg.n_layer):
            for p in PROJS:
                out, inn = cfg.proj_shape(p)
                # kaiming-uniform-like A (as PEFT), zero B: the adapter starts as the identity.
                bound = 1.0 / math.sqrt(inn)
                self.A.append(torch.nn.Parameter((torch.rand(rank, inn, generator=g) * 2 - 1) * bound))
                self.B.append(torch.nn.Parameter(torch.zeros(out, rank)))
        self.mask_row = torch.nn.Parameter(mask_row_init.detach().float().clone())

    def layer(self, i):
        n = len(PROJS)
        return tuple((self.A[i * n + j], self.B[i * n + j]) for j in range(n))

    def factors(self):
        """{(layer, proj): (A (r, in), B (out, r))} as f32 numpy."""
        n = len(PROJS)
        out = {}
        for k in range(len(self.A)):
            out[(k // n, PROJS[k % n])] = (self.A[k].detach().float().cpu().numpy(), self.B[k].detach().float().cpu().numpy())
        return out
