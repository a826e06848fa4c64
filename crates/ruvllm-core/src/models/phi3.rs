//! Phi-3 and Phi-3.5 ("Phi-3 Technical Report", arXiv:2404.14219): the Llama block with the
//! query/key/value projections fused into one `attn_qkv` weight and the FFN's gate and up
//! projections into one `ffn_up` (gate first, as transformers' `gate_up_proj` chunks it),
//! NeoX RoPE, and for the 128k models LongRoPE (arXiv:2402.13753): per-frequency factors for
//! contexts longer than the training context, cos/sin scaled by an attention factor. The fused
//! weights are split into views of the file at load (`transformer::Layer::load`), so the
//! decoder graph is the Llama one. llama.cpp's `llm_build_phi3`; like llama.cpp we run every
//! layer with full attention (its Phi sliding window is switched off, as the converted files
//! do not describe it correctly).

use super::transformer::{RopeFactors, TransformerConfig, WeightLoader};
use super::Defaults;
use crate::backend::RopeStyle;
use crate::gguf::GgufFile;
use crate::Result;

/// Reads `phi3.*` metadata and the LongRoPE factors.
pub fn config(file: &GgufFile, vocab_size: usize) -> Result<TransformerConfig> {
    let a = "phi3";
    let key = |k: &str| format!("{a}.{k}");
    let mut c = super::base_config(file, a, vocab_size, Defaults { norm_eps: 1e-5, context: 4096, rope_base: 10_000.0 })?;
    let original = file.get_u64(&key("rope.scaling.original_context_length")).map(|v| v as usize).unwrap_or(c.train_context);
    let attn_factor = file.get_f64(&key("rope.scaling.attn_factor")).map(|v| v as f32).unwrap_or(1.0);
    c.rope_factors = RopeFactors::load(&WeightLoader { file }, c.rope_dim, original, attn_factor)?;
    c.rope_style = RopeStyle::Neox;
    Ok(c)
}
