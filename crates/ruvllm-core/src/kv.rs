//! KV cache: per layer, keys and values for every cached position, laid out
//! `[slot][kv_head][head_dim]`. Layers with a sliding window keep only a ring of
//! `window + max_batch` slots (enough for any query in a prefill chunk to see its whole window),
//! so a long context costs full memory only in the global-attention layers.

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::kernels::mem::HugeVec;

/// Keys and values of one layer.
pub struct LayerCache {
    /// Number of slots; position `p` lives in slot `p % capacity`.
    pub capacity: usize,
    /// IEEE half precision (llama.cpp's default cache type), rounded to nearest even on store,
    /// on huge pages (kernels::mem): decode's attention streams them every token.
    pub k: HugeVec<f16>,
    pub v: HugeVec<f16>,
}

pub struct KvCache {
    pub layers: Vec<LayerCache>,
    /// Floats per position (kv_heads × head_dim).
    pub row: usize,
    /// Tokens whose keys/values are stored, in position order (used for prefix reuse).
    pub tokens: Vec<u32>,
}

impl KvCache {
    /// `capacities[l]` slots for layer `l`.
    pub fn new(capacities: &[usize], row: usize) -> Self {
        let layers = capacities
            .iter()
            .map(|&capacity| LayerCache { capacity, k: HugeVec::zeros(capacity * row), v: HugeVec::zeros(capacity * row) })
            .collect();
        KvCache { layers, row, tokens: Vec::new() }
    }

    /// Bytes held by the cache.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|l| (l.k.len() + l.v.len()) * 2).sum()
    }
}

impl LayerCache {
    #[inline]
    pub fn slot(&self, pos: usize) -> usize {
        pos % self.capacity
    }

    /// Stores the key and value rows of position `pos`.
    pub fn store(&mut self, pos: usize, k: &[f32], v: &[f32]) {
        let row = k.len();
        let s = self.slot(pos) * row;
        self.k[s..s + row].convert_from_f32_slice(k);
        self.v[s..s + row].convert_from_f32_slice(v);
    }
}
