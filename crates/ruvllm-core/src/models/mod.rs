//! Model architectures: one file per family maps the checkpoint's metadata to a
//! [`TransformerConfig`]; the shared decoder lives in `transformer.rs`.

pub mod gemma3;
pub mod llama;
pub mod transformer;

pub use transformer::{Segment, Transformer, TransformerConfig, WeightLoader};

use crate::gguf::GgufFile;
use crate::{Error, Result};

/// Architectures we can run (`general.architecture`).
pub const SUPPORTED_ARCHITECTURES: &[&str] = &["gemma3", "llama", "mistral", "qwen2"];

/// Reads the config of a supported architecture, validating it.
pub fn config_from_gguf(file: &GgufFile) -> Result<TransformerConfig> {
    let arch = file.get_str("general.architecture")?;
    let embd = file.tensor("token_embd.weight").ok_or_else(|| Error::gguf(&file.path, "missing tensor 'token_embd.weight'"))?;
    let vocab = match embd.dims.as_slice() {
        [_, v] => *v as usize,
        d => return Err(Error::gguf(&file.path, format!("tensor 'token_embd.weight' has shape {d:?}, expected 2-D"))),
    };
    let cfg = match arch {
        "gemma3" => gemma3::config(file, vocab)?,
        "llama" | "mistral" | "qwen2" => llama::config(file, arch, vocab)?,
        other => {
            return Err(Error::unsupported(&file.path, format!("architecture '{other}' is not supported (supported: {})", SUPPORTED_ARCHITECTURES.join(", "))))
        }
    };
    validate(file, &cfg)?;
    Ok(cfg)
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
