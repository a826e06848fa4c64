//! Quantized matrix products. OWNER: kernels helper.

use std::sync::Arc;

use super::GgmlType;
use crate::gguf::Storage;

/// Where a weight's bytes live: a range of the memory-mapped file (no copy) or owned bytes.
#[derive(Clone)]
pub enum WeightData {
    Mapped { storage: Arc<Storage>, offset: usize, len: usize },
    Owned(Arc<Vec<u8>>),
}

/// A 2-D weight `rows × cols` in any supported format, row-major in ggml order: each of the
/// `rows` output features is a contiguous row of `cols` input weights (ggml dims = [cols, rows]).
#[derive(Clone)]
pub struct QWeight {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: WeightData,
}

impl QWeight {
    /// Validates that the byte length matches `rows × cols` of `ty` and `cols` is a multiple of
    /// the block size; returns a description of the problem otherwise.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: WeightData) -> Result<Self, String> { todo!() }
    pub fn bytes(&self) -> &[u8] { todo!() }
    pub fn row_bytes(&self, r: usize) -> &[u8] { todo!() }
    /// Dequantizes row `r` into `out` (len `cols`): the quantized embedding gather.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) { todo!() }
}

/// A fixed pool of worker threads, created once per model (no per-op spawning).
pub struct ThreadPool { /* helper decides */ }

impl ThreadPool {
    /// `n` threads in all, the calling thread included.
    pub fn new(n: usize) -> Self { todo!() }
    pub fn threads(&self) -> usize { todo!() }
    /// Runs `f(i)` for i in 0..n_tasks across the pool, returning when all are done.
    pub fn for_each(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) { todo!() }
}

/// `y[t][r] = sum_c w[r][c] * x[t][c]` for `t in 0..n` tokens: `x` is `n × w.cols`, `y` is
/// `n × w.rows` (row-major). Activations are quantized to 8 bits as ggml does (Q8_0 for the
/// 32-blocks, Q8_K for the K-quants); F32/F16/BF16 weights use f32 dots.
pub fn matmul(pool: &ThreadPool, w: &QWeight, x: &[f32], n: usize, y: &mut [f32]) { todo!() }
