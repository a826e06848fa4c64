//! Quantized matrix products.
//!
//! `matmul` quantizes the activations once per call (Q8_0/Q8_1-style [`BlockQ8`] for the
//! 32-element formats, [`BlockQ8K`] for the K-quants; float formats keep f32), then splits the
//! weight rows over a [`ThreadPool`]. With several tokens (prefill) each task walks its rows in
//! small tiles and, per tile, loops over all tokens, so the tile's weight bytes are read from
//! memory once and reused from L1.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::dispatch::kernels;
use super::dot::{self, DotKernel, Kernels};
use super::gemm;
use super::quant::{self, BlockQ8, BlockQ8K, QK, QK_K};
use super::GgmlType;
use crate::gguf::Storage;
use crate::runtime::mem::HugeBuf;
use crate::runtime::{SharedMut, ThreadPool};

/// Where a weight's bytes live: a range of the memory-mapped file (no copy), owned bytes, or a
/// copy on huge pages ([`QWeight::to_huge`]).
#[derive(Clone)]
pub enum WeightData {
    Mapped { storage: Arc<Storage>, offset: usize, len: usize },
    Owned(Arc<Vec<u8>>),
    Huge(Arc<HugeBuf>),
}

/// A 2-D weight `rows × cols` in any supported format, row-major in ggml order: each of the
/// `rows` output features is a contiguous row of `cols` input weights (ggml dims = [cols, rows]).
#[derive(Clone)]
pub struct QWeight {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: WeightData,
    /// The prefill GEMM's packed copy, made on first use (shared by clones).
    packed: Arc<OnceLock<Option<gemm::Packed>>>,
    /// An LM head's screening copy for exact greedy decoding ([`head_argmax`]), made on first
    /// use (shared by clones).
    screen: Arc<OnceLock<Option<gemm::Packed>>>,
}

