//! Model architectures: one file per family maps the checkpoint's metadata to a
//! [`TransformerConfig`]; the shared decoder lives in `transformer.rs`.

pub mod gemma2;
pub mod gemma3;
pub mod llama;
pub mod phi3;
pub mod transformer;

pub use transformer::{Outputs, RopeFactors, Segment, Transformer, TransformerConfig, WeightLoader};

use crate::backend::RopeStyle;
use crate::gguf::GgufFile;
use crate::{Error, Result};
use transformer::Activation;

/// Architectures we can run (`general.architecture`).
pub const SUPPORTED_ARCHITECTURES: &[&str] = &["gemma2", "gemma3", "llama", "mistral", "phi3", "qwen2", "qwen3"];

/// Reads the config of a supported architecture, validating it.
pub fn config_from_gguf(file: &GgufFile) -> Result<TransformerConfig> {
    let arch = file.get_str("general.architecture")?;
    let embd = file.tensor("token_embd.weight").ok_or_else(|| Error::gguf(&file.path, "missing tensor 'token_embd.weight'"))?;
    let vocab = match embd.dims.as_slice() {
        [_, v] => *v as usize,
        d => return Err(Error::gguf(&file.path, format!("tensor 'token_embd.weight' has shape {d:?}, expected 2-D"))),
    };
    let cfg = match arch {
        "gemma2" => gemma2::config(file, vocab)?,
        "gemma3" => gemma3::config(file, vocab)?,
        "llama" | "mistral" | "qwen2" | "qwen3" => llama::config(file, arch, vocab)?,
        "phi3" => phi3::config(file, vocab)?,
        other => {
            return Err(Error::unsupported(&file.path, format!("architecture '{other}' is not supported (supported: {})", SUPPORTED_ARCHITECTURES.join(", "))))
        }
    };
    validate(file, &cfg)?;
    Ok(cfg)
}

/// Defaults of one family for metadata its files may leave out.
pub(crate) struct Defaults {
    pub norm_eps: f32,
    pub context: u64,
    pub rope_base: f32,
}

/// The metadata every family shares (`{arch}.block_count`, widths, heads, RMSNorm epsilon,
/// training context, RoPE base, dimensions and linear scaling) as a plain pre-norm Llama block:
/// SiLU-gated FFN, interleaved RoPE, no biases, no extra norms or caps. Each family file reads
/// this and changes what its architecture does differently.
pub(crate) fn base_config(file: &GgufFile, arch: &str, vocab_size: usize, d: Defaults) -> Result<TransformerConfig> {
    let key = |k: &str| format!("{arch}.{k}");
    let n_layer = dim(file, &key("block_count"))?;
    let d_model = dim(file, &key("embedding_length"))?;
    let n_head = dim(file, &key("attention.head_count"))?;
    let n_kv_head = file.get_u64(&key("attention.head_count_kv")).unwrap_or(n_head as u64) as usize;
    let head_dim = file.get_u64(&key("attention.key_length")).map(|v| v as usize).unwrap_or(d_model / n_head.max(1));
    let linear_factor = match file.get(&key("rope.scaling.type")).and_then(|v| v.as_str()) {
        Some("linear") => file.get_f64(&key("rope.scaling.factor")).unwrap_or(1.0) as f32,
        _ => 1.0,
    };
    Ok(TransformerConfig {
        architecture: arch.to_string(),
        n_layer,
        d_model,
        n_head,
        n_kv_head,
        head_dim,
        ff_dim: dim(file, &key("feed_forward_length"))?,
        vocab_size,
        norm_eps: file.get_f64(&key("attention.layer_norm_rms_epsilon")).map(|v| v as f32).unwrap_or(d.norm_eps),
        train_context: file.get_u64(&key("context_length")).unwrap_or(d.context) as usize,
        rope_base: file.get_f64(&key("rope.freq_base")).map(|v| v as f32).unwrap_or(d.rope_base),
        rope_base_swa: None,
        rope_dim: file.get_u64(&key("rope.dimension_count")).map(|v| v as usize).unwrap_or(head_dim),
        rope_style: RopeStyle::Interleaved,
        rope_linear_factor: linear_factor,
        sliding_window: None,
        swa_layers: vec![false; n_layer],
        activation: Activation::Silu,
        qk_norm: false,
        sandwich_norm: false,
        embed_scale: None,
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        qkv_bias: false,
        final_logit_softcap: None,
        attn_softcap: None,
        rope_factors: RopeFactors::None,
    })
}

/// The largest layer count, width, head count or vocabulary accepted: far above any model we
/// can run, and small enough that tables sized from it (one entry per layer) stay small.
const MAX_DIM: usize = 1 << 20;

/// A model size read from the metadata (layers, widths, heads), checked to be 1..=`MAX_DIM`
/// before anything is sized or divided by it: the file is untrusted until validated.
pub(crate) fn dim(file: &GgufFile, key: &str) -> Result<usize> {
    let v = file.get_u64(key)?;
    usize::try_from(v)
        .ok()
        .filter(|v| (1..=MAX_DIM).contains(v))
        .ok_or_else(|| Error::gguf(&file.path, format!("metadata key '{key}' is {v}, which is not a plausible model size (1 to {MAX_DIM})")))
}

fn validate(file: &GgufFile, c: &TransformerConfig) -> Result<()> {
    let bad = |m: String| Err(Error::gguf(&file.path, m));
    let dims = [c.n_layer, c.d_model, c.n_head, c.n_kv_head, c.head_dim, c.ff_dim, c.vocab_size];
    if dims.iter().any(|&v| v == 0 || v > MAX_DIM) {
        return bad(format!("implausible model dimensions {dims:?}"));
    }
    if !c.n_head.is_multiple_of(c.n_kv_head) {
        return bad(format!("head_count {} is not a multiple of head_count_kv {}", c.n_head, c.n_kv_head));
    }
    if c.rope_dim > c.head_dim || !c.rope_dim.is_multiple_of(2) {
        return bad(format!("rope dimension {} does not fit head dimension {}", c.rope_dim, c.head_dim));
    }
    if !(c.norm_eps.is_finite() && c.norm_eps >= 0.0 && c.rope_base.is_finite() && c.rope_base > 0.0) {
        return bad("invalid norm epsilon or RoPE base".into());
    }
    Ok(())
}
