//! Nearest-pattern index: an exact SIMD scan for small sets, HNSW (`instant-distance`) above a
//! threshold, and a small exact buffer for patterns added since the last HNSW build.
//!
//! `instant-distance` is build-once (no insert after build). So: every vector lives in one flat
//! array (the exact scan reads it); once there are more than `exact_max` vectors, an HNSW graph
//! covers the first `built` of them and a search asks the graph for the nearest `k` and scans the
//! rest (`built..n`) exactly, then merges. When that tail grows past `rebuild_after`, a rebuild of
//! the graph over everything starts (on a background thread when `background` is set; the old
//! graph plus the exact tail keep answering until the new graph is swapped in).

use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;

use instant_distance::{Builder, HnswMap, Point, Search};

use crate::simd::dot;

/// A vector as HNSW sees it. Distance is `1 - cos` (vectors are unit length).
#[derive(Clone, Debug)]
pub struct Pt(pub Arc<[f32]>);

impl Point for Pt {
    fn distance(&self, other: &Self) -> f32 {
        1.0 - dot(&self.0, &other.0)
    }
}

/// Tuning of the index.
#[derive(Debug, Clone)]
pub struct IndexConfig {
    /// At or below this many vectors every search is an exact scan and no graph is built.
    pub exact_max: usize,
    /// Rebuild the graph when this many vectors (or `n / 8`, whichever is larger) are not in it.
    pub rebuild_after: usize,
    /// HNSW candidate list size while searching.
    pub ef_search: usize,
    /// HNSW candidate list size while building.
    pub ef_construction: usize,
    /// Rebuild on a background thread (true) or inline (false; used by tests and benchmarks).
    pub background: bool,
}

impl Default for IndexConfig {
    fn default() -> Self {
        IndexConfig { exact_max: 1024, rebuild_after: 512, ef_search: 48, ef_construction: 64, background: true }
    }
}

struct Graph {
    map: HnswMap<Pt, u32>,
    /// Vectors `0..built` are in `map`.
    built: usize,
}

/// The index. Ids are insertion order (`0..len()`).
pub struct VectorIndex {
    dim: usize,
    data: Vec<f32>,
    cfg: IndexConfig,
    graph: Option<Graph>,
    pending: Option<Receiver<Graph>>,
    search: Search,
}

impl VectorIndex {
    pub fn new(dim: usize, cfg: IndexConfig) -> Self {
        VectorIndex { dim, data: Vec::new(), cfg, graph: None, pending: None, search: Search::default() }
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn len(&self) -> usize {
        self.data.len().checked_div(self.dim).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn config(&self) -> &IndexConfig {
        &self.cfg
    }

    /// Vector `id`.
    pub fn vector(&self, id: usize) -> &[f32] {
        &self.data[id * self.dim..(id + 1) * self.dim]
    }

    /// How many vectors the HNSW graph covers (0 when searches are exact scans).
    pub fn graph_len(&self) -> usize {
        self.graph.as_ref().map_or(0, |g| g.built)
    }

    /// Appends a vector (must have `dim()` entries) and returns its id.
    pub fn push(&mut self, v: &[f32]) -> usize {
        debug_assert_eq!(v.len(), self.dim);
        let id = self.len();
        self.data.extend(v.iter().copied().chain(std::iter::repeat(0.0)).take(self.dim));
        self.maintain();
        id
    }

    /// Appends many vectors, then decides about a rebuild once.
    pub fn extend<'a>(&mut self, vs: impl IntoIterator<Item = &'a [f32]>) {
        for v in vs {
            self.data.extend(v.iter().copied().chain(std::iter::repeat(0.0)).take(self.dim));
        }
        self.maintain();
    }

    /// Swaps in a finished background build and starts a new one when the exact tail is long.
    pub fn maintain(&mut self) {
        if let Some(rx) = &self.pending {
            match rx.try_recv() {
                Ok(g) => {
                    self.graph = Some(g);
                    self.pending = None;
                }
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Disconnected) => self.pending = None,
            }
        }
        let n = self.len();
        if n <= self.cfg.exact_max {
            return;
        }
        let tail = n - self.graph_len();
        if self.graph.is_some() && tail < self.cfg.rebuild_after.max(n / 8) {
            return;
        }
        self.rebuild();
    }