impl QWeight {
    /// Validates that the byte length matches `rows × cols` of `ty` and `cols` is a multiple of
    /// the block size; returns a description of the problem otherwise.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: WeightData) -> Result<Self, String> {
        if !ty.is_supported_weight() {
            return Err(format!("weight type {} is not supported by the kernels", ty.name()));
        }
        let bs = ty.block_size();
        if !cols.is_multiple_of(bs) {
            return Err(format!("{} weight: {cols} columns is not a multiple of the block size {bs}", ty.name()));
        }
        let need = (rows as u64)
            .checked_mul(cols as u64)
            .and_then(|n| ty.bytes_for(n))
            .ok_or_else(|| format!("{} weight {rows}×{cols}: size overflows", ty.name()))?;
        let len = match &data {
            WeightData::Mapped { storage, offset, len } => {
                let end = offset.checked_add(*len).ok_or_else(|| "weight range overflows".to_string())?;
                if end > storage.len() {
                    return Err(format!("{} weight {rows}×{cols}: bytes {offset}..{end} lie outside the {}-byte file", ty.name(), storage.len()));
                }
                *len
            }
            WeightData::Owned(v) => v.len(),
            WeightData::Huge(v) => v.len(),
        };
        if len as u64 != need {
            return Err(format!("{} weight {rows}×{cols}: expected {need} bytes, got {len}", ty.name()));
        }
        Ok(Self { ty, rows, cols, data, packed: Arc::default(), screen: Arc::default() })
    }

    /// All the weight's bytes (`rows × row_size()`).
    pub fn bytes(&self) -> &[u8] {
        match &self.data {
            WeightData::Mapped { storage, offset, len } => &storage[*offset..*offset + *len],
            WeightData::Owned(v) => v,
            WeightData::Huge(v) => v,
        }
    }

    /// The same weight with its bytes copied onto huge pages (see [`super::mem`]): for a large
    /// weight that decode streams as it is, unpacked (the LM head). A file-mapped weight's pages
    /// are released as the copy proceeds, so resident memory never holds both copies.
    pub fn to_huge(&self) -> QWeight {
        let src = self.bytes();
        let mut buf = HugeBuf::new(src.len());
        const STEP: usize = 8 << 20;
        for at in (0..src.len()).step_by(STEP) {
            let end = (at + STEP).min(src.len());
            buf[at..end].copy_from_slice(&src[at..end]);
            self.release(at, end - at);
        }
        QWeight { data: WeightData::Huge(Arc::new(buf)), packed: Arc::default(), screen: Arc::default(), ..*self }
    }

    /// Bytes of one row.
    pub fn row_size(&self) -> usize {
        self.cols / self.ty.block_size() * self.ty.type_size()
    }

    /// The bytes of row `r` (panics if `r >= rows`).
    pub fn row_bytes(&self, r: usize) -> &[u8] {
        assert!(r < self.rows, "row {r} out of range ({} rows)", self.rows);
        let rs = self.row_size();
        &self.bytes()[r * rs..(r + 1) * rs]
    }

    /// The packed tiles for the tile GEMM: packed on `pool` on first use, or earlier by
    /// [`Self::prepare`]. `None` for types without a packed format, and, unless `prepare` packed
    /// it, for weights with more than [`gemm::PACK_MAX_ROWS`] rows.
    pub fn packed(&self, pool: &ThreadPool) -> Option<&gemm::Packed> {
        if let Some(p) = self.packed.get() {
            return p.as_ref();
        }
        if gemm::PackKind::for_type(self.ty).is_none() || self.rows > gemm::PACK_MAX_ROWS {
            return None;
        }
        self.pack(pool, false, false)
    }

    /// Packs (once); with `release`, a file-mapped weight's pages are released chunk by chunk as
    /// they are packed, so resident memory never holds the whole weight twice; with `compact`,
    /// into the type's compact tile format where it has one ([`gemm::PackKind::compact`]).
    fn pack(&self, pool: &ThreadPool, release: bool, compact: bool) -> Option<&gemm::Packed> {
        let nb = self.cols / self.ty.block_size();
        let done = |at: usize, len: usize| {
            if release {
                self.release(at, len);
            }
        };
        self.packed
            .get_or_init(|| {
                let kind = gemm::PackKind::for_type(self.ty)?;
                // The compact format, unless the weight does not fit it (Q8_0 with a quant −128,
                // which ggml's quantizer never writes): then the standard one.
                let packed = compact.then(|| gemm::Packed::new_as(pool, kind.compact(), self.ty, self.bytes(), self.rows, nb, &done)).flatten();
                packed.or_else(|| gemm::Packed::new_as(pool, kind, self.ty, self.bytes(), self.rows, nb, &done))
            })
            .as_ref()
    }

    /// Whether [`Self::prepare`] packs this weight: this CPU has the tile GEMM and the type a
    /// packed format.
    pub fn packs(&self) -> bool {
        kernels().gemm.is_some() && gemm::PackKind::for_type(self.ty).is_some()
    }

    /// Packs the weight for the tile GEMM now (at model load; any size, the LM head included)
    /// where [`Self::packs`].
    pub fn prepare(&self, pool: &ThreadPool) {
        self.prepare_as(pool, false)
    }

    /// [`Self::prepare`] for an LM head: Q8_0 is packed into the compact tiles (f16 scales, the
    /// file's 34 bytes per block and row instead of 36), which decode reads whole for every
    /// token; the results are the same bits. Other types are packed as `prepare` packs them.
    /// Where greedy decoding screens this head ([`head_argmax`]), its screening copy is made
    /// now too: made at the first greedy token instead, inside a Node process, its 126 MB
    /// (Gemma 3) often did not get huge pages until the kernel's background collapse, and that
    /// first generation decoded at 110–115 tok/s instead of 150–160 (1 thread, AVX2).
    pub fn prepare_head(&self, pool: &ThreadPool) {
        self.prepare_as(pool, true);
        if super::dispatch::screen_kernel().is_some() {
            if let Some(head) = self.packed.get().and_then(|p| p.as_ref()) {
                self.screen.get_or_init(|| gemm::Packed::screen_of(pool, head));
            }
        }
    }

    fn prepare_as(&self, pool: &ThreadPool, compact: bool) {
        if self.packs() && self.pack(pool, true, compact).is_some() {
            // Every matmul with this weight now reads the packed copy: let the file's pages
            // leave memory (they are read back from the file if anything touches them). `pack`
            // released them already unless the weight had been packed on first use before.
            self.release(0, self.bytes().len());
        }
    }

    /// Lets the file's pages of bytes `at..at + len` of a file-mapped weight leave memory
    /// ([`Storage::release`]); nothing for weights held in memory.
    fn release(&self, at: usize, len: usize) {
        if let WeightData::Mapped { storage, offset, .. } = &self.data {
            storage.release(offset + at, len);
        }
    }

    /// Dequantizes row `r` into `out` (len `cols`): the quantized embedding gather.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        debug_assert_eq!(out.len(), self.cols);
        quant::dequantize(self.ty, self.row_bytes(r), &mut out[..self.cols]);
    }
}

/// A dot product of one weight row with four activation rows.
type Dot4<A> = unsafe fn(&[u8], [&[A]; 4]) -> [f32; 4];

// ---------------------------------------------------------------------------------------------
// matmul
// ---------------------------------------------------------------------------------------------

thread_local! {
    static SCRATCH_Q8: RefCell<Vec<BlockQ8>> = const { RefCell::new(Vec::new()) };
    static SCRATCH_Q8K: RefCell<Vec<BlockQ8K>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with a scratch slice of `len` blocks from the thread's reusable buffer (a fresh one
/// if that is already in use, e.g. a nested call).
fn with_scratch<T: Default + Clone, R>(key: &'static std::thread::LocalKey<RefCell<Vec<T>>>, len: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut v) => {
            if v.len() < len {
                v.resize(len, T::default());
            }
            f(&mut v[..len])
        }
        Err(_) => f(&mut vec![T::default(); len]),
    })
}

/// `y[t][r] = sum_c w[r][c] * x[t][c]` for `t in 0..n` tokens: `x` is `n × w.cols`, `y` is
/// `n × w.rows` (row-major). Activations are quantized to 8 bits as ggml does (Q8_0 for the
/// 32-blocks, Q8_K for the K-quants); F32/F16/BF16 weights use f32 dots.
///
/// Panics if `x` or `y` is too short for `n` tokens.
pub fn matmul(pool: &ThreadPool, w: &QWeight, x: &[f32], n: usize, y: &mut [f32]) {
    matmul_with(pool, w, x, n, y, kernels());
}

