//! The Llama family: Llama 2/3 ("Llama 2", arXiv:2307.09288; "The Llama 3 Herd of Models",
//! arXiv:2407.21783; Llama 3.1/3.2's `rope_scaling: llama3` arrives as the `rope_freqs.weight`
//! frequency factors), Mistral (GGUF architecture `llama`), Qwen2 (arXiv:2407.10671: biases
//! on Q/K/V, NeoX RoPE) and Qwen3 (arXiv:2505.09388: no biases, per-head RMSNorm of Q and K
//! before RoPE). Pre-norm blocks, SwiGLU FFN, grouped-query attention, untied or tied LM head.
//! Graphs as llama.cpp's `llm_build_llama` / `llm_build_qwen2` / `llm_build_qwen3`.

use super::transformer::{RopeFactors, TransformerConfig, WeightLoader};
use super::Defaults;
use crate::backend::RopeStyle;
use crate::gguf::GgufFile;
use crate::Result;

/// Reads `{llama,mistral,qwen2,qwen3}.*` metadata and Llama 3.1's frequency factors.
pub fn config(file: &GgufFile, arch: &str, vocab_size: usize) -> Result<TransformerConfig> {
    let mut c = super::base_config(file, arch, vocab_size, Defaults { norm_eps: 1e-5, context: 4096, rope_base: 10_000.0 })?;
    let (qwen2, qwen3) = (arch == "qwen2", arch == "qwen3");
    if qwen2 || qwen3 {
        c.rope_style = RopeStyle::Neox;
    }
    c.qk_norm = qwen3;
    c.qkv_bias = qwen2;
    c.rope_factors = RopeFactors::load(&WeightLoader { file }, c.rope_dim, c.train_context, 1.0)?;
    Ok(c)
}
