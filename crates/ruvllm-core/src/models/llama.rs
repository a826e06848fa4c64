//! The Llama family: Llama 2/3 ("Llama 2", arXiv:2307.09288; "The Llama 3 Herd of Models",
//! arXiv:2407.21783), Mistral (GGUF architecture `llama`) and Qwen2 (arXiv:2407.10671: biases
//! on Q/K/V, NeoX RoPE). Pre-norm blocks, SwiGLU FFN, grouped-query attention, untied or tied
//! LM head. Graphs as llama.cpp's `llm_build_llama` / `llm_build_qwen2`.

use super::transformer::{Activation, TransformerConfig};
use crate::backend::RopeStyle;
use crate::gguf::GgufFile;
use crate::Result;

/// Reads `{llama,qwen2,mistral}.*` metadata.
pub fn config(file: &GgufFile, arch: &str, vocab_size: usize) -> Result<TransformerConfig> {
    let key = |k: &str| format!("{arch}.{k}");
    let n_layer = super::dim(file, &key("block_count"))?;
    let d_model = super::dim(file, &key("embedding_length"))?;
    let n_head = super::dim(file, &key("attention.head_count"))?;
    let n_kv_head = file.get_u64(&key("attention.head_count_kv")).unwrap_or(n_head as u64) as usize;
    let head_dim = file.get_u64(&key("attention.key_length")).map(|v| v as usize).unwrap_or(d_model / n_head.max(1));
    let linear_factor = match file.get(&key("rope.scaling.type")).and_then(|v| v.as_str()) {
        Some("linear") => file.get_f64(&key("rope.scaling.factor")).unwrap_or(1.0) as f32,
        _ => 1.0,
    };
    let qwen = arch == "qwen2";
    Ok(TransformerConfig {
        architecture: arch.to_string(),
        n_layer,
        d_model,
        n_head,
        n_kv_head,
        head_dim,
        ff_dim: super::dim(file, &key("feed_forward_length"))?,
        vocab_size,
        norm_eps: file.get_f64(&key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5) as f32,
        train_context: file.get_u64(&key("context_length")).unwrap_or(4096) as usize,
        rope_base: file.get_f64(&key("rope.freq_base")).unwrap_or(10_000.0) as f32,
        rope_base_swa: None,
        rope_dim: file.get_u64(&key("rope.dimension_count")).map(|v| v as usize).unwrap_or(head_dim),
        rope_style: if qwen { RopeStyle::Neox } else { RopeStyle::Interleaved },
        rope_linear_factor: linear_factor,
        sliding_window: None,
        swa_layers: vec![false; n_layer],
        activation: Activation::Silu,
        qk_norm: false,
        sandwich_norm: false,
        embed_scale: None,
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        qkv_bias: qwen,
        final_logit_softcap: None,
    })
}