/// [`matmul`] with the scalar reference kernels, for tests and benchmarks.
#[doc(hidden)]
pub fn matmul_scalar(pool: &ThreadPool, w: &QWeight, x: &[f32], n: usize, y: &mut [f32]) {
    matmul_with(pool, w, x, n, y, &dot::SCALAR);
}

/// Name of the instruction set `matmul` uses on this CPU ("avx2" or "scalar").
pub fn isa() -> &'static str {
    kernels().isa
}

/// [`matmul`] with an explicit kernel set.
#[doc(hidden)]
pub fn matmul_with(pool: &ThreadPool, w: &QWeight, x: &[f32], n: usize, y: &mut [f32], k: &Kernels) {
    let (rows, cols) = (w.rows, w.cols);
    assert!(x.len() >= n * cols, "matmul: x has {} values, need {n}×{cols}", x.len());
    assert!(y.len() >= n * rows, "matmul: y has {} values, need {n}×{rows}", y.len());
    if n == 0 || rows == 0 {
        return;
    }
    if cols == 0 {
        y[..n * rows].fill(0.0);
        return;
    }
    let data = w.bytes();
    let rs = w.row_size();
    let x = &x[..n * cols];
    let y = &mut y[..n * rows];
    // `QWeight::new` only accepts supported types.
    let Some(kernel) = k.for_type(w.ty) else { panic!("matmul: unsupported weight type {}", w.ty.name()) };
    match kernel {
        DotKernel::Q8(f) => {
            let nb = cols / QK;
            with_scratch(&SCRATCH_Q8, n * nb, |act| {
                quantize_acts(pool, x, n, cols, act, quant::quantize_act_q8);
                // Packed weights take the tile GEMM for any number of tokens, so a token's result
                // does not depend on how tokens are batched (prefill, decode, prefix reuse).
                let packed = tile_kernels(k).and_then(|g| w.packed(pool).map(|p| (g, p)));
                if let Some((g, p)) = packed {
                    run_tiles(pool, g, &[p], n, act, &[], &[SharedMut(y.as_mut_ptr())]);
                } else if n >= REPACK_MIN_TOKENS && matches!(w.ty, GgmlType::Q4_0 | GgmlType::Q5_0) {
                    run_repacked(pool, w.ty, data, rs, rows, n, act, nb, k.q8_0, k.q8_0_x4, y);
                } else {
                    let x4 = (w.ty == GgmlType::Q8_0).then_some(k.q8_0_x4);
                    run(pool, data, rs, rows, n, act, nb, f, x4, y);
                }
            })
        }
        DotKernel::Q8K(f) => {
            let nb = cols / QK_K;
            with_scratch(&SCRATCH_Q8K, n * nb, |act| {
                quantize_acts(pool, x, n, cols, act, quant::quantize_act_q8k);
                if let Some(g) = tile_kernels(k) {
                    if let Some(p) = w.packed(pool) {
                        return run_tiles(pool, g, &[p], n, &[], act, &[SharedMut(y.as_mut_ptr())]);
                    }
                }
                let x4 = match w.ty {
                    GgmlType::Q4_K => Some(k.q4_k_x4),
                    GgmlType::Q6_K => Some(k.q6_k_x4),
                    _ => None,
                };
                run(pool, data, rs, rows, n, act, nb, f, x4, y);
            })
        }
        DotKernel::F32(f) => run(pool, data, rs, rows, n, x, cols, f, None, y),
    }
}

/// Rows of the LM head scored exactly by the last [`head_argmax`] in this process (the
/// screening's candidates, counted by whole tiles): so tests and benchmarks can see what
/// screening left.
pub static SCREENED_ROWS: AtomicU64 = AtomicU64::new(0);

