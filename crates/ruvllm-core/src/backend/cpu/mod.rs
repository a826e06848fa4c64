//! The CPU backend's kernels, laid out by level as ggml's `ggml-cpu/`: quantized weight
//! formats (`types`, `quant`), portable scalar references (`dot`, `vec`, `gemm::gemm_ref`), the
//! x86 SIMD variants under `arch/x86`, the table that picks them once (`dispatch`), and the
//! drivers the forward pass calls: matrix products on the thread pool (`matmul`), f32
//! elementwise ops (`ops`) and attention over the KV cache (`attention`). SIMD paths are chosen
//! at run time from [`crate::runtime::cpu`] (detection and the `RUVLLM_*` switches in one
//! place), never at compile time, so the portable binary we ship is fast on every x86-64 CPU.

mod types;
pub use types::GgmlType;

pub mod arch;
pub mod attention;
pub mod dispatch;
#[doc(hidden)]
pub mod dot;
pub mod flash;
#[doc(hidden)]
pub mod gemm;
pub mod matmul;
pub mod ops;
pub mod quant;
pub mod vec;

pub use matmul::{matmul, QWeight};
pub mod low_rank;

use super::{Activation, AttentionMask, AttnShape, Backend, Buf, BufWidths, HeadScreening, KvType, LayerCache, LowRankTerms, Memory, QkNorms, RopeTable, Span};
use crate::runtime::ThreadPool;

/// The CPU backend: this process's kernels on a thread pool, activation buffers in host memory,
/// allocated once by [`Memory::reserve`](crate::backend::Memory::reserve) (nothing is allocated per token).
pub struct CpuBackend {
    pool: ThreadPool,
    widths: BufWidths,
    max_batch: usize,
    bufs: [LineBuf; 9],
    /// The last LM head's logits (grown to the most rows asked for at once).
    logits: Vec<f32>,
    logits_len: usize,
    /// Attention scores of the split decode path, grown on use.
    att_scores: Vec<f32>,
}

/// A zeroed f32 buffer that starts on a 64-byte cache line. The kernels split a buffer's rows
/// and columns between threads at multiples of 16 floats, so no cache line is written by two
/// threads (with `Vec`'s 16-byte alignment every split shared one: at 2 threads on separate dies
/// decode attention's value sums, which update their columns of the output once per 16 key
/// rows, ran twice as slow).
#[derive(Default)]
struct LineBuf(Vec<Line>, usize);

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

impl LineBuf {
    /// `len` zeros.
    fn reset(&mut self, len: usize) {
        self.0.clear();
        self.0.resize(len.div_ceil(16), Line([0.0; 16]));
        self.1 = len;
    }
}

impl std::ops::Deref for LineBuf {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: `Line` is 16 f32s with no padding; `self.1 ≤ 16 · self.0.len()`.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr() as *const f32, self.1) }
    }
}

impl std::ops::DerefMut for LineBuf {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `deref`, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr() as *mut f32, self.1) }
    }
}

impl CpuBackend {
    /// A backend on `threads` threads (its own pool).
    pub fn new(threads: usize) -> Self {
        Self::with_pool(ThreadPool::new(threads))
    }

    pub fn with_pool(pool: ThreadPool) -> Self {
        let widths = BufWidths { d_model: 0, q_dim: 0, kv_dim: 0, ff_dim: 0, vocab_size: 0 };
        CpuBackend { pool, widths, max_batch: 0, bufs: Default::default(), logits: Vec::new(), logits_len: 0, att_scores: Vec::new() }
    }

    /// The thread pool the kernels run on.
    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }

    /// Overwrites the first rows of buffer `b` with `data` (op-level tests across backends).
    #[doc(hidden)]
    pub fn write_buf(&mut self, b: Buf, data: &[f32]) {
        self.bufs[b.index()][..data.len()].copy_from_slice(data);
    }

    /// The first `n` rows of buffer `b` (op-level tests across backends).
    #[doc(hidden)]
    pub fn read_buf(&mut self, b: Buf, n: usize) -> Vec<f32> {
        self.rows(b, n).to_vec()
    }

    /// The first `n` rows of `b`.
    fn rows(&self, b: Buf, n: usize) -> &[f32] {
        &self.bufs[b.index()][..n * self.widths.of(b)]
    }

    /// The first `n` rows of `src` to read and of each of `dsts` to write (`src` not among them).
    fn split<'s>(bufs: &'s mut [LineBuf; 9], widths: BufWidths, src: Buf, dsts: &[Buf], n: usize, out: &mut [&'s mut [f32]; 4]) -> &'s [f32] {
        assert!(dsts.len() <= out.len() && !dsts.contains(&src), "backend: bad buffer set");
        let mut input: &[f32] = &[];
        for (b, v) in Buf::ALL.into_iter().zip(bufs.iter_mut()) {
            let len = n * widths.of(b);
            if b == src {
                input = &v[..len];
            } else if let Some(k) = dsts.iter().position(|&d| d == b) {
                out[k] = &mut v[..len];
            }
        }
        input
    }

    /// `src` read and `dst` written, `n` rows each.
    fn pair(&mut self, src: Buf, dst: Buf, n: usize) -> (&[f32], &mut [f32]) {
        let mut out: [&mut [f32]; 4] = Default::default();
        let x = Self::split(&mut self.bufs, self.widths, src, &[dst], n, &mut out);
        let [y, ..] = out;
        (x, y)
    }

    /// The final norm of rows `rows` of `X` into the first `rows.len()` rows of `Xn` (what the
    /// LM head multiplies).
    fn norm_rows(&mut self, norm: &[f32], eps: f32, rows: &[usize]) {
        let d = self.widths.d_model;
        let (x, xn) = self.pair(Buf::X, Buf::Xn, self.max_batch);
        for (&r, out) in rows.iter().zip(xn.chunks_exact_mut(d)) {
            ops::rms_norm(&x[r * d..(r + 1) * d], norm, eps, out);
        }
    }

    fn buf_mut(&mut self, b: Buf, n: usize) -> &mut [f32] {
        let len = n * self.widths.of(b);
        &mut self.bufs[b.index()][..len]
    }
}

