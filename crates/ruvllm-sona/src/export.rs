//! Learned factors as adapters: for the runtime ([`to_adapter`]) and as a standard llama.cpp
//! LoRA GGUF ([`write_gguf`]).

use std::path::Path;
use std::sync::Arc;

use ruvllm_core::gguf::writer::GgufWriter;
use ruvllm_core::gguf::MetadataValue as V;
use ruvllm_core::models::TransformerConfig;
use ruvllm_core::nn::lora::{AdapterFormat, LoraPair};
use ruvllm_core::nn::LoraAdapter;

use crate::grad::LoraParams;
use crate::{Error, Result};

/// The runtime adapter of `p` (factors rounded to f16), named `name` in messages.
pub fn to_adapter(p: &LoraParams, cfg: &TransformerConfig, name: &Path) -> Result<Arc<LoraAdapter>> {
    let pairs = p
        .slots
        .iter()
        .map(|s| {
            let (a, b) = p.factors(s, &p.w);
            (s.layer, s.proj, LoraPair::new(a.to_vec(), b, p.rank, s.d_in, s.d_out))
        })
        .collect();
    Ok(Arc::new(LoraAdapter::from_pairs(name, AdapterFormat::Learned, cfg, p.scale, pairs)?))
}

/// Writes the sum of `parts` as one llama.cpp LoRA GGUF at `path` (atomically). Where several
/// parts adapt the same projection their factors are stacked (rank adds up). llama.cpp scales
/// each tensor pair by `alpha / rank` of that pair; `alpha` is written as 1 and each `B` carries
/// the rest of its part's scale, so the file applies exactly `Σ scale·B·A`.
pub fn write_gguf(parts: &[&LoraParams], arch: &str, path: &Path) -> Result<()> {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", V::String(arch.into()))
        .add_metadata("general.type", V::String("adapter".into()))
        .add_metadata("general.name", V::String("ruvllm learned adapter".into()))
        .add_metadata("adapter.type", V::String("lora".into()))
        .add_metadata("adapter.lora.alpha", V::F32(1.0));
    let mut keys: Vec<(usize, ruvllm_core::nn::Proj)> = parts.iter().flat_map(|p| p.slots.iter().map(|s| (s.layer, s.proj))).collect();
    keys.sort();
    keys.dedup();
    if keys.is_empty() {
        return Err(Error::InvalidArg("there is nothing learned to export yet".into()));
    }
    for (layer, proj) in keys {
        let mut a_rows: Vec<f32> = Vec::new();
        let mut b_cols: Vec<Vec<f32>> = Vec::new();
        let (mut d_in, mut d_out) = (0, 0);
        for p in parts {
            let Some(s) = p.slot(layer, proj) else { continue };
            let (a, b) = p.factors(s, &p.w);
            (d_in, d_out) = (s.d_in, s.d_out);
            a_rows.extend_from_slice(a);
            for j in 0..p.rank {
                b_cols.push((0..s.d_out).map(|o| b[o * p.rank + j] * p.scale).collect());
            }
        }
        let rank = b_cols.len();
        // llama.cpp applies alpha/rank = 1/rank: fold `rank` into B.
        let base = format!("blk.{layer}.{}.weight", proj.gguf_name());
        // GGUF dims [in, r] for A (ggml order: row length first): A is r rows of d_in.
        w.add_f32(&format!("{base}.lora_a"), &[d_in as u64, rank as u64], &a_rows);
        // B: [r, out] in ggml order, i.e. d_out rows of r values.
        let mut b = vec![0.0f32; d_out * rank];
        for (j, col) in b_cols.iter().enumerate() {
            for o in 0..d_out {
                b[o * rank + j] = col[o] * rank as f32;
            }
        }
        w.add_f32(&format!("{base}.lora_b"), &[rank as u64, d_out as u64], &b);
    }
    let bytes = w.to_bytes();
    crate::store::write_atomic(path, &bytes)
}