/// The greedy token of `w · x` for one token `x` (the largest non-NaN product, the lowest row
/// on ties: what `sampling::argmax` picks from [`matmul`]'s output), found without computing
/// every product, or `None` where this path has no screening (then compute the logits).
///
/// For a Q8_0 LM head packed compact ([`QWeight::prepare_head`]) on a CPU with the screening
/// kernel (`dispatch::screen_kernel`), every row is first scored from a copy that keeps the top
/// five bits of each quant ([`gemm::Packed::screen_of`], made by [`QWeight::prepare_head`] or the first call: 22 of the
/// file's 34 bytes per block and row, plus the tiles' f32 scales: 24). The low three bits
/// `l ∈ 0..=7` of a quant add `d·d_a·Σ l·a` to a row's block, which lies between
/// `7·d·d_a·Σ_{a<0} a` and `7·d·d_a·Σ_{a>0} a`: the kernel sums both ends with the row's own
/// block scales, giving each row an interval that holds its exact product, widened by a bound on
/// the float rounding of both kernels (`γ_{nb+4}`, the standard bound for `nb` fused
/// multiply-adds, times the products' magnitudes, twice over). Only the rows whose upper end
/// reaches the greatest lower end can be the largest; their tiles are multiplied by the same
/// tile kernel [`matmul`] runs, so their products are the same bits, and the pick among them is
/// the pick among all rows. For Gemma 3 270M a token reads 126 MB of screening tiles and a few
/// candidate tiles instead of the 178 MB head.
pub fn head_argmax(pool: &ThreadPool, w: &QWeight, x: &[f32]) -> Option<u32> {
    let (screen, g) = (super::dispatch::screen_kernel()?, tile_kernels(kernels())?.0);
    if w.ty != GgmlType::Q8_0 || x.len() != w.cols || w.rows > u32::MAX as usize || !x.iter().all(|v| v.is_finite()) {
        return None;
    }
    let head = w.packed.get()?.as_ref().filter(|p| p.kind == gemm::PackKind::Q8H)?;
    let nb = w.cols / QK;
    let sp = w.screen.get_or_init(|| gemm::Packed::screen_of(pool, head)).as_ref()?;
    with_scratch(&SCRATCH_Q8, nb, |act| {
        quant::quantize_act_q8(x, act);
        let c = screen_consts(act);
        let e = screen_margin(nb);
        let tiles = sp.tiles();
        let parts = pool.threads().min(tiles);
        let chunk = (STEAL_CHUNK_BYTES / sp.tile_bytes().max(1)).max(1);
        // Per task: the greatest lower bound it saw, and the rows whose upper bound reached
        // the greatest lower bound seen so far (a superset of the final candidates).
        let found: Vec<std::sync::Mutex<Found>> = (0..parts).map(|_| std::sync::Mutex::new((f32::NEG_INFINITY, Vec::new()))).collect();
        let run = |i: usize, a: usize, b: usize| {
            let mut f = found[i].lock().unwrap_or_else(|p| p.into_inner());
            let (mut lo, mut hi) = ([0f32; gemm::TILE_ROWS], [0f32; gemm::TILE_ROWS]);
            for t in a..b {
                let (r0, nrows) = (t * gemm::TILE_ROWS, sp.tile_rows(t));
                // SAFETY: `screen` is this CPU's screening kernel, which checks the lengths; the
                // outputs hold 16 values.
                unsafe { screen(sp.tile(t), nb, act, &c, e, lo.as_mut_ptr(), hi.as_mut_ptr(), nrows) };
                for &l in &lo[..nrows] {
                    f.0 = if l > f.0 { l } else { f.0 };
                }
                let best = f.0;
                for (j, &u) in hi[..nrows].iter().enumerate() {
                    if u >= best {
                        f.1.push(((r0 + j) as u32, u));
                    }
                }
            }
        };
        for_each_claimed(pool, tiles, chunk, &run);
        let found: Vec<Found> = found.into_iter().map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner())).collect();
        let t = found.iter().fold(f32::NEG_INFINITY, |m, f| if f.0 > m { f.0 } else { m });
        if !t.is_finite() {
            return None;
        }
        // Branch and bound: the candidates by upper bound, highest first, each tile multiplied
        // exactly once; once a candidate's upper bound is below the best exact product so far,
        // neither it nor any later one can win or tie.
        let mut cand: Vec<(u32, f32)> = found.iter().flat_map(|f| f.1.iter().copied().filter(|c| c.1 >= t)).collect();
        cand.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let (mut best, mut pick) = (f32::NEG_INFINITY, None::<u32>);
        let mut done: Vec<(usize, [f32; gemm::TILE_ROWS])> = Vec::new();
        let mut scored = 0;
        for &(r, upper) in &cand {
            if upper < best {
                break;
            }
            let ti = r as usize / gemm::TILE_ROWS;
            let at = match done.iter().position(|d| d.0 == ti) {
                Some(at) => at,
                None => {
                    let (mut out, nrows) = ([0f32; gemm::TILE_ROWS], head.tile_rows(ti));
                    // SAFETY: as in `run_tiles` (one token, 16 outputs).
                    unsafe { g(head.kind, head.tile(ti), nb, act, 1, out.as_mut_ptr(), gemm::TILE_ROWS, nrows) };
                    scored += nrows;
                    done.push((ti, out));
                    done.len() - 1
                }
            };
            let v = done[at].1[r as usize % gemm::TILE_ROWS];
            if v > best || (v == best && pick.is_some_and(|p| r < p)) {
                (best, pick) = (v, Some(r));
            }
        }
        SCREENED_ROWS.store(scored as u64, Ordering::Relaxed);
        pick.filter(|_| best.is_finite())
    })
}

/// A screening task's greatest lower bound and its rows `(row, upper bound)` that reached the
/// greatest lower bound seen before them.
type Found = (f32, Vec<(u32, f32)>);

/// Per block of the quantized activation: the low bits' least and greatest contribution over
/// the screening scale's 8 (`7·Σ_{a<0} a / 8`, `7·Σ_{a>0} a / 8`) and `Σ|a| / 8`, exact in f32.
fn screen_consts(act: &[BlockQ8]) -> Vec<[f32; 3]> {
    act.iter()
        .map(|ab| {
            let (mut neg, mut pos) = (0i32, 0i32);
            for &a in &ab.qs {
                if a < 0 {
                    neg += a as i32;
                } else {
                    pos += a as i32;
                }
            }
            [7.0 * neg as f32 / 8.0, 7.0 * pos as f32 / 8.0, (pos - neg) as f32 / 8.0]
        })
        .collect()
}