impl Memory for CpuBackend {
    fn describe(&self) -> String {
        format!("cpu ({}, {} threads)", matmul::isa(), self.pool.threads())
    }

    fn threads(&self) -> usize {
        self.pool.threads()
    }

    fn prepare_weight(&mut self, w: &QWeight) {
        w.prepare(&self.pool);
    }

    fn prepare_head(&mut self, w: &QWeight) {
        w.prepare_head(&self.pool);
    }

    fn reserve(&mut self, widths: BufWidths, max_batch: usize) {
        self.widths = widths;
        self.max_batch = max_batch;
        for (b, v) in Buf::ALL.into_iter().zip(self.bufs.iter_mut()) {
            v.reset(max_batch * widths.of(b));
        }
        self.logits.resize(widths.vocab_size, 0.0);
        self.logits_len = widths.vocab_size;
    }

    fn max_batch(&self) -> usize {
        self.max_batch
    }

    fn new_layer_cache(&self, capacity: usize, row: usize, ty: KvType) -> LayerCache {
        LayerCache::new(capacity, row, ty)
    }
}

impl Backend for CpuBackend {
    fn embed(&mut self, table: &QWeight, tokens: &[u32], scale: Option<f32>, replace: Option<(u32, &[f32])>) {
        let d = self.widths.d_model;
        let x = self.buf_mut(Buf::X, tokens.len());
        for (row, &tok) in x.chunks_exact_mut(d).zip(tokens) {
            match replace {
                Some((id, r)) if id == tok && r.len() == d => row.copy_from_slice(r),
                _ => table.dequantize_row(tok as usize, row),
            }
            if let Some(scale) = scale {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
    }

    fn rms_norm(&mut self, src: Buf, dst: Buf, w: &[f32], eps: f32, n: usize) {
        if src == dst {
            ops::rms_norm_chunks_inplace(self.buf_mut(src, n), w, eps);
        } else {
            let (x, y) = self.pair(src, dst, n);
            for (row, out) in x.chunks_exact(w.len()).zip(y.chunks_exact_mut(w.len())) {
                ops::rms_norm(row, w, eps, out);
            }
        }
    }

    fn matmul(&mut self, w: &QWeight, src: Buf, dst: Buf, n: usize) {
        let mut out: [&mut [f32]; 4] = Default::default();
        let x = Self::split(&mut self.bufs, self.widths, src, &[dst], n, &mut out);
        matmul::matmul(&self.pool, w, x, n, out[0]);
    }

    fn matmul_fused(&mut self, ws: &[&QWeight], src: Buf, dsts: &[Buf], n: usize) {
        let mut out: [&mut [f32]; 4] = Default::default();
        let x = Self::split(&mut self.bufs, self.widths, src, dsts, n, &mut out);
        matmul::matmul_fused(&self.pool, ws, x, n, &mut out[..dsts.len()]);
    }

    fn add_bias(&mut self, dst: Buf, bias: &[f32], n: usize) {
        for row in self.buf_mut(dst, n).chunks_exact_mut(bias.len()) {
            ops::add_inplace(row, bias);
        }
    }

    fn add_low_rank(&mut self, terms: &LowRankTerms, src: Buf, dsts: &[Buf], n: usize) {
        if terms.is_empty() {
            return;
        }
        let mut out: [&mut [f32]; 4] = Default::default();
        let x = Self::split(&mut self.bufs, self.widths, src, dsts, n, &mut out);
        low_rank::add(&self.pool, terms, x, n, &mut out[..dsts.len()]);
    }

    fn rope(&mut self, table: &RopeTable, buf: Buf, head_dim: usize, pos0: usize, n: usize) {
        let w = self.widths.of(buf);
        for (t, row) in self.buf_mut(buf, n).chunks_exact_mut(w).enumerate() {
            table.apply(row, head_dim, pos0 + t);
        }
    }

    fn store_kv(&mut self, cache: &mut LayerCache, pos0: usize, n: usize) {
        let kv = self.widths.kv_dim;
        let (k, v) = (self.rows(Buf::K, n), self.rows(Buf::V, n));
        for t in 0..n {
            cache.store(pos0 + t, &k[t * kv..(t + 1) * kv], &v[t * kv..(t + 1) * kv]);
        }
    }

    fn attention(&mut self, cache: &LayerCache, shape: AttnShape, mask: AttentionMask, window: Option<usize>, pos0: usize, n: usize) {
        let mut out: [&mut [f32]; 4] = Default::default();
        let q = Self::split(&mut self.bufs, self.widths, Buf::Q, &[Buf::Attn], n, &mut out);
        let [attn, ..] = out;
        let span = attention::Span { mask, window };
        attention::run(attention::Call { pool: &self.pool, cache, q, attn, scores: &mut self.att_scores, shape, span, pos0, n });
    }

    fn runs_segments(&self) -> bool {
        true
    }

    fn segment_attention(
        &mut self,
        norms: QkNorms,
        rope: &RopeTable,
        cache: &mut LayerCache,
        shape: AttnShape,
        span: Span,
        row0: usize,
        pos0: usize,
        n: usize,
    ) {
        let (qd, kd, hd) = (self.widths.q_dim, self.widths.kv_dim, shape.head_dim);
        // Buffers in `Buf` order: X, Xn, Q, K, V, Attn, ...
        let [_, _, q, k, v, attn, ..] = &mut self.bufs;
        let q = &mut q[row0 * qd..(row0 + n) * qd];
        let k = &mut k[row0 * kd..(row0 + n) * kd];
        let v = &v[row0 * kd..(row0 + n) * kd];
        if let Some(w) = norms.q {
            ops::rms_norm_chunks_inplace(q, w, norms.eps);
        }
        if let Some(w) = norms.k {
            ops::rms_norm_chunks_inplace(k, w, norms.eps);
        }
        for t in 0..n {
            rope.apply(&mut q[t * qd..(t + 1) * qd], hd, pos0 + t);
            rope.apply(&mut k[t * kd..(t + 1) * kd], hd, pos0 + t);
            cache.store(pos0 + t, &k[t * kd..(t + 1) * kd], &v[t * kd..(t + 1) * kd]);
        }
        let attn = &mut attn[row0 * qd..(row0 + n) * qd];
        attention::run(attention::Call { pool: &self.pool, cache, q, attn, scores: &mut self.att_scores, shape, span, pos0, n });
    }

    fn add(&mut self, dst: Buf, src: Buf, n: usize) {
        let w = self.widths.of(dst);
        let (x, y) = self.pair(src, dst, n);
        for (a, b) in y.chunks_exact_mut(w).zip(x.chunks_exact(w)) {
            ops::add_inplace(a, b);
        }
    }

    fn gated_activation(&mut self, act: Activation, n: usize) {
        let (up, gate) = self.pair(Buf::Up, Buf::Gate, n);
        match act {
            Activation::GeluTanh => ops::gelu_tanh_mul(gate, up),
            Activation::Silu => ops::silu_mul(gate, up),
        }
    }

    fn lm_head(&mut self, output: &QWeight, norm: &[f32], eps: f32, softcap: Option<f32>, rows: &[usize]) -> &mut [f32] {
        let (d, v, m) = (self.widths.d_model, self.widths.vocab_size, rows.len());
        self.norm_rows(norm, eps, rows);
        if self.logits.len() < m * v {
            self.logits.resize(m * v, 0.0);
        }
        let xn = &self.bufs[Buf::Xn.index()][..m * d];
        let logits = &mut self.logits[..m * v];
        matmul::matmul(&self.pool, output, xn, m, logits);
        if let Some(cap) = softcap {
            logits.iter_mut().for_each(|v| *v = (*v / cap).tanh() * cap);
        }
        self.logits_len = m * v;
        logits
    }

    fn final_hidden(&mut self, norm: &[f32], eps: f32, n: usize) -> &[f32] {
        self.rms_norm(Buf::X, Buf::Xn, norm, eps, n);
        self.rows(Buf::Xn, n)
    }

    fn logits(&mut self) -> &mut [f32] {
        &mut self.logits[..self.logits_len]
    }

    fn screening(&mut self) -> Option<&mut dyn HeadScreening> {
        Some(self)
    }
}

impl HeadScreening for CpuBackend {
    fn lm_head_argmax(&mut self, output: &QWeight, norm: &[f32], eps: f32, softcap: Option<f32>, row: usize) -> Option<u32> {
        // Soft-capping is monotone, but in floats it can make near logits equal and so change
        // which one a tie gives: left to the full head.
        if softcap.is_some() {
            return None;
        }
        let d = self.widths.d_model;
        self.norm_rows(norm, eps, &[row]);
        let xn = &self.bufs[Buf::Xn.index()][..d];
        let id = matmul::head_argmax(&self.pool, output, xn)?;
        // The logits are unspecified now: make sure nothing reads stale ones as this token's.
        self.logits_len = 0;
        Some(id)
    }
}
