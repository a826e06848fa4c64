//! Learned factors as adapters: for the runtime ([`to_adapter`]) and as a standard llama.cpp
//! LoRA GGUF ([`write_gguf`]).

use std::path::Path;
use std::sync::Arc;

use ruvllm_core::gguf::writer::GgufWriter;
use ruvllm_core::gguf::MetadataValue as V;
use ruvllm_core::models::TransformerConfig;
use ruvllm_core::nn::lora::{AdapterFormat, LoraPair};
use ruvllm_core::nn::LoraAdapter;

use crate::grad::{LoraParams, Slot};
use crate::{Error, Result};

/// A slot's factors with each rank component rescaled so its row of `A` and column of `B` have
/// the same norm (`B·A` unchanged). Training can leave one factor tiny and the other large
/// (a merged `A` holds the delta's magnitude; a young `B` is near zero); half precision, which
/// the runtime and most adapter readers use, would flush the tiny one's values to subnormals.
pub(crate) fn balanced(p: &LoraParams, s: &Slot) -> (Vec<f32>, Vec<f32>) {
    let (a, b) = p.factors(s, &p.w);
    let (mut a, mut b) = (a.to_vec(), b.to_vec());
    let r = p.rank;
    for j in 0..r {
        let na = a[j * s.d_in..(j + 1) * s.d_in].iter().map(|x| x * x).sum::<f32>().sqrt();
        let nb = (0..s.d_out).map(|o| b[o * r + j] * b[o * r + j]).sum::<f32>().sqrt();
        if na > 0.0 && nb > 0.0 && na.is_finite() && nb.is_finite() {
            let c = (nb / na).sqrt();
            a[j * s.d_in..(j + 1) * s.d_in].iter_mut().for_each(|x| *x *= c);
            (0..s.d_out).for_each(|o| b[o * r + j] /= c);
        }
    }
    (a, b)
}

/// The runtime adapter of `p` (factors balanced, then rounded to f16), named `name` in messages.
pub fn to_adapter(p: &LoraParams, cfg: &TransformerConfig, name: &Path) -> Result<Arc<LoraAdapter>> {
    let pairs = p
        .slots
        .iter()
        .map(|s| {
            let (a, b) = balanced(p, s);
            (s.layer, s.proj, LoraPair::new(a, &b, p.rank, s.d_in, s.d_out))
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
        let here: Vec<(&LoraParams, &Slot)> = parts.iter().filter_map(|p| p.slot(layer, proj).map(|s| (*p, s))).collect();
        let rank: usize = here.iter().map(|(p, _)| p.rank).sum();
        let (d_in, d_out) = (here[0].1.d_in, here[0].1.d_out);
        // llama.cpp applies alpha/rank = 1/rank to the stacked pair: each part's `scale · rank`
        // is folded in, split evenly between its A rows and B columns.
        let mut a_rows: Vec<f32> = Vec::with_capacity(rank * d_in);
        let mut b = vec![0.0f32; d_out * rank];
        let mut at = 0;
        for (p, s) in here {
            let (a, pb) = balanced(p, s);
            let k = (p.scale * rank as f32).abs().sqrt();
            let sign = p.scale.signum();
            a_rows.extend(a.iter().map(|x| x * k));
            for j in 0..p.rank {
                for o in 0..d_out {
                    b[o * rank + at + j] = pb[o * p.rank + j] * k * sign;
                }
            }
            at += p.rank;
        }
        let base = format!("blk.{layer}.{}.weight", proj.gguf_name());
        // GGUF dims are in ggml order (row length first): A is `rank` rows of `d_in`, B is
        // `d_out` rows of `rank`.
        w.add_f32(&format!("{base}.lora_a"), &[d_in as u64, rank as u64], &a_rows);
        w.add_f32(&format!("{base}.lora_b"), &[rank as u64, d_out as u64], &b);
    }
    w.write(path).map_err(|e| Error::io(path, e))
}

/// A runtime adapter's factors (widened from half precision) as frozen [`LoraParams`] with its
/// `base_scale`, every projection at the adapter's largest rank (smaller ones padded with
/// zero components): how training applies, for instance, a diffusion model's conversion
/// adapter under the adapter it learns.
pub fn from_adapter(a: &LoraAdapter, n_layer: usize) -> LoraParams {
    let rank = a.rank.max(1);
    let mut slots = Vec::new();
    let mut w = Vec::new();
    for layer in 0..n_layer {
        for p in ruvllm_core::nn::Proj::ALL {
            let Some(pair) = a.pair(layer, p) else { continue };
            let (d_in, d_out) = (pair.d_in, pair.d_out);
            let off = w.len();
            slots.push(Slot { layer, proj: p, d_in, d_out, a: off, b: off + rank * d_in });
            w.resize(off + rank * (d_in + d_out), 0.0);
            for j in 0..pair.rank {
                for i in 0..d_in {
                    w[off + j * d_in + i] = pair.a[j * d_in + i].to_f32();
                }
                for o in 0..d_out {
                    w[off + rank * d_in + o * rank + j] = pair.bt[j * d_out + o].to_f32();
                }
            }
        }
    }
    LoraParams::from_parts(n_layer, rank, a.base_scale, slots, w)
}
