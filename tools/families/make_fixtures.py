#!/usr/bin/env python3
"""Builds per-family test fixtures: tiny random-weight Hugging Face models, their GGUF conversions
(llama.cpp's own convert_hf_to_gguf.py), a token sequence and the f32 transformers logits on it.

  make_fixtures.py [--out DIR] [--cases qwen3,gemma2,...] [--no-requant]

For every CASE, DIR/CASE/ holds:
  hf/                 save_pretrained model + tokenizer
  model-f32.gguf      convert_hf_to_gguf.py --outtype f32
  model-q8_0.gguf     convert_hf_to_gguf.py --outtype q8_0
  tokens.bin          N little-endian u32 token ids (BOS first when the model has one)
  ref.f32             little-endian f32 logits [N][vocab], transformers float32, eager attention
  meta.json           {case, arch, vocab, n_tokens, notes, hf_config, ...}
and DIR/llama31/model-<type>.gguf for the requantized types (requant.py).
Run with the venv from setup.sh."""
import argparse
import glob
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LLAMA_CPP_SRC = os.environ.get("LLAMA_CPP_SRC", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".llama", "src-0.3.36"))
sys.path.insert(0, os.path.join(LLAMA_CPP_SRC, "gguf-py"))
import gguf  # noqa: E402

N_TOKENS = 48
HIDDEN = 256
INTER = 512
REQUANT_TYPES = ["Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "Q4_1", "Q5_K", "Q4_K", "Q6_K"]
ALL_CASES = ["qwen3", "gemma2", "phi3", "phi3-longrope", "llama31"]

torch.set_num_threads(int(os.environ.get("FAMILIES_THREADS", "1")))


# ---------------------------------------------------------------- tokenizers

def training_text(work: Path) -> Path:
    """Some English text for the tiny tokenizers: the repo's own markdown files."""
    path = work / "tok-train.txt"
    if path.exists():
        return path
    files = sorted(glob.glob(str(REPO / "*.md")) + glob.glob(str(REPO / "docs" / "**" / "*.md"), recursive=True))
    text = ""
    for f in files:
        try:
            text += Path(f).read_text(encoding="utf-8", errors="ignore") + "\n"
        except OSError:
            pass
    if len(text) < 20000:  # fallback: deterministic pseudo-words
        rng = np.random.default_rng(0)
        letters = np.array(list("etaoinshrdlucmfwypvbgkqjxz"))
        words = ["".join(rng.choice(letters, size=rng.integers(1, 9))) for _ in range(3000)]
        text += " ".join(rng.choice(words, size=40000)) + "\n"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def sentencepiece_model(work: Path, vocab: int) -> Path:
    """A BPE sentencepiece model with byte fallback (<0x00>..<0xFF> at 3..258, as llama.cpp's SPM vocab
    wants for its newline token): unk=0, bos=1, eos=2."""
    import sentencepiece as spm
    prefix = work / f"sp{vocab}"
    model = Path(str(prefix) + ".model")
    if not model.exists():
        spm.SentencePieceTrainer.train(
            input=str(training_text(work)), model_prefix=str(prefix), vocab_size=vocab, model_type="bpe",
            character_coverage=0.9995, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, byte_fallback=True,
            num_threads=1, minloglevel=2)
    return model


def save_sp_tokenizer(out: Path, sp_model: Path, kind: str):
    from transformers import GemmaTokenizer, LlamaTokenizer
    cls = GemmaTokenizer if kind == "gemma" else LlamaTokenizer
    kw = dict(vocab_file=str(sp_model), legacy=False)
    if kind == "gemma":
        kw.update(pad_token="<unk>", bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tok = cls(**kw)
    tok.save_pretrained(out)
    return tok


def save_bpe_tokenizer(out: Path, work: Path, vocab: int):
    """A GPT-2 style byte-level BPE (tokenizer.json) as Qwen uses; specials at the end of the vocab."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab - len(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train([str(training_text(work))], trainer)
    tk.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.save_pretrained(out)
    return fast, [tk.token_to_id(s) for s in specials]


# ---------------------------------------------------------------- models

def randomize(model, std: float, norm_kind: str, gen: torch.Generator, overrides=None):
    """All weights N(0, std) (overrides: name-substring -> std); norm weights 1 + N(0, 0.1)
    (Gemma stores w with the +1 outside: N(0, 0.1))."""
    overrides = overrides or {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                base = 0.0 if norm_kind == "gemma" else 1.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                s = std
                for key, v in overrides.items():
                    if key in name:
                        s = v
                p.copy_(s * torch.randn(p.shape, generator=gen))


def hf_logits(model, ids):
    model.eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids], dtype=torch.long)).logits[0].float()


def variant_delta(cls, config, state, ids, ref, **changes):
    """max |logit difference| when the config changes (shows that a feature matters on this input)."""
    cfg = config.__class__.from_dict({**config.to_dict(), **changes})
    cfg._attn_implementation = "eager"
    m = cls(cfg)
    m.load_state_dict(state)
    return float((hf_logits(m, ids) - ref).abs().max())


def build_case(case: str, work: Path):
    """Returns (model, tokenizer-ish info, notes dict)."""
    import transformers as tf
    seed = {"qwen3": 1, "gemma2": 2, "phi3": 3, "phi3-longrope": 4, "llama31": 5}[case]
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    hf_dir = work / case / "hf"
    hf_dir.mkdir(parents=True, exist_ok=True)
    notes = {}

    if case == "qwen3":
        tok, special_ids = save_bpe_tokenizer(hf_dir, work, 640)
        vocab = len(tok)
        cfg = tf.Qwen3Config(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=64, tie_word_embeddings=False,
                             rope_theta=1000000.0, max_position_embeddings=256, rms_norm_eps=1e-6,
                             bos_token_id=None, eos_token_id=special_ids[0], pad_token_id=special_ids[0],
                             attention_bias=False, use_sliding_window=False)
        cls, std, over, norm_kind = tf.Qwen3ForCausalLM, 0.06, {"embed_tokens": 0.1, "lm_head": 0.12}, "rms"
        bos, avoid = None, set(special_ids)
    else:
        sp = sentencepiece_model(work, 512)
        vocab = 512
        bos, avoid = 1, {0, 1, 2}  # unk, bos, eos (byte tokens are ordinary ids here)
        common = dict(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=INTER, bos_token_id=1, eos_token_id=2)
        if case == "gemma2":
            save_sp_tokenizer(hf_dir, sp, "gemma")
            cfg = tf.Gemma2Config(**common, pad_token_id=0, num_hidden_layers=4, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=64, sliding_window=16,
                                  attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                                  query_pre_attn_scalar=64, max_position_embeddings=256, rope_theta=10000.0,
                                  hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6)
            # q/k large so that some attention scores pass the 50 cap; final norm large so that logits pass 30.
            cls, std, over, norm_kind = tf.Gemma2ForCausalLM, 0.05, {"q_proj": 0.2, "k_proj": 0.2, "embed_tokens": 0.1}, "gemma"
        elif case in ("phi3", "phi3-longrope"):
            save_sp_tokenizer(hf_dir, sp, "llama")
            rope_scaling = None
            if case == "phi3-longrope":
                half = 64 // 2
                rope_scaling = {"type": "longrope",
                                "short_factor": [round(1.0 + i / (half - 1), 4) for i in range(half)],        # 1.0 .. 2.0
                                "long_factor": [round(1.0 + 3.0 * i / (half - 1), 4) for i in range(half)]}   # 1.0 .. 4.0
            cfg = tf.Phi3Config(**common, pad_token_id=0, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, max_position_embeddings=128,
                                original_max_position_embeddings=32, rope_scaling=rope_scaling, rope_theta=10000.0,
                                sliding_window=None, tie_word_embeddings=False, rms_norm_eps=1e-5,
                                resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0)
            cls, std, over, norm_kind = tf.Phi3ForCausalLM, 0.06, {"embed_tokens": 0.1, "lm_head": 0.12}, "rms"
        elif case == "llama31":
            save_sp_tokenizer(hf_dir, sp, "llama")
            cfg = tf.LlamaConfig(**common, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                                 head_dim=32, max_position_embeddings=256, rope_theta=10000.0,
                                 rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                                 tie_word_embeddings=False, rms_norm_eps=1e-5)
            cls, std, over, norm_kind = tf.LlamaForCausalLM, 0.06, {"embed_tokens": 0.1, "lm_head": 0.12}, "rms"
        else:
            raise ValueError(case)

    cfg._attn_implementation = "eager"
    cfg.dtype = torch.float32
    model = cls(cfg)
    randomize(model, std, norm_kind, gen, over)
    if case == "gemma2":
        with torch.no_grad():
            model.model.norm.weight.add_(1.0)  # effective final norm scale ~2: the largest raw logits reach the cap of 30
            # Tied embeddings scaled by sqrt(hidden) dominate the residual stream and make every position
            # predict its own input token; larger post-norms let the layers' outputs dominate instead.
            for layer in model.model.layers:
                layer.post_attention_layernorm.weight.add_(1.5)
                layer.post_feedforward_layernorm.weight.add_(1.5)
    model = model.float().eval()

    rng = np.random.default_rng(seed)
    pool = np.array([i for i in range(vocab) if i not in avoid])
    ids = [int(x) for x in rng.choice(pool, size=N_TOKENS - (1 if bos is not None else 0))]
    if bos is not None:
        ids = [bos] + ids
    return model, cls, cfg, ids, notes


def diagnostics(case, model, cls, cfg, ids, ref, notes):
    import transformers as tf
    state = model.state_dict()
    if case == "gemma2":
        import transformers.models.gemma2.modeling_gemma2 as mg
        stats = {"max_abs_score": 0.0, "n_over_25": 0}
        orig = mg.eager_attention_forward

        def wrapped(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kw):
            k = mg.repeat_kv(key, module.num_key_value_groups)
            s = torch.matmul(query, k.transpose(2, 3)) * (scaling if scaling is not None else module.head_dim ** -0.5)
            causal = torch.tril(torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool))
            s = s[..., causal]
            stats["max_abs_score"] = max(stats["max_abs_score"], float(s.abs().max()))
            stats["n_over_25"] += int((s.abs() > 25).sum())
            return orig(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, softcap=softcap, **kw)

        raw = {}
        h = model.lm_head.register_forward_hook(lambda m, i, o: raw.__setitem__("max", float(o.abs().max())))
        mg.eager_attention_forward = wrapped
        try:
            hf_logits(model, ids)
        finally:
            mg.eager_attention_forward = orig
            h.remove()
        notes["max_abs_attn_score_before_softcap"] = round(stats["max_abs_score"], 3)
        notes["n_causal_attn_scores_over_25"] = stats["n_over_25"]
        notes["max_abs_logit_before_final_softcap"] = round(raw["max"], 3)
        notes["max_abs_logit_after_final_softcap"] = round(float(ref.abs().max()), 3)
        notes["delta_without_attn_softcap"] = variant_delta(cls, cfg, state, ids, ref, attn_logit_softcapping=None)
        notes["delta_without_final_softcap"] = variant_delta(cls, cfg, state, ids, ref, final_logit_softcapping=None)
        notes["delta_without_sliding_window"] = variant_delta(cls, cfg, state, ids, ref, sliding_window=4096)
        notes["layer_types"] = list(cfg.layer_types)
        notes["query_scale"] = "query_pre_attn_scalar**-0.5 = head_dim**-0.5 = 1/8 (llama.cpp: 1/sqrt(n_embd_head_k) for non-27B)"
        print(f"  gemma2: max |attn score| {stats['max_abs_score']:.2f} (cap 50), max |raw logit| {raw['max']:.2f} (cap 30)")
    if case == "phi3-longrope":
        rot = model.model.rotary_emb
        # after the forward on N=48 > original_max_position_embeddings=32 positions
        long_inv = getattr(rot, "long_inv_freq", None)
        used_long = long_inv is not None and torch.equal(rot.inv_freq, long_inv)
        notes["hf_longrope_choice"] = (
            "transformers %s (modeling_rope_utils.dynamic_rope_update/longrope_frequency_update): per forward call, "
            "seq_len = max(position_ids)+1; long_factor if seq_len > original_max_position_embeddings (32) else "
            "short_factor, for all positions of that call. Here seq_len=%d -> %s factors." %
            (tf.__version__, N_TOKENS, "long" if used_long else "short"))
        notes["hf_attention_factor"] = float(rot.attention_scaling)
        notes["hf_attention_factor_formula"] = "sqrt(1 + ln(max_pos/orig_max_pos)/ln(orig_max_pos)) = sqrt(1+ln4/ln32), multiplies cos and sin (both short and long)"
        notes["delta_short_vs_long"] = variant_delta(
            cls, cfg, state, ids, ref, rope_scaling={**cfg.rope_scaling, "long_factor": cfg.rope_scaling["short_factor"]})
        notes["llamacpp_choice"] = ("llama.cpp picks rope_factors_long when the context's n_ctx_seq > "
                                    "rope.scaling.original_context_length (32), else short; use a context > 32")
        print(f"  phi3-longrope: HF used {'long' if used_long else 'short'} factors, attention factor {rot.attention_scaling:.6f}")
    if case == "llama31":
        notes["delta_without_llama3_rope_scaling"] = variant_delta(cls, cfg, state, ids, ref, rope_scaling=None)
    if case in ("phi3", "phi3-longrope"):
        notes["fused"] = "qkv_proj [q;k;v] rows, gate_up_proj [gate;up] rows (HF chunk(2): first half gate)"


# ---------------------------------------------------------------- conversion

def convert(hf_dir: Path, out: Path, outtype: str, env):
    cmd = [sys.executable, str(HERE / "convert.py"), str(hf_dir), "--outfile", str(out), "--outtype", outtype]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-4000:] + r.stderr[-4000:])
        raise RuntimeError(f"convert failed: {' '.join(cmd)}")
    for line in r.stderr.splitlines():
        if "convert.py:" in line:
            print("   ", line)


def gguf_arch(path: Path) -> str:
    rd = gguf.GGUFReader(str(path))
    f = rd.fields["general.architecture"]
    return bytes(f.parts[f.data[0]]).decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "target" / "families"))
    ap.add_argument("--cases", default=",".join(ALL_CASES))
    ap.add_argument("--no-requant", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, LLAMA_CPP_SRC=LLAMA_CPP_SRC)
    for case in args.cases.split(","):
        t0 = time.time()
        print(f"== {case}")
        cdir = out / case
        model, cls, cfg, ids, notes = build_case(case, out)
        model.save_pretrained(cdir / "hf", safe_serialization=True)
        ref = hf_logits(model, ids)
        diagnostics(case, model, cls, cfg, ids, ref, notes)
        vocab = cfg.vocab_size
        assert ref.shape == (N_TOKENS, vocab), ref.shape
        np.asarray(ids, dtype="<u4").tofile(cdir / "tokens.bin")
        ref.numpy().astype("<f4").tofile(cdir / "ref.f32")
        convert(cdir / "hf", cdir / "model-f32.gguf", "f32", env)
        convert(cdir / "hf", cdir / "model-q8_0.gguf", "q8_0", env)
        if case == "llama31" and not args.no_requant:
            for t in REQUANT_TYPES:
                r = subprocess.run([sys.executable, str(HERE / "requant.py"), str(cdir / "model-f32.gguf"),
                                    str(cdir / f"model-{t.lower()}.gguf"), t], capture_output=True, text=True, env=env)
                print("   ", (r.stdout + r.stderr).strip().splitlines()[-1] if (r.stdout + r.stderr).strip() else "")
                if r.returncode != 0:
                    sys.stderr.write(r.stderr[-3000:])
                    raise RuntimeError(f"requant {t} failed")
        p = torch.softmax(ref.double(), -1)
        notes["ref_mean_max_prob"] = round(float(p.max(-1).values.mean()), 4)
        notes["ref_logit_std"] = round(float(ref.std()), 4)
        meta = {"case": case, "arch": gguf_arch(cdir / "model-f32.gguf"), "hf_class": cls.__name__, "vocab": vocab,
                "n_tokens": N_TOKENS, "bos": ids[0] if cfg.bos_token_id is not None else None,
                "tokens_file": "tokens.bin (u32 LE)", "ref_file": "ref.f32 (f32 LE logits [n_tokens][vocab])",
                "transformers": __import__("transformers").__version__, "torch": torch.__version__,
                "notes": notes, "hf_config": cfg.to_dict()}
        (cdir / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
        print(f"  {case}: arch {meta['arch']} vocab {vocab} mean max-prob {notes['ref_mean_max_prob']} "
              f"logit std {notes['ref_logit_std']} ({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
