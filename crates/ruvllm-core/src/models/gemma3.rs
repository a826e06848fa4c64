//! Gemma 3 (text). Model card: https://ai.google.dev/gemma/docs/core/model_card_3 ; paper:
//! "Gemma 3 Technical Report" (arXiv:2503.19786). Local sliding-window layers (window 512,
//! RoPE base 10k) interleaved 5:1 with global layers (RoPE base 1M), QK-norm, sandwich norms,
//! GELU-tanh gated FFN, embeddings scaled by sqrt(d_model) and tied to the LM head.
//! Graph as llama.cpp's `llm_build_gemma3_iswa`.

use super::transformer::{Activation, TransformerConfig};
use super::Defaults;
use crate::backend::RopeStyle;
use crate::gguf::GgufFile;
use crate::Result;

/// Reads `gemma3.*` metadata.
pub fn config(file: &GgufFile, vocab_size: usize) -> Result<TransformerConfig> {
    let a = "gemma3";
    let key = |k: &str| format!("{a}.{k}");
    let mut c = super::base_config(file, a, vocab_size, Defaults { norm_eps: 1e-6, context: 8192, rope_base: 1_000_000.0 })?;
    let window = file.get_u64(&key("attention.sliding_window")).ok().map(|v| v as usize);
    // llama.cpp: set_swa_pattern(6): five local layers, then one global.
    c.swa_layers = (0..c.n_layer).map(|il| window.is_some() && il % 6 < 5).collect();
    c.sliding_window = window;
    c.rope_base_swa = Some(10_000.0);
    // Gemma 3 keeps every head dimension rotated, whatever `rope.dimension_count` says.
    c.rope_dim = c.head_dim;
    // Gemma 3 27B scales queries by (d_model / n_head)^-0.5, the others by head_dim^-0.5.
    if c.n_layer == 62 {
        c.attn_scale = 1.0 / ((c.d_model / c.n_head) as f32).sqrt();
    }
    c.rope_style = RopeStyle::Neox;
    c.activation = Activation::GeluTanh;
    c.qk_norm = true;
    c.sandwich_norm = true;
    c.embed_scale = Some((c.d_model as f32).sqrt());
    Ok(c)
}
