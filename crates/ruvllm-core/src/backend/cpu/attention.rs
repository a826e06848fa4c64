//! Attention kernels over the KV cache: scores of queries against cached keys and the
//! weighted sums of cached values, per head and several heads per pass over the rows.

#[cfg(target_arch = "x86_64")]
use super::arch::x86::vec as simd;
use super::ops::{self, axpy, dot, KvElem};
use crate::backend::kv::{KvQ8, KvRows, KvType, LayerCache, Q8_BLOCK};
use crate::backend::AttnShape;
use crate::runtime::{SharedMut, ThreadPool};

/// Attention scores over cached keys: `out[j] = dot(q, k[offs[j]..][..q.len()]) * scale`, the
/// same operations as [`dot`] per key (identical results), several keys at a time so `q` is
/// loaded once for them.
///
/// Panics if a key row lies outside `k` or `out` is shorter than `offs`.
pub fn scores<T: KvElem>(q: &[f32], k: &[T], offs: &[usize], scale: f32, out: &mut [f32]) {
    let hd = q.len();
    assert!(out.len() >= offs.len() && offs.iter().all(|&o| o + hd <= k.len()), "scores: key rows out of range");
    #[cfg(target_arch = "x86_64")]
    if simd::avx512() && hd.is_multiple_of(16) {
        // SAFETY: AVX-512F was detected; every row `offs[j]..offs[j] + hd` is inside `k`.
        return unsafe { simd::scores512(q, k, offs, scale, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if simd::avx2() && hd.is_multiple_of(16) {
        // SAFETY: AVX2 and FMA were detected; every row `offs[j]..offs[j] + hd` is inside `k`.
        return unsafe { simd::scores(q, k, offs, scale, out) };
    }
    for (o, &off) in out.iter_mut().zip(offs) {
        *o = with_f32_row(&k[off..off + hd], |r| dot(q, r)) * scale;
    }
}

/// Calls `f` with `row` widened to f32 (exactly), in a stack buffer for rows of up to 512.
fn with_f32_row<T: KvElem, R>(row: &[T], f: impl FnOnce(&[f32]) -> R) -> R {
    let mut stack = [0f32; 512];
    let mut heap = Vec::new();
    let buf: &mut [f32] = if row.len() <= stack.len() {
        &mut stack[..row.len()]
    } else {
        heap.resize(row.len(), 0.0);
        &mut heap
    };
    for (b, &x) in buf.iter_mut().zip(row) {
        *b = x.to_f32();
    }
    f(buf)
}

/// Attention output over cached values: `out = Σ_j w[j] · v[offs[j]..][..out.len()]`, rows in
/// order from zero, with per element the same fused multiply-adds as [`axpy`] row by row
/// (identical results), but the output stays in registers across the rows.
///
/// Panics if a value row lies outside `v` or `w` is shorter than `offs`.
pub fn weighted_sum<T: KvElem>(w: &[f32], v: &[T], offs: &[usize], out: &mut [f32]) {
    let hd = out.len();
    assert!(w.len() >= offs.len() && offs.iter().all(|&o| o + hd <= v.len()), "weighted_sum: value rows out of range");
    #[cfg(target_arch = "x86_64")]
    if simd::avx512() && hd == 256 {
        // SAFETY: AVX-512F was detected; every row `offs[j]..offs[j] + hd` is inside `v`.
        return unsafe { simd::weighted_sum256(w, v, offs, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if simd::avx2() && hd.is_multiple_of(8) {
        // SAFETY: AVX2 and FMA were detected; every row `offs[j]..offs[j] + hd` is inside `v`.
        return unsafe { simd::weighted_sum(w, v, offs, out) };
    }
    out.fill(0.0);
    for (&wj, &off) in w.iter().zip(offs) {
        with_f32_row(&v[off..off + hd], |r| axpy(out, wj, r));
    }
}

/// [`scores`] for several query heads over the same keys (the heads of a KV group):
/// `outs[h][j] = dot(qs[h], k[offs[j]..][..hd]) * scale`, identical to [`scores`] per head, but
/// each key row is loaded (and, from the f16 cache, widened) once for up to four heads.
///
/// `pf`: value rows the caller reads next, prefetched while the keys are scored (the SIMD
/// kernels only; no result changes).
///
/// Panics if the heads differ in length, `outs` is shorter than `qs` or an output row shorter
/// than `offs`, or a key (or prefetched value) row lies outside `k` (`pf.v`).
pub fn scores_heads<T: KvElem>(qs: &[&[f32]], k: &[T], offs: &[usize], scale: f32, outs: &mut [&mut [f32]], pf: Option<Prefetch<T>>) {
    let Some(hd) = qs.first().map(|q| q.len()) else { return };
    assert!(
        outs.len() >= qs.len() && qs.iter().all(|q| q.len() == hd) && outs.iter().all(|o| o.len() >= offs.len()),
        "scores_heads: heads or output rows do not match"
    );
    #[cfg(target_arch = "x86_64")]
    if qs.len() > 1 && simd::avx2() && hd.is_multiple_of(16) {
        assert!(offs.iter().all(|&o| o + hd <= k.len()), "scores: key rows out of range");
        assert!(pf.is_none_or(|p| p.offs.iter().all(|&o| o + p.width <= p.v.len())), "scores: prefetched value rows out of range");
        for (q4, o4) in qs.chunks(4).zip(outs.chunks_mut(4)) {
            // SAFETY: AVX2/FMA/F16C (and AVX-512F for the 512-bit variant) were detected; every
            // key row is inside `k`, every query has `hd` elements and every output row
            // `offs.len()`.
            unsafe { simd::scores_heads_dispatch(q4, k, offs, scale, o4, simd::avx512(), pf) };
        }
        return;
    }
    for (q, o) in qs.iter().zip(outs.iter_mut()) {
        scores(q, k, offs, scale, o);
    }
}

/// Value rows for [`scores_heads`] to prefetch: `width` elements at each of `offs` in `v`.
#[derive(Clone, Copy)]
pub struct Prefetch<'a, T> {
    pub v: &'a [T],
    pub offs: &'a [usize],
    pub width: usize,
}

/// [`weighted_sum`] for several heads over the same value rows: `outs[h] = Σ_j ws[h][j] ·
/// v[offs[j]..][..width]`, identical to [`weighted_sum`] per head (per element the same fused
/// multiply-adds over the rows in order), but each value row is loaded (and widened) once for
/// up to four heads.
///
/// Panics if the outputs differ in width, `ws` is shorter than `outs` or a weight row shorter
/// than `offs`, or a value row lies outside `v`.
pub fn weighted_sum_heads<T: KvElem>(ws: &[&[f32]], v: &[T], offs: &[usize], outs: &mut [&mut [f32]]) {
    let Some(width) = outs.first().map(|o| o.len()) else { return };
    assert!(
        ws.len() >= outs.len() && outs.iter().all(|o| o.len() == width) && ws.iter().all(|w| w.len() >= offs.len()),
        "weighted_sum_heads: heads or weight rows do not match"
    );
    #[cfg(target_arch = "x86_64")]
    if outs.len() > 1 && simd::avx2() && width.is_multiple_of(8) {
        assert!(offs.iter().all(|&o| o + width <= v.len()), "weighted_sum: value rows out of range");
        for (w4, o4) in ws.chunks(4).zip(outs.chunks_mut(4)) {
            // SAFETY: as in `scores_heads`; every value row `offs[j]..offs[j] + width` is inside
            // `v`, every weight row has `offs.len()` elements.
            unsafe { simd::weighted_sum_heads_dispatch(w4, v, offs, o4, simd::avx512()) };
        }
        return;
    }
    for (w, o) in ws.iter().zip(outs.iter_mut()) {
        weighted_sum(w, v, offs, o);
    }
}

// ---------------------------------------------------------------------------------------------
// The attention of a forward pass over the cache, on the thread pool
// ---------------------------------------------------------------------------------------------

thread_local! {
    /// Per-thread attention score row, the key/value row offsets of its positions and those of
    /// the value rows it prefetches, grown to the longest span seen (no per-token allocation).
    static SCORES: std::cell::RefCell<(Vec<f32>, Vec<usize>, Vec<usize>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// One attention call: the `n` queries of `q` at positions `pos0..` over `cache` (positions
/// `0..pos0 + n` stored), each seeing the positions `span` gives it, into `attn`.
pub struct Call<'a> {
    pub pool: &'a ThreadPool,
    pub cache: &'a LayerCache,
    pub q: &'a [f32],
    pub attn: &'a mut [f32],
    /// The split decode path's score rows, grown on use.
    pub scores: &'a mut Vec<f32>,
    pub shape: AttnShape,
    pub span: Span,
    pub pos0: usize,
    pub n: usize,
}

/// Runs one attention call on the cache's element type.
pub fn run(call: Call) {
    match &call.cache.rows {
        KvRows::F16 { k, v } => rows(call, k, v),
        KvRows::F32 { k, v } => rows(call, k, v),
        KvRows::Q8 { k, v } => dequantized(call, k, v),
        KvRows::Device(_) => panic!("the CPU backend was given a device KV cache"),
    }
}

thread_local! {
    /// f32 copies of the positions a call over a q8_0 cache reads (one layer's at a time),
    /// grown to the longest span seen.
    static DEQUANT: std::cell::RefCell<Option<LayerCache>> = const { std::cell::RefCell::new(None) };
}

/// [`run`] over a q8_0 cache: the positions any query sees are dequantized (threaded) into
/// an f32 cache whose slots hold the same positions, which the f32 kernels then read.
fn dequantized(c: Call, kq: &[KvQ8], vq: &[KvQ8]) {
    let (stored, row) = (c.pos0 + c.n, kq.len() / c.cache.capacity.max(1) * Q8_BLOCK);
    let first = (0..c.n).map(|t| c.span.of(c.pos0 + t, stored).0).min().unwrap_or(0);
    let len = stored - first;
    DEQUANT.with(|cell| {
        let mut scratch = cell.borrow_mut();
        let fits = scratch.as_ref().is_some_and(|s| s.capacity >= len && s.bytes() == s.capacity * row * 8);
        if !fits {
            *scratch = None;
            *scratch = Some(LayerCache::new(len.next_power_of_two(), row, KvType::F32));
        }
        let dst = scratch.as_mut().expect("just made");
        let KvRows::F32 { k, v } = &mut dst.rows else { unreachable!("an f32 cache") };
        let (ks, vs, cap) = (SharedMut(k.as_mut_ptr()), SharedMut(v.as_mut_ptr()), dst.capacity);
        let (nb, src) = (row / Q8_BLOCK, c.cache);
        const CHUNK: usize = 64;
        c.pool.for_each(len.div_ceil(CHUNK), &|i| {
            for p in first + i * CHUNK..(first + (i + 1) * CHUNK).min(stored) {
                let (s, d) = (src.slot(p) * nb, (p % cap) * row);
                for (blocks, out) in [(&kq[s..s + nb], ks), (&vq[s..s + nb], vs)] {
                    // SAFETY: each position's row is written by one task only, and row
                    // `p % cap` lies inside the scratch (cap * row values).
                    let out = unsafe { std::slice::from_raw_parts_mut(out.ptr().add(d), row) };
                    blocks.iter().zip(out.chunks_exact_mut(Q8_BLOCK)).for_each(|(b, o)| b.dequantize(o));
                }
            }
        });
        let dst = &*dst;
        let KvRows::F32 { k, v } = &dst.rows else { unreachable!("an f32 cache") };
        rows(Call { cache: dst, ..c }, k, v);
    });
}

/// [`run`] over key and value rows `kc`, `vc` of the cache's element type.
fn rows<T: KvElem>(c: Call, kc: &[T], vc: &[T]) {
    // Prefill: tiled over tokens and heads (`flash`); decode: the per-query kernels below.
    if c.n >= super::flash::MIN_TOKENS && crate::runtime::cpu().flash {
        return super::flash::run(c, kc, vc);
    }
    let (pool, cache, n, pos0, span) = (c.pool, c.cache, c.n, c.pos0, c.span);
    let (hd, n_head) = (c.shape.head_dim, c.shape.n_head);
    let group = n_head / c.shape.n_kv_head;
    let q_dim = n_head * hd;
    let kv_row = c.shape.n_kv_head * hd;
    let attn = SharedMut(c.attn.as_mut_ptr());
    let q_all = c.q;
    let (scale, softcap) = (c.shape.scale, c.shape.softcap);
    // One task per (token, KV head, sub-group of the query heads sharing it): the task
    // passes over the key and value rows once per four of its heads
    // (`scores_heads`/`weighted_sum_heads`: per head the operations of
    // `scores`/`weighted_sum`, identical whatever the grouping).
    // Sub-groups are as large as keeps every thread busy: decode with one KV head on two
    // threads runs two tasks of half the heads.
    let n_kv = c.shape.n_kv_head;
    // Decode (fewer query/KV-head pairs than threads) over a long span: split the positions
    // and the value dimensions over the threads instead, so each thread reads its share of
    // the keys and values rather than all of them.
    let stored = pos0 + n;
    if n * n_kv < pool.threads() && span.of(pos0 + n - 1, stored).1 >= SPLIT_MIN_SPAN && hd.is_multiple_of(16 * pool.threads()) {
        return split(c, kc, vc);
    }
    let mut hs = group;
    while hs > 1 && hs.is_multiple_of(2) && n * n_kv * (group / hs) < pool.threads() {
        hs /= 2;
    }
    let subs = group / hs;
    let grouped = |i: usize| {
        let (t, g, sub) = (i / (n_kv * subs), (i / subs) % n_kv, i % subs);
        let (lo, span) = span.of(pos0 + t, stored);
        let h0 = g * group + sub * hs;
        let q = &q_all[t * q_dim + h0 * hd..t * q_dim + (h0 + hs) * hd];
        // SAFETY: task i owns attn[t*q_dim + h0*hd ..][..hs*hd]: disjoint across tasks.
        let out = unsafe { std::slice::from_raw_parts_mut(attn.ptr().add(t * q_dim + h0 * hd), hs * hd) };
        SCORES.with(|cell| {
            let (buf, offs, _) = &mut *cell.borrow_mut();
            if buf.len() < hs * span {
                buf.resize(hs * span, 0.0);
            }
            // Where each visible position's key and value rows start.
            offs.clear();
            offs.extend((lo..lo + span).map(|p| cache.slot(p) * kv_row + g * hd));
            // Up to four heads at a time over the same key and value rows.
            for (h0, hn) in head_chunks(0, hs) {
                let sc = &mut buf[h0 * span..(h0 + hn) * span];
                let qs = up_to_four(q[h0 * hd..(h0 + hn) * hd].chunks(hd));
                // One query (decode): the key and value rows come from DRAM; the value rows
                // are prefetched while the keys are scored.
                let pf = (n == 1).then_some(Prefetch { v: vc, offs, width: hd });
                scores_heads(&qs[..hn], kc, offs, scale, &mut up_to_four_mut(sc.chunks_mut(span))[..hn], pf);
                if let Some(cap) = softcap {
                    softcap_inplace(sc, cap);
                }
                sc.chunks_mut(span).for_each(ops::softmax_inplace);
                let ws = up_to_four(sc.chunks(span));
                weighted_sum_heads(&ws[..hn], vc, offs, &mut up_to_four_mut(out[h0 * hd..(h0 + hn) * hd].chunks_mut(hd))[..hn]);
            }
        });
    };
    pool.for_each(n * n_kv * subs, &grouped);
}

/// [`run`] for few queries over many positions, with the work split so that
/// each thread reads a share of the keys and values: (1) scores, positions split over the
/// tasks (each task scores its positions for every head of the group, four heads per pass
/// over a block of rows); (2) softmax, one task per head; (3) value sums, the head
/// dimension split over the tasks. Every score, softmax and output element is computed by
/// the same operations in the same order as in `rows`, so the result is identical.
fn split<T: KvElem>(c: Call, kc: &[T], vc: &[T]) {
    let (pool, cache, n, pos0, span) = (c.pool, c.cache, c.n, c.pos0, c.span);
    let (hd, n_head, n_kv) = (c.shape.head_dim, c.shape.n_head, c.shape.n_kv_head);
    let group = n_head / n_kv;
    let (q_dim, kv_row, scale) = (n_head * hd, n_kv * hd, c.shape.scale);
    let span_of = |t: usize| span.of(pos0 + t, pos0 + n);
    let stride = (0..n).map(|t| span_of(t).1).max().unwrap_or(0);
    // Scores of (token t, head h) at row t * n_head + h.
    if c.scores.len() < n * n_head * stride {
        c.scores.resize(n * n_head * stride, 0.0);
    }
    let sc = SharedMut(c.scores.as_mut_ptr());
    let parts = pool.threads();
    let q_all = c.q;
    pool.for_each(parts, &|i| {
        SCORES.with(|cell| {
            let (_, offs, pf_offs) = &mut *cell.borrow_mut();
            let width = hd / parts;
            for t in 0..n {
                let (lo, span) = span_of(t);
                let (a, b) = (i * span / parts, (i + 1) * span / parts);
                for g in 0..n_kv {
                    // The value columns this task sums in (3), of every position, prefetched
                    // while it scores its share of the positions (spread evenly over them).
                    pf_offs.clear();
                    pf_offs.extend((lo..lo + span).map(|p| cache.slot(p) * kv_row + g * hd + i * width));
                    for blk in (a..b).step_by(SPLIT_BLOCK) {
                        let e = (blk + SPLIT_BLOCK).min(b);
                        offs.clear();
                        offs.extend((lo + blk..lo + e).map(|p| cache.slot(p) * kv_row + g * hd));
                        let share = &pf_offs[(blk - a) * span / (b - a)..(e - a) * span / (b - a)];
                        let pf = Some(Prefetch { v: vc, offs: share, width });
                        for (h0, hn) in head_chunks(g * group, (g + 1) * group) {
                            let qs = up_to_four(q_all[t * q_dim + h0 * hd..t * q_dim + (h0 + hn) * hd].chunks(hd));
                            // SAFETY: task i owns positions a..b of every score row.
                            let mut outs = up_to_four_mut(
                                (h0..h0 + hn).map(|h| unsafe { std::slice::from_raw_parts_mut(sc.ptr().add((t * n_head + h) * stride + blk), e - blk) }),
                            );
                            scores_heads(&qs[..hn], kc, offs, scale, &mut outs[..hn], pf);
                        }
                    }
                }
            }
        });
    });
    pool.for_each(n * n_head, &|r| {
        // SAFETY: task r owns score row r.
        let row = unsafe { std::slice::from_raw_parts_mut(sc.ptr().add(r * stride), span_of(r / n_head).1) };
        if let Some(cap) = c.shape.softcap {
            softcap_inplace(row, cap);
        }
        ops::softmax_inplace(row);
    });
    let attn = SharedMut(c.attn.as_mut_ptr());
    let scores = &*c.scores;
    let width = hd / parts;
    pool.for_each(parts, &|i| {
        let d0 = i * width;
        SCORES.with(|cell| {
            let offs = &mut cell.borrow_mut().1;
            for t in 0..n {
                let (lo, span) = span_of(t);
                for g in 0..n_kv {
                    offs.clear();
                    offs.extend((lo..lo + span).map(|p| cache.slot(p) * kv_row + g * hd + d0));
                    for (h0, hn) in head_chunks(g * group, (g + 1) * group) {
                        let ws = up_to_four((h0..h0 + hn).map(|h| &scores[(t * n_head + h) * stride..][..span]));
                        // SAFETY: task i owns columns d0..d0 + width of every head's output.
                        let mut outs =
                            up_to_four_mut((h0..h0 + hn).map(|h| unsafe { std::slice::from_raw_parts_mut(attn.ptr().add(t * q_dim + h * hd + d0), width) }));
                        weighted_sum_heads(&ws[..hn], vc, offs, &mut outs[..hn]);
                    }
                }
            }
        });
    });
}

/// Attention-score soft-capping, `cap · tanh(s / cap)` (Gemma 2), as llama.cpp computes it
/// (scale by `1 / cap`, tanh, scale by `cap`).
fn softcap_inplace(scores: &mut [f32], cap: f32) {
    let inv = 1.0 / cap;
    scores.iter_mut().for_each(|s| *s = (*s * inv).tanh() * cap);
}

pub use crate::backend::Span;

impl Span {
    /// (first position, count) for the query at `pos` with `0..stored` in the cache.
    pub fn of(self, pos: usize, stored: usize) -> (usize, usize) {
        self.mask.visible(pos, stored, self.window)
    }
}

/// Query heads the attention kernels serve per pass over a KV head's rows
/// ([`scores_heads`], [`weighted_sum_heads`]).
const HEADS_AT_ONCE: usize = 4;

/// Heads `lo..hi` as (first head, count) chunks of at most [`HEADS_AT_ONCE`].
fn head_chunks(lo: usize, hi: usize) -> impl Iterator<Item = (usize, usize)> {
    (lo..hi).step_by(HEADS_AT_ONCE).map(move |h0| (h0, (hi - h0).min(HEADS_AT_ONCE)))
}

/// The first four items of `it` (empty slices after it ends), for the multi-head kernels
/// without allocating.
fn up_to_four<'a>(mut it: impl Iterator<Item = &'a [f32]>) -> [&'a [f32]; HEADS_AT_ONCE] {
    std::array::from_fn(|_| it.next().unwrap_or(&[]))
}

/// [`up_to_four`] for mutable rows.
fn up_to_four_mut<'a>(mut it: impl Iterator<Item = &'a mut [f32]>) -> [&'a mut [f32]; HEADS_AT_ONCE] {
    std::array::from_fn(|_| it.next().unwrap_or(&mut []))
}

/// Shortest span for [`split`] (shorter ones keep one task per head
/// group: the extra pool jobs would cost more than the split saves).
const SPLIT_MIN_SPAN: usize = 64;
/// Positions per block in the split score pass (128 key rows of 256 f16: 64 KB, in L2 while
/// the heads of a group beyond the first four score them again).
const SPLIT_BLOCK: usize = 128;

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    /// Checks `scores`/`weighted_sum` over cache rows `k`, `v` of element type `T` against the
    /// per-row `dot` and `axpy` on the rows widened to f32 (`kw`, `vw`), exactly, through the
    /// dispatcher and each SIMD variant this CPU has.
    fn check_attention_kernels<T: KvElem>(hd: usize, rows: usize, k: &[T], v: &[T], q: &[f32], w_all: &[f32]) {
        let kw: Vec<f32> = k.iter().map(|x| x.to_f32()).collect();
        let vw: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
        let ty = std::any::type_name::<T>();
        // 37: more rows than a block of the value-sum kernels (16).
        for span in [0, 1, 3, 4, 5, 9, 37] {
            // Ring-buffer-like order with an odd start offset.
            let offs: Vec<usize> = (0..span).map(|j| ((j * 7 + 3) % rows) * hd + 1).collect();
            let mut got = vec![f32::NAN; span];
            scores(q, k, &offs, 0.37, &mut got);
            let want: Vec<f32> = offs.iter().map(|&o| dot(q, &kw[o..o + hd]) * 0.37).collect();
            assert_eq!(got, want, "scores {ty} hd={hd} span={span}");
            #[cfg(target_arch = "x86_64")]
            if simd::avx2() && hd.is_multiple_of(16) {
                let mut got = vec![f32::NAN; span];
                // SAFETY: the features were checked just above; every row is inside the cache and
                // every output as long as the call writes.
                unsafe { simd::scores(q, k, &offs, 0.37, &mut got) };
                assert_eq!(got, want, "avx2 scores {ty} hd={hd} span={span}");
            }
            #[cfg(target_arch = "x86_64")]
            if simd::avx512() && hd.is_multiple_of(16) {
                let mut got = vec![f32::NAN; span];
                // SAFETY: the features were checked just above; every row is inside the cache and
                // every output as long as the call writes.
                unsafe { simd::scores512(q, k, &offs, 0.37, &mut got) };
                assert_eq!(got, want, "avx512 scores {ty} hd={hd} span={span}");
            }
            let w = &w_all[..span];
            let mut got = vec![f32::NAN; hd];
            weighted_sum(w, v, &offs, &mut got);
            let mut want = vec![0f32; hd];
            for (&wj, &o) in w.iter().zip(&offs) {
                axpy(&mut want, wj, &vw[o..o + hd]);
            }
            assert_eq!(got, want, "weighted_sum {ty} hd={hd} span={span}");
            #[cfg(target_arch = "x86_64")]
            if simd::avx2() && hd.is_multiple_of(8) {
                let mut got = vec![f32::NAN; hd];
                // SAFETY: the features were checked just above; every row is inside the cache and
                // every output as long as the call writes.
                unsafe { simd::weighted_sum(w, v, &offs, &mut got) };
                assert_eq!(got, want, "avx2 weighted_sum {ty} hd={hd} span={span}");
            }
            #[cfg(target_arch = "x86_64")]
            if simd::avx512() && hd == 256 {
                let mut got = vec![f32::NAN; hd];
                // SAFETY: the features were checked just above; every row is inside the cache and
                // every output as long as the call writes.
                unsafe { simd::weighted_sum256(w, v, &offs, &mut got) };
                assert_eq!(got, want, "avx512 weighted_sum {ty} hd={hd} span={span}");
            }
            // Several heads over the same rows (1 to 5 heads: the kernels take four at a time)
            // equal the per-head kernels, for the whole row and for a column slice of it.
            for heads in 1..=5 {
                let qh: Vec<Vec<f32>> = (0..heads).map(|h| (0..hd).map(|i| q[(i + 3 * h) % hd] * (1.0 + 0.1 * h as f32)).collect()).collect();
                let wh: Vec<Vec<f32>> = (0..heads).map(|h| (0..span).map(|j| w_all[(j + 5 * h) % w_all.len()]).collect()).collect();
                let qs: Vec<&[f32]> = qh.iter().map(|x| x.as_slice()).collect();
                let want: Vec<Vec<f32>> = qh
                    .iter()
                    .map(|q| {
                        let mut w = vec![f32::NAN; span];
                        scores(q, k, &offs, 0.37, &mut w);
                        w
                    })
                    .collect();
                // With and without value rows to prefetch (which picks another kernel).
                let pfs = [None, Some(Prefetch { v, offs: &offs, width: hd })];
                for pf in pfs {
                    let mut got = vec![vec![f32::NAN; span]; heads];
                    scores_heads(&qs, k, &offs, 0.37, &mut got.iter_mut().map(|x| x.as_mut_slice()).collect::<Vec<_>>(), pf);
                    assert_eq!(got, want, "scores_heads {ty} hd={hd} span={span} heads={heads} prefetch={}", pf.is_some());
                }
                #[cfg(target_arch = "x86_64")]
                for (wide, pf) in [false, true].into_iter().flat_map(|w| pfs.map(|p| (w, p))) {
                    if simd::avx2() && hd.is_multiple_of(16) && (!wide || simd::avx512()) {
                        let mut got = vec![vec![f32::NAN; span]; heads];
                        let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|x| x.as_mut_slice()).collect();
                        for (q4, o4) in qs.chunks(4).zip(outs.chunks_mut(4)) {
                            // SAFETY: the features were checked just above; every row is inside the cache and
                            // every output as long as the call writes.
                            unsafe { simd::scores_heads_dispatch(q4, k, &offs, 0.37, o4, wide, pf) };
                        }
                        assert_eq!(got, want, "scores_heads wide={wide} prefetch={} {ty} hd={hd} span={span} heads={heads}", pf.is_some());
                    }
                }
                let ws: Vec<&[f32]> = wh.iter().map(|x| x.as_slice()).collect();
                for (c0, width) in [(0, hd), (hd / 2, hd - hd / 2)] {
                    let sub: Vec<usize> = offs.iter().map(|&o| o + c0).collect();
                    let want: Vec<Vec<f32>> = wh
                        .iter()
                        .map(|w| {
                            let mut o = vec![f32::NAN; width];
                            weighted_sum(w, v, &sub, &mut o);
                            o
                        })
                        .collect();
                    let mut got = vec![vec![f32::NAN; width]; heads];
                    weighted_sum_heads(&ws, v, &sub, &mut got.iter_mut().map(|x| x.as_mut_slice()).collect::<Vec<_>>());
                    assert_eq!(got, want, "weighted_sum_heads {ty} hd={hd} span={span} heads={heads} cols {c0}+{width}");
                    #[cfg(target_arch = "x86_64")]
                    for wide in [false, true] {
                        if simd::avx2() && width.is_multiple_of(8) && (!wide || simd::avx512()) {
                            let mut got = vec![vec![f32::NAN; width]; heads];
                            let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|x| x.as_mut_slice()).collect();
                            for (w4, o4) in ws.chunks(4).zip(outs.chunks_mut(4)) {
                                // SAFETY: the features were checked just above; every row is inside the cache and
                                // every output as long as the call writes.
                                unsafe { simd::weighted_sum_heads_dispatch(w4, v, &sub, o4, wide) };
                            }
                            assert_eq!(got, want, "weighted_sum_heads wide={wide} {ty} hd={hd} span={span} heads={heads} cols {c0}+{width}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn attention_kernels_equal_dot_and_axpy() {
        // `scores` and `weighted_sum` must give exactly the per-row `dot` and `axpy` results
        // (decode and prefill share them), for head sizes on and off their SIMD paths, over f32
        // rows and over the f16 rows of the KV cache (widened exactly).
        let mut seed = 7u32;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed % 2001) as f32 / 1000.0 - 1.0
        };
        for hd in [8, 16, 24, 48, 64, 72, 208, 256, 20] {
            let rows = 11;
            let k: Vec<f32> = (0..rows * hd + 5).map(|_| rnd()).collect();
            let v: Vec<f32> = (0..rows * hd + 5).map(|_| rnd()).collect();
            let q: Vec<f32> = (0..hd).map(|_| rnd()).collect();
            let w: Vec<f32> = (0..40).map(|_| rnd()).collect();
            check_attention_kernels(hd, rows, &k, &v, &q, &w);
            let half = |x: &Vec<f32>| x.iter().map(|&y| f16::from_f32(y)).collect::<Vec<f16>>();
            check_attention_kernels(hd, rows, &half(&k), &half(&v), &q, &w);
        }
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn scores_rejects_rows_outside_the_cache() {
        let mut out = [0f32; 1];
        scores(&[1.0; 16], &[0.0f32; 20], &[8], 1.0, &mut out);
    }
}
