//! The adapter bank: snapshots of the learned adapter, each stored with the mean embedding of the
//! prompts it was trained on, in a vector index (HNSW above a few dozen entries, exact below). A
//! request with `adapters: 'auto'` runs the adapter nearest to its prompt (RAMoLE-style
//! retrieval of LoRA experts).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ruvllm_core::models::TransformerConfig;
use ruvllm_core::nn::LoraAdapter;
use ruvllm_router::index::{IndexConfig, VectorIndex};
use serde::{Deserialize, Serialize};

use crate::grad::LoraParams;
use crate::store::{params_bytes, params_from_bytes, read_optional, write_atomic};
use crate::{Error, Result};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BankEntry {
    pub id: u64,
    pub file: String,
    /// Unit-length mean embedding of the prompts the snapshot learned from.
    pub embedding: Vec<f32>,
    pub trajectories: usize,
    pub created: u64,
}

pub struct Bank {
    dir: PathBuf,
    pub entries: Vec<BankEntry>,
    index: Option<VectorIndex>,
    /// Loaded adapters by entry position.
    loaded: Vec<Option<Arc<LoraAdapter>>>,
}

fn index_config() -> IndexConfig {
    IndexConfig { exact_max: 32, rebuild_after: 16, background: false, ..IndexConfig::default() }
}

impl Bank {
    pub fn open(dir: &Path) -> Result<Bank> {
        let path = dir.join("bank.json");
        let entries: Vec<BankEntry> = match read_optional(&path)? {
            Some(b) => serde_json::from_slice(&b).map_err(|e| Error::corrupt(&path, e.to_string()))?,
            None => Vec::new(),
        };
        let mut bank = Bank { dir: dir.to_path_buf(), loaded: vec![None; entries.len()], entries: Vec::new(), index: None };
        for e in entries {
            bank.index_push(&e.embedding);
            bank.entries.push(e);
        }
        Ok(bank)
    }

    fn index_push(&mut self, v: &[f32]) {
        let idx = self.index.get_or_insert_with(|| VectorIndex::new(v.len(), index_config()));
        if idx.dim() == v.len() {
            idx.push(v);
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Stores a snapshot of `p` with `embedding` (normalised here); returns its id.
    pub fn add(&mut self, p: &LoraParams, mut embedding: Vec<f32>, trajectories: usize, now: u64) -> Result<u64> {
        let norm = embedding.iter().map(|v| v * v).sum::<f32>().sqrt();
        if !(norm > 0.0 && norm.is_finite()) {
            return Err(Error::Internal("bank embedding has zero norm".into()));
        }
        embedding.iter_mut().for_each(|v| *v /= norm);
        let id = self.entries.iter().map(|e| e.id + 1).max().unwrap_or(1);
        let sub = self.dir.join("bank");
        std::fs::create_dir_all(&sub).map_err(|e| Error::io(&sub, e))?;
        let file = format!("bank/{id}.bin");
        write_atomic(&self.dir.join(&file), &params_bytes(p, None))?;
        let entry = BankEntry { id, file, embedding, trajectories, created: now };
        let mut all = self.entries.clone();
        all.push(entry.clone());
        write_atomic(&self.dir.join("bank.json"), &serde_json::to_vec_pretty(&all).map_err(|e| Error::Internal(e.to_string()))?)?;
        self.index_push(&entry.embedding);
        self.entries.push(entry);
        self.loaded.push(None);
        Ok(id)
    }

    /// The `k` entries nearest to `q` (unit length) as (entry position, cosine).
    pub fn nearest(&mut self, q: &[f32], k: usize) -> Vec<(usize, f32)> {
        match &mut self.index {
            Some(idx) if idx.dim() == q.len() => idx.search(q, k),
            _ => Vec::new(),
        }
    }

    /// The runtime adapter of entry `i` (loaded on first use).
    pub fn adapter(&mut self, i: usize, cfg: &TransformerConfig) -> Result<Arc<LoraAdapter>> {
        if let Some(a) = &self.loaded[i] {
            return Ok(a.clone());
        }
        let path = self.dir.join(&self.entries[i].file);
        let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        let (p, _) = params_from_bytes(&path, &bytes, cfg.n_layer, |pr| Some(pr.shape(cfg)))?;
        let a = crate::export::to_adapter(&p, cfg, &path)?;
        self.loaded[i] = Some(a.clone());
        Ok(a)
    }
}
