//! KV cache: per layer, keys and values for every cached position, laid out
//! `[slot][kv_head][head_dim]`. Layers with a sliding window keep only a ring of
//! `window + max_batch` slots (enough for any query in a prefill chunk to see its whole window),
//! so a long context costs full memory only in the global-attention layers.

pub use crate::backend::kv::{KvQ8, KvRows, KvType, LayerCache, Q8_BLOCK};
use crate::nn::AdapterSet;

pub struct KvCache {
    pub layers: Vec<LayerCache>,
    /// Floats per position (kv_heads × head_dim).
    pub row: usize,
    /// Tokens whose keys/values are stored, in position order (used for prefix reuse).
    pub tokens: Vec<u32>,
    /// The LoRA adapters the forward pass applies, and so the ones the stored keys and values
    /// were computed with: a prefix is reusable only under the same set.
    pub adapters: AdapterSet,
    /// The most positions ever written: the cache's memory that has been touched.
    high_water: usize,
}

impl KvCache {
    /// A cache of the given layers (see [`crate::backend::Backend::new_layer_cache`]).
    pub fn from_layers(layers: Vec<LayerCache>, row: usize) -> Self {
        KvCache { layers, row, tokens: Vec::new(), adapters: AdapterSet::default(), high_water: 0 }
    }

    /// `capacities[l]` slots for layer `l`, f16 ([`KvType::F16`]), in host memory.
    pub fn new(capacities: &[usize], row: usize) -> Self {
        Self::with_type(capacities, row, KvType::F16)
    }

    /// `capacities[l]` slots for layer `l`, keys and values stored as `ty`, in host memory.
    pub fn with_type(capacities: &[usize], row: usize, ty: KvType) -> Self {
        Self::from_layers(capacities.iter().map(|&c| LayerCache::new(c, row, ty)).collect(), row)
    }

    /// Records that positions `0..end` have been written.
    pub fn note_written(&mut self, end: usize) {
        self.high_water = self.high_water.max(end);
    }

    /// Bytes of keys and values written so far (what the cache has made resident): per layer,
    /// the positions written, at most its capacity.
    pub fn touched_bytes(&self) -> usize {
        self.layers.iter().map(|l| l.bytes() / l.capacity.max(1) * self.high_water.min(l.capacity)).sum()
    }

    /// Bytes held by the cache.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(LayerCache::bytes).sum()
    }
}
