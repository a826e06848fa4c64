//! Gemma 2. Paper: "Gemma 2: Improving Open Language Models at a Practical Size"
//! (arXiv:2408.00118). Local sliding-window layers (window 4096) alternating with global ones
//! (the even layers are local), soft-capped attention scores (50) and final logits (30),
//! sandwich norms, GELU-tanh gated FFN, embeddings scaled by sqrt(d_model) and tied to the LM
//! head. Graph as llama.cpp's `llm_build_gemma2_iswa`.

use super::transformer::{Activation, TransformerConfig};
use super::Defaults;
use crate::backend::RopeStyle;
use crate::gguf::GgufFile;
use crate::Result;

/// Reads `gemma2.*` metadata.
pub fn config(file: &GgufFile, vocab_size: usize) -> Result<TransformerConfig> {
    let a = "gemma2";
    let key = |k: &str| format!("{a}.{k}");
    let mut c = super::base_config(file, a, vocab_size, Defaults { norm_eps: 1e-6, context: 8192, rope_base: 10_000.0 })?;
    // llama.cpp: window 4096 unless the file says otherwise; set_swa_pattern(2) makes the even
    // layers local (transformers: `sliding_window if not layer_idx % 2`).
    c.sliding_window = Some(file.get_u64(&key("attention.sliding_window")).map(|v| v as usize).unwrap_or(4096));
    c.swa_layers = (0..c.n_layer).map(|il| il % 2 == 0).collect();
    let softcap = |k: &str| file.get_f64(&key(k)).ok().map(|v| v as f32).filter(|v| *v > 0.0);
    c.final_logit_softcap = softcap("final_logit_softcapping");
    c.attn_softcap = softcap("attn_logit_softcapping");
    // Gemma 2 27B scales queries by (d_model / n_head)^-0.5, the others by head_dim^-0.5
    // (gemma_pytorch's `query_pre_attn_scalar`, as llama.cpp reads it from the layer count).
    if c.n_layer == 46 {
        c.attn_scale = 1.0 / ((c.d_model / c.n_head) as f32).sqrt();
    }
    c.rope_style = RopeStyle::Neox;
    c.activation = Activation::GeluTanh;
    c.sandwich_norm = true;
    c.embed_scale = Some((c.d_model as f32).sqrt());
    Ok(c)
}