/// The rounding margin per unit of the screening's magnitude sum `Σ_b p_b·Σ|a_b|` (`p_b` the
/// block's scale product): the exact kernel's products (|q| ≤ 127), the screening's (|q >> 3| ≤
/// 16, times 8) and the low-bit bounds (7) each carry at most `γ_{nb+4}` of their magnitudes,
/// `(127 + 128 + 7)·γ`, doubled for the magnitude's own rounding and the last additions.
fn screen_margin(nb: usize) -> f32 {
    let nu = (nb + 4) as f64 * f64::powi(2.0, -24);
    (2.0 * 262.0 * nu / (1.0 - nu)) as f32
}

/// The screening bounds of every row (lower, upper) for one token, as [`head_argmax`] computes
/// them; `None` where it would not screen. For tests.
#[doc(hidden)]
pub fn head_bounds(pool: &ThreadPool, w: &QWeight, x: &[f32]) -> Option<(Vec<f32>, Vec<f32>)> {
    let screen = super::dispatch::screen_kernel()?;
    head_argmax(pool, w, x)?;
    let sp = w.screen.get()?.as_ref()?;
    let nb = w.cols / QK;
    let mut act = vec![BlockQ8::default(); nb];
    quant::quantize_act_q8(x, &mut act);
    let c = screen_consts(&act);
    let (mut lo, mut hi) = (vec![0f32; sp.tiles() * gemm::TILE_ROWS], vec![0f32; sp.tiles() * gemm::TILE_ROWS]);
    for t in 0..sp.tiles() {
        let nrows = sp.tile_rows(t);
        // SAFETY: as in `head_argmax`.
        unsafe {
            screen(sp.tile(t), nb, &act, &c, screen_margin(nb), lo.as_mut_ptr().add(t * gemm::TILE_ROWS), hi.as_mut_ptr().add(t * gemm::TILE_ROWS), nrows)
        };
    }
    lo.truncate(sp.rows);
    hi.truncate(sp.rows);
    Some((lo, hi))
}

/// Several products of the same input: `ys[i] = ws[i] · x` for `n` tokens (the query, key and
/// value projections; the gate and up projections). Where every weight has a packed copy, all
/// their tiles run as one pool job, with the activations quantized once: one dispatch instead of
/// one per weight, and no small jobs with their start-up and tail costs. Each tile is computed
/// as in [`matmul`] whatever the task split, so the results equal separate calls bit for bit.
///
/// Panics if the weights differ in `cols`, or `x` or a `ys[i]` is too short for `n` tokens.
pub fn matmul_fused(pool: &ThreadPool, ws: &[&QWeight], x: &[f32], n: usize, ys: &mut [&mut [f32]]) {
    assert_eq!(ws.len(), ys.len(), "matmul_fused: {} weights, {} outputs", ws.len(), ys.len());
    let g = tile_kernels(kernels()).filter(|_| ws.len() > 1 && n > 0);
    let packed: Option<Vec<&gemm::Packed>> = g.and_then(|_| ws.iter().map(|w| w.packed(pool)).collect());
    let (Some(g), Some(ps)) = (g, packed) else {
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            matmul(pool, w, x, n, y);
        }
        return;
    };
    let cols = ws[0].cols;
    assert!(ws.iter().all(|w| w.cols == cols), "matmul_fused: weights differ in columns");
    assert!(x.len() >= n * cols, "matmul_fused: x has {} values, need {n}×{cols}", x.len());
    for (w, y) in ws.iter().zip(ys.iter()) {
        assert!(y.len() >= n * w.rows, "matmul_fused: y has {} values, need {n}×{}", y.len(), w.rows);
    }
    let x = &x[..n * cols];
    let need_k = ps.iter().any(|p| p.kind.is_k());
    let need_8 = ps.iter().any(|p| !p.kind.is_k());
    with_scratch(&SCRATCH_Q8, if need_8 { n * (cols / QK) } else { 0 }, |a8| {
        with_scratch(&SCRATCH_Q8K, if need_k { n * (cols / QK_K) } else { 0 }, |ak| {
            if need_8 {
                quantize_acts(pool, x, n, cols, a8, quant::quantize_act_q8);
            }
            if need_k {
                quantize_acts(pool, x, n, cols, ak, quant::quantize_act_q8k);
            }
            let yps: Vec<SharedMut<f32>> = ys.iter_mut().map(|y| SharedMut(y.as_mut_ptr())).collect();
            run_tiles(pool, g, &ps, n, a8, ak, &yps);
        })
    })
}

/// Quantizes the `n` activation rows, in parallel when there are many.
fn quantize_acts<B: Send>(pool: &ThreadPool, x: &[f32], n: usize, cols: usize, act: &mut [B], q: fn(&[f32], &mut [B])) {
    let nb = act.len() / n;
    if n < 4 || pool.threads() == 1 || n * cols < 1 << 15 {
        for (xr, ar) in x.chunks_exact(cols).zip(act.chunks_exact_mut(nb)) {
            q(xr, ar);
        }
        return;
    }
    let tasks = (pool.threads() * 2).min(n);
    let per = n.div_ceil(tasks);
    let ap = SharedMut(act.as_mut_ptr());
    pool.for_each(tasks, &|i| {
        let t0 = i * per;
        let t1 = (t0 + per).min(n);
        for t in t0..t1 {
            // SAFETY: each token's blocks are written by exactly one task.
            let ar = unsafe { std::slice::from_raw_parts_mut(ap.ptr().add(t * nb), nb) };
            q(&x[t * cols..(t + 1) * cols], ar);
        }
    });
}

