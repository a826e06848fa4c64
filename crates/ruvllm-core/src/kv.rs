//! KV cache: per layer, keys and values for every cached position, laid out
//! `[slot][kv_head][head_dim]`. Layers with a sliding window keep only a ring of
//! `window + max_batch` slots (enough for any query in a prefill chunk to see its whole window),
//! so a long context costs full memory only in the global-attention layers.

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::runtime::mem::HugeVec;
use crate::nn::AdapterSet;

/// Element type of the cached keys and values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    /// IEEE half precision, rounded to nearest even on store: llama.cpp's default cache type,
    /// half the memory and attention traffic of f32.
    #[default]
    F16,
    /// Exact f32 (the reference: tests against f32 implementations use it).
    F32,
}

/// The key and value rows of one layer, of one [`KvType`], on huge pages (runtime::mem):
/// decode's attention streams them every token.
pub enum KvRows {
    F16 { k: HugeVec<f16>, v: HugeVec<f16> },
    F32 { k: HugeVec<f32>, v: HugeVec<f32> },
}

/// Keys and values of one layer.
pub struct LayerCache {
    /// Number of slots; position `p` lives in slot `p % capacity`.
    pub capacity: usize,
    pub rows: KvRows,
}

pub struct KvCache {
    pub layers: Vec<LayerCache>,
    /// Floats per position (kv_heads × head_dim).
    pub row: usize,
    /// Tokens whose keys/values are stored, in position order (used for prefix reuse).
    pub tokens: Vec<u32>,
    /// The LoRA adapters the forward pass applies, and so the ones the stored keys and values
    /// were computed with: a prefix is reusable only under the same set.
    pub adapters: AdapterSet,
}

impl KvCache {
    /// `capacities[l]` slots for layer `l`, f16 ([`KvType::F16`]).
    pub fn new(capacities: &[usize], row: usize) -> Self {
        Self::with_type(capacities, row, KvType::F16)
    }

    /// `capacities[l]` slots for layer `l`, keys and values stored as `ty`.
    pub fn with_type(capacities: &[usize], row: usize, ty: KvType) -> Self {
        let layers = capacities
            .iter()
            .map(|&capacity| {
                let n = capacity * row;
                let rows = match ty {
                    KvType::F16 => KvRows::F16 { k: HugeVec::zeros(n), v: HugeVec::zeros(n) },
                    KvType::F32 => KvRows::F32 { k: HugeVec::zeros(n), v: HugeVec::zeros(n) },
                };
                LayerCache { capacity, rows }
            })
            .collect();
        KvCache { layers, row, tokens: Vec::new(), adapters: AdapterSet::default() }
    }

    /// Bytes held by the cache.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match &l.rows {
                KvRows::F16 { k, v } => (k.len() + v.len()) * 2,
                KvRows::F32 { k, v } => (k.len() + v.len()) * 4,
            })
            .sum()
    }
}

impl LayerCache {
    #[inline]
    pub fn slot(&self, pos: usize) -> usize {
        pos % self.capacity
    }

    /// Stores the key and value rows of position `pos`.
    pub fn store(&mut self, pos: usize, k_row: &[f32], v_row: &[f32]) {
        let row = k_row.len();
        let s = self.slot(pos) * row;
        match &mut self.rows {
            KvRows::F16 { k, v } => {
                k[s..s + row].convert_from_f32_slice(k_row);
                v[s..s + row].convert_from_f32_slice(v_row);
            }
            KvRows::F32 { k, v } => {
                k[s..s + row].copy_from_slice(k_row);
                v[s..s + row].copy_from_slice(v_row);
            }
        }
    }
}
