//! Gemma 3 (text). Model card: https://ai.google.dev/gemma/docs/core/model_card_3 ; paper:
//! "Gemma 3 Technical Report" (arXiv:2503.19786). Local sliding-window layers (window 512,
//! RoPE base 10k) interleaved 5:1 with global layers (RoPE base 1M), QK-norm, sandwich norms,
//! GELU-tanh gated FFN, embeddings scaled by sqrt(d_model) and tied to the LM head.
//! Graph as llama.cpp's `llm_build_gemma3_iswa`.

use super::transformer::{Activation, TransformerConfig};
use crate::backend::RopeStyle;
use crate::gguf::GgufFile;
use crate::Result;

/// Reads `gemma3.*` metadata.
pub fn config(file: &GgufFile, vocab_size: usize) -> Result<TransformerConfig> {
    let a = "gemma3";
    let key = |k: &str| format!("{a}.{k}");
    let n_layer = super::dim(file, &key("block_count"))?;
    let d_model = super::dim(file, &key("embedding_length"))?;
    let n_head = super::dim(file, &key("attention.head_count"))?;
    let n_kv_head = file.get_u64(&key("attention.head_count_kv")).unwrap_or(n_head as u64) as usize;
    let head_dim = file.get_u64(&key("attention.key_length")).map(|v| v as usize).unwrap_or(d_model / n_head.max(1));
    let window = file.get_u64(&key("attention.sliding_window")).ok().map(|v| v as usize);
    // llama.cpp: set_swa_pattern(6): five local layers, then one global.
    let swa_layers = (0..n_layer).map(|il| window.is_some() && il % 6 < 5).collect();
    let linear_factor = match file.get(&key("rope.scaling.type")).and_then(|v| v.as_str()) {
        Some("linear") => file.get_f64(&key("rope.scaling.factor")).unwrap_or(1.0) as f32,
        _ => 1.0,
    };
    // Gemma 3 27B scales queries by (d_model / n_head)^-0.5, the others by head_dim^-0.5.
    let attn_scale = if n_layer == 62 { 1.0 / ((d_model / n_head) as f32).sqrt() } else { 1.0 / (head_dim as f32).sqrt() };
    Ok(TransformerConfig {
        architecture: a.to_string(),
        n_layer,
        d_model,
        n_head,
        n_kv_head,
        head_dim,
        ff_dim: super::dim(file, &key("feed_forward_length"))?,
        vocab_size,
        norm_eps: file.get_f64(&key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-6) as f32,
        train_context: file.get_u64(&key("context_length")).unwrap_or(8192) as usize,
        rope_base: file.get_f64(&key("rope.freq_base")).unwrap_or(1_000_000.0) as f32,
        rope_base_swa: Some(10_000.0),
        rope_dim: head_dim,
        rope_style: RopeStyle::Neox,
        rope_linear_factor: linear_factor,
        sliding_window: window,
        swa_layers,
        activation: Activation::GeluTanh,
        qk_norm: true,
        sandwich_norm: true,
        embed_scale: Some((d_model as f32).sqrt()),
        attn_scale,
        qkv_bias: false,
        final_logit_softcap: None,
    })
}