    /// Waits for a background build, if one is running.
    pub fn wait(&mut self) {
        if let Some(rx) = self.pending.take() {
            if let Ok(g) = rx.recv() {
                self.graph = Some(g);
            }
        }
    }

    fn rebuild(&mut self) {
        let n = self.len();
        let points: Vec<Pt> = (0..n).map(|i| Pt(Arc::from(self.vector(i)))).collect();
        let values: Vec<u32> = (0..n as u32).collect();
        let builder = Builder::default().ef_search(self.cfg.ef_search).ef_construction(self.cfg.ef_construction).seed(7);
        if self.cfg.background {
            let (tx, rx) = std::sync::mpsc::channel();
            let spawned = std::thread::Builder::new().name("ruvllm-hnsw-build".into()).spawn(move || {
                let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| builder.build(points, values)));
                if let Ok(map) = built {
                    let _ = tx.send(Graph { map, built: n });
                }
            });
            if spawned.is_ok() {
                self.pending = Some(rx);
            }
        } else {
            self.graph = Some(Graph { map: builder.build(points, values), built: n });
        }
    }

    /// The `k` nearest vectors to `q` as `(id, cosine)`, best first.
    pub fn search(&mut self, q: &[f32], k: usize) -> Vec<(usize, f32)> {
        self.maintain();
        let n = self.len();
        let mut top = TopK::new(k);
        let start = match &self.graph {
            Some(g) if n > self.cfg.exact_max => {
                let qp = Pt(Arc::from(q));
                for item in g.map.search(&qp, &mut self.search).take(k) {
                    top.push(*item.value as usize, 1.0 - item.distance);
                }
                g.built
            }
            _ => 0,
        };
        for id in start..n {
            top.push(id, dot(q, self.vector(id)));
        }
        top.into_sorted()
    }

    /// Exact k-NN over everything (the reference for recall measurements).
    pub fn search_exact(&self, q: &[f32], k: usize) -> Vec<(usize, f32)> {
        let mut top = TopK::new(k);
        for id in 0..self.len() {
            top.push(id, dot(q, self.vector(id)));
        }
        top.into_sorted()
    }
}

/// Keeps the `k` best `(id, score)` pairs, highest score first.
struct TopK {
    k: usize,
    items: Vec<(usize, f32)>,
}

impl TopK {
    fn new(k: usize) -> Self {
        TopK { k, items: Vec::with_capacity(k + 1) }
    }
    #[inline]
    fn push(&mut self, id: usize, s: f32) {
        if self.k == 0 || (self.items.len() == self.k && s <= self.items[self.k - 1].1) {
            return;
        }
        let pos = self.items.iter().position(|&(_, t)| s > t).unwrap_or(self.items.len());
        self.items.insert(pos, (id, s));
        self.items.truncate(self.k);
    }
    fn into_sorted(self) -> Vec<(usize, f32)> {
        self.items
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand_unit(seed: &mut u64, dim: usize) -> Vec<f32> {
        let v: Vec<f32> = (0..dim)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                (*seed % 10_000) as f32 / 5_000.0 - 1.0
            })
            .collect();
        ruvllm_embed::l2_normalized(v)
    }

    #[test]
    fn exact_and_hnsw_agree_on_top1() {
        let mut seed = 42u64;
        let cfg = IndexConfig { exact_max: 500, background: false, ..Default::default() };
        let mut idx = VectorIndex::new(32, cfg);
        let vs: Vec<Vec<f32>> = (0..2000).map(|_| rand_unit(&mut seed, 32)).collect();
        idx.extend(vs.iter().map(|v| v.as_slice()));
        assert_eq!(idx.graph_len(), 2000);
        for v in vs.iter().take(50) {
            let a = idx.search(v, 5);
            assert!(a[0].1 > 0.999);
            assert_eq!(a[0].0, idx.search_exact(v, 1)[0].0);
        }
        // New vectors land in the exact tail and are found at once.
        let extra = rand_unit(&mut seed, 32);
        let id = idx.push(&extra);
        assert_eq!(idx.search(&extra, 1)[0].0, id);
    }
}