/// Rows per tile when several tokens share the weights (prefill).
const ROW_TILE: usize = 16;

/// From this many tokens on, Q4_0/Q5_0 row tiles are unpacked to Q8_0 once per tile.
const REPACK_MIN_TOKENS: usize = 6;

thread_local! {
    static SCRATCH_TILE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// How `rows` (and, for few row chunks, the `n` tokens) are split into tasks.
#[derive(Clone, Copy)]
struct Split {
    row_tasks: usize,
    rows_per: usize,
    tok_tasks: usize,
    toks_per: usize,
}

impl Split {
    /// Rows `r0..r1` and tokens `t0..t1` of task `i` (row chunk `i % row_tasks`).
    fn task(&self, i: usize, rows: usize, n: usize) -> (usize, usize, usize, usize) {
        let (rt, tt) = (i % self.row_tasks, i / self.row_tasks);
        let r0 = rt * self.rows_per;
        let t0 = tt * self.toks_per;
        (r0, (r0 + self.rows_per).min(rows), t0, (t0 + self.toks_per).min(n))
    }
}

/// Row chunks per thread in [`split`]: tasks are claimed as threads come free, so a slower
/// thread takes fewer of them.
const CHUNKS_PER_THREAD: usize = 4;

/// Splits `rows` (and, for few row chunks, the `n` tokens) into tasks for the per-row kernels.
fn split_rows(threads: usize, rows: usize, n: usize) -> Split {
    // Row chunks of a multiple of 4 rows, not tiny ones.
    split(threads, rows, n, if n == 1 { 32 } else { ROW_TILE }, 4, 1)
}

/// Splits `units` (rows, or row tiles) into [`CHUNKS_PER_THREAD`] chunks per thread, each a
/// multiple of `align` units and none under `min_units` where possible; when that leaves the pool
/// short of tasks, splits the `n` tokens too, in multiples of `tok_align`.
fn split(threads: usize, units: usize, n: usize, min_units: usize, align: usize, tok_align: usize) -> Split {
    let row_tasks = if threads == 1 { 1 } else { (threads * CHUNKS_PER_THREAD).min(units.div_ceil(min_units)).max(1) };
    let rows_per = units.div_ceil(row_tasks).next_multiple_of(align).min(units);
    let row_tasks = units.div_ceil(rows_per);
    // Few chunks but many tokens (and more than one thread): split tokens too.
    let tok_tasks = if threads > 1 && n > 1 && row_tasks < threads * 2 { (threads * 2).div_ceil(row_tasks).min(n.div_ceil(tok_align)) } else { 1 };
    let toks_per = n.div_ceil(tok_tasks).next_multiple_of(tok_align);
    let tok_tasks = n.div_ceil(toks_per);
    Split { row_tasks, rows_per, tok_tasks, toks_per }
}

/// Like [`run`] for Q4_0/Q5_0 weights and many tokens: each row tile is rewritten as Q8_0
/// (same integers and scales, so the same results) and then dotted with every token.
#[allow(clippy::too_many_arguments)]
fn run_repacked(
    pool: &ThreadPool,
    ty: GgmlType,
    data: &[u8],
    rs: usize,
    rows: usize,
    n: usize,
    act: &[BlockQ8],
    nb: usize,
    f: super::dot::DotQ8Fn,
    f4: super::dot::DotQ8x4Fn,
    y: &mut [f32],
) {
    let sp = split_rows(pool.threads(), rows, n);
    let rs8 = nb * 34;
    let yp = SharedMut(y.as_mut_ptr());
    let task = |i: usize| {
        let (r0, r1, t0, t1) = sp.task(i, rows, n);
        with_scratch(&SCRATCH_TILE, ROW_TILE * rs8, |tile| {
            let mut tr = r0;
            while tr < r1 {
                let te = (tr + ROW_TILE).min(r1);
                quant::repack_to_q8_0(ty, &data[tr * rs..te * rs], &mut tile[..(te - tr) * rs8]);
                // SAFETY: as in `run`.
                unsafe { tile_dots(&tile[..(te - tr) * rs8], rs8, tr, te, t0, t1, act, nb, rows, f, Some(f4), yp) };
                tr = te;
            }
        })
    };
    pool.for_each(sp.row_tasks * sp.tok_tasks, &task);
}

/// The CPU's tile GEMMs for the 32-element formats and for the K-quants; both or neither
/// (`dispatch::gemm_kernel_k` exists only with `dispatch::gemm_kernel`).
fn tile_kernels(k: &Kernels) -> Option<(gemm::GemmFn, gemm::GemmKFn)> {
    k.gemm.zip(k.gemm_k)
}

/// One pool job over all tiles of the packed weights `ps` (end to end: tile `ti` of the job is
/// tile `ti - first[w]` of weight `w`) for `n` tokens, writing `ys[w]` (`n × ps[w].rows`).
/// `a8`/`ak` are the tokens' activations quantized for the 32-element formats and for the
/// K-quants (each may be empty when no weight needs it). A tile's result does not depend on how
/// the job is split, so fusing weights or batching tokens changes nothing.
fn run_tiles(
    pool: &ThreadPool,
    (g, gk): (gemm::GemmFn, gemm::GemmKFn),
    ps: &[&gemm::Packed],
    n: usize,
    a8: &[BlockQ8],
    ak: &[BlockQ8K],
    ys: &[SharedMut<f32>],
) {
    let mut first = Vec::with_capacity(ps.len() + 1);
    first.push(0);
    for p in ps {
        first.push(first[first.len() - 1] + p.tiles());
    }
    let tiles = first[ps.len()];
    let bytes: usize = ps.iter().map(|p| p.tiles() * p.tile_bytes()).sum();
    // Tiles `i0..i1` for tokens `t0..t1`.
    let tile_range = |i0: usize, i1: usize, t0: usize, t1: usize| {
        let mut w = 0;
        for ti in i0..i1 {
            while ti >= first[w + 1] {
                w += 1;
            }
            let (p, lt) = (ps[w], ti - first[w]);
            let (rows, nb) = (p.rows, p.nb);
            let r0 = lt * gemm::TILE_ROWS;
            let nrows = p.tile_rows(lt);
            let y = ys[w].ptr();
            // SAFETY: `g`/`gk` are this CPU's tile kernels (`dispatch::gemm_kernel`), which check the
            // activation and tile lengths; the callers check that `ys[w]` holds `n × rows`
            // values; each `ys[w][t][r]` has one writer.
            unsafe {
                if p.kind.is_k() {
                    gk(p.kind, p.tile(lt), nb, &ak[t0 * nb..t1 * nb], t1 - t0, y.add(t0 * rows + r0), rows, nrows)
                } else {
                    g(p.kind, p.tile(lt), nb, &a8[t0 * nb..t1 * nb], t1 - t0, y.add(t0 * rows + r0), rows, nrows)
                }
            }
        }
    };
    if n == 1 && pool.threads() > 1 && tiles > 1 {
        // One token (decode): each thread streams one contiguous range, so its reads are one
        // stream the hardware prefetchers follow from the start (four chunks per thread
        // restarted the stream at every chunk: 2 threads, decode's layer weights 2.6-2.7
        // against 2.0-2.1 ms per token on AVX2, 2.2 against 1.8 on AVX-512,
        // `examples/decode_bw`), taken from the front in chunks; a thread done with its range
        // takes chunks from the back of the others'. On a shared machine one core often runs
        // 10-15 % slower than the other for seconds at a time, and with fixed halves the faster
        // one waited for it at the end of every product (2 threads, AVX2: 0.3-1.4 ms per token
        // on the layer products and 0.05-0.5 ms on the LM head).
        let chunk = (STEAL_CHUNK_BYTES * tiles / bytes.max(1)).max(1);
        for_each_claimed(pool, tiles, chunk, &|_, a, b| tile_range(a, b, 0, 1));
        return;
    }
    // Whole tiles per task; tokens, if split, in multiples of four (the kernel's token group).
    let sp = split(pool.threads(), tiles, n, 1, 1, 4);
    pool.for_each(sp.row_tasks * sp.tok_tasks, &|i| {
        let (i0, i1, t0, t1) = sp.task(i, tiles, n);
        tile_range(i0, i1, t0, t1);
    });
}

/// Runs `f(part, a, b)` over `0..items` on the pool in `min(threads, items)` parts: each part
/// takes its own contiguous range from the front, `chunk` items at a time, then helps the others
/// from the back of theirs (see the one-token case of [`run_tiles`]); `part` is the task
/// running the range, for per-task state.
fn for_each_claimed(pool: &ThreadPool, items: usize, chunk: usize, f: &(dyn Fn(usize, usize, usize) + Sync)) {
    let parts = pool.threads().min(items);
    let claims: Vec<Claim> = (0..parts).map(|r| Claim::new(r * items / parts, (r + 1) * items / parts)).collect();
    pool.for_each(parts, &|i| {
        while let Some((a, b)) = claims[i].front(chunk) {
            f(i, a, b);
        }
        for j in (1..parts).map(|k| (i + k) % parts) {
            while let Some((a, b)) = claims[j].back(chunk) {
                f(i, a, b);
            }
        }
    });
}

/// Bytes of weight tiles per claim in a one-token product ([`Claim`]): a few microseconds of
/// streaming, so the threads finish within that of each other.
const STEAL_CHUNK_BYTES: usize = 32 << 10;

/// A range of tiles (`front..back`) that its owner takes from the front, chunk by chunk, and
/// the other threads, once done with their own, from the back: `front` in the low 32 bits,
/// `back` in the high. Each on a cache line of its own, so the owner's claims stay in its cache
/// until another thread comes. A claim only divides indices (the pool's end of job publishes
/// the results), so relaxed ordering is enough.
#[repr(align(128))]
struct Claim(AtomicU64);

impl Claim {
    fn new(front: usize, back: usize) -> Self {
        Claim(AtomicU64::new(((back as u64) << 32) | front as u64))
    }

    /// Takes up to `c` items from the front.
    fn front(&self, c: usize) -> Option<(usize, usize)> {
        self.take(|f, b| {
            let e = (f + c).min(b);
            ((f, e), (e, b))
        })
    }

    /// Takes up to `c` items from the back.
    fn back(&self, c: usize) -> Option<(usize, usize)> {
        self.take(|f, b| {
            let s = b.saturating_sub(c).max(f);
            ((s, b), (f, s))
        })
    }

    /// Applies `cut` (front, back) → (taken range, what is left) while the range is not empty.
    fn take(&self, cut: impl Fn(usize, usize) -> ((usize, usize), (usize, usize))) -> Option<(usize, usize)> {
        let mut cur = self.0.load(Ordering::Relaxed);
        loop {
            let (f, b) = (cur as u32 as usize, (cur >> 32) as usize);
            if f >= b {
                return None;
            }
            let (taken, (nf, nb)) = cut(f, b);
            match self.0.compare_exchange_weak(cur, ((nb as u64) << 32) | nf as u64, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(taken),
                Err(x) => cur = x,
            }
        }
    }
}

/// Splits rows (and, for few rows, tokens) into tasks and computes every `y[t][r]`.
#[allow(clippy::too_many_arguments)]
fn run<A: Sync>(
    pool: &ThreadPool,
    data: &[u8],
    rs: usize,
    rows: usize,
    n: usize,
    act: &[A],
    stride: usize,
    f: unsafe fn(&[u8], &[A]) -> f32,
    f4: Option<Dot4<A>>,
    y: &mut [f32],
) {
    let sp = split_rows(pool.threads(), rows, n);
    let yp = SharedMut(y.as_mut_ptr());
    let task = |i: usize| {
        let (r0, r1, t0, t1) = sp.task(i, rows, n);
        if t1 - t0 == 1 {
            let a = &act[t0 * stride..(t0 + 1) * stride];
            for r in r0..r1 {
                // SAFETY: lengths are checked by `matmul_with`/`QWeight::new`; the kernel set
                // matches the CPU (`dispatch::kernels`); each `y[t][r]` has exactly one writer.
                unsafe { *yp.ptr().add(t0 * rows + r) = f(&data[r * rs..(r + 1) * rs], a) };
            }
            return;
        }
        let mut tr = r0;
        while tr < r1 {
            let te = (tr + ROW_TILE).min(r1);
            // SAFETY: as above.
            unsafe { tile_dots(&data[tr * rs..te * rs], rs, tr, te, t0, t1, act, stride, rows, f, f4, yp) };
            tr = te;
        }
    };
    pool.for_each(sp.row_tasks * sp.tok_tasks, &task);
}

/// `y[t][r]` for rows `tr..te` (bytes in `tile`, `rs` per row) and tokens `t0..t1`, four tokens
/// at a time when `f4` is given.
///
/// # Safety
/// `f`/`f4` must be callable on this CPU with these lengths, and `yp` must be valid for
/// `y[t * rows + r]` with no other writer of those elements.
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn tile_dots<A>(
    tile: &[u8],
    rs: usize,
    tr: usize,
    te: usize,
    t0: usize,
    t1: usize,
    act: &[A],
    stride: usize,
    rows: usize,
    f: unsafe fn(&[u8], &[A]) -> f32,
    f4: Option<Dot4<A>>,
    yp: SharedMut<f32>,
) {
    let a = |t: usize| &act[t * stride..(t + 1) * stride];
    let mut t = t0;
    if let Some(f4) = f4 {
        while t + 4 <= t1 {
            let acts = [a(t), a(t + 1), a(t + 2), a(t + 3)];
            for r in tr..te {
                let v = f4(&tile[(r - tr) * rs..(r - tr + 1) * rs], acts);
                for (k, v) in v.into_iter().enumerate() {
                    *yp.ptr().add((t + k) * rows + r) = v;
                }
            }
            t += 4;
        }
    }
    while t < t1 {
        let at = a(t);
        for r in tr..te {
            *yp.ptr().add(t * rows + r) = f(&tile[(r - tr) * rs..(r - tr + 1) * rs], at);
        }
        t += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::Claim;

    #[test]
    fn claims_split_a_range_without_gaps_or_overlaps() {
        let c = Claim::new(3, 20);
        assert_eq!(c.front(4), Some((3, 7)));
        assert_eq!(c.back(5), Some((15, 20)));
        assert_eq!(c.back(100), Some((7, 15)));
        assert_eq!(c.front(1), None);
        assert_eq!(c.back(1), None);
        assert_eq!(Claim::new(5, 5).front(1), None);
        // Owners and thieves racing over four ranges: every index taken exactly once.
        let n = 40_000;
        let claims: Vec<Claim> = (0..4).map(|r| Claim::new(r * n / 4, (r + 1) * n / 4)).collect();
        let taken: Vec<std::sync::atomic::AtomicU8> = (0..n).map(|_| Default::default()).collect();
        std::thread::scope(|s| {
            for i in 0..4 {
                let (claims, taken) = (&claims, &taken);
                s.spawn(move || {
                    let mark = |(a, b): (usize, usize)| (a..b).for_each(|k| _ = taken[k].fetch_add(1, std::sync::atomic::Ordering::Relaxed));
                    while let Some(r) = claims[i].front(3 + i) {
                        mark(r);
                    }
                    for j in (1..4).map(|k| (i + k) % 4) {
                        while let Some(r) = claims[j].back(7) {
                            mark(r);
                        }
                    }
                });
            }
        });
        assert!(taken.iter().all(|t| t.load(std::sync::atomic::Ordering::Relaxed) == 1));
    }
}
