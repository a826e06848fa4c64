//! AVX2 + FMA (and AVX-512F where noted) versions of the elementwise ops and attention kernels,
//! chosen at run time by `ops` and `attention` (the crate is built for baseline x86-64).
//!
//! Safety contract of every `unsafe fn` here (upheld by `ops` and `attention`): the CPU has the
//! features its `target_feature` names ([`avx2`] / [`avx512`] said yes), and every row an offset
//! points at lies inside its slice, every output as long as the call writes.

#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

use std::sync::OnceLock;

use crate::backend::cpu::attention::Prefetch;
use crate::backend::cpu::quant::{round_f16, BlockQ8, BlockQ8K, QK, QK_K};
use crate::backend::cpu::vec::{gelu_tanh_mul_generic, silu_mul_generic, softmax_generic, KvElem};

/// AVX2, FMA and F16C present (every AVX2 CPU has F16C; the f16 KV cache loads need it),
/// and `RUVLLM_FORCE_SCALAR` unset.
#[inline]
pub fn avx2() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        let cpu = crate::runtime::cpu();
        cpu.avx2_fma() && cpu.f16c
    })
}

#[target_feature(enable = "avx2,fma")]
pub unsafe fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
    gelu_tanh_mul_generic(gate, up)
}

#[target_feature(enable = "avx2,fma")]
pub unsafe fn silu_mul(gate: &mut [f32], up: &[f32]) {
    silu_mul_generic(gate, up)
}

#[target_feature(enable = "avx2,fma")]
pub unsafe fn softmax_inplace(x: &mut [f32]) {
    softmax_generic(x)
}

/// `Σ a[i]·b[i]` with `b` of either KV element type (f32 for [`dot`](crate::backend::cpu::ops::dot)).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot<T: KvElem>(a: &[f32], b: &[T]) -> f32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut i = 0;
    while i + 16 <= n {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), T::load8(pb.add(i)), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + 8)), T::load8(pb.add(i + 8)), acc1);
        i += 16;
    }
    if i + 8 <= n {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), T::load8(pb.add(i)), acc0);
        i += 8;
    }
    let mut s = hsum2(acc0, acc1);
    while i < n {
        s += a[i] * b[i].to_f32();
        i += 1;
    }
    s
}

/// AVX-512F present as well (and neither `RUVLLM_FORCE_SCALAR` nor `RUVLLM_NO_AVX512` set).
#[inline]
pub fn avx512() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| avx2() && crate::runtime::cpu().avx512f)
}

/// [`scores`](crate::backend::cpu::attention::scores) with 512-bit vectors: lanes 0-7 of a 16-lane accumulator are
/// [`dot`]'s `acc0` and lanes 8-15 its `acc1` (same fused multiply-adds per lane), reduced
/// as `dot` reduces them, so results are identical.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub unsafe fn scores512<T: KvElem>(q: &[f32], k: &[T], offs: &[usize], scale: f32, out: &mut [f32]) {
    let hd = q.len();
    let (pq, pk) = (q.as_ptr(), k.as_ptr());
    let fin = |a: __m512| hsum2(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps::<1>(a));
    let mut j = 0;
    while j + 4 <= offs.len() {
        let rows = [pk.add(offs[j]), pk.add(offs[j + 1]), pk.add(offs[j + 2]), pk.add(offs[j + 3])];
        let mut a = [_mm512_setzero_ps(); 4];
        let mut i = 0;
        while i < hd {
            let qv = _mm512_loadu_ps(pq.add(i));
            for r in 0..4 {
                a[r] = _mm512_fmadd_ps(qv, T::load16(rows[r].add(i)), a[r]);
            }
            i += 16;
        }
        for (r, &ar) in a.iter().enumerate() {
            *out.get_unchecked_mut(j + r) = fin(ar) * scale;
        }
        j += 4;
    }
    while j < offs.len() {
        let row = pk.add(offs[j]);
        let mut a = _mm512_setzero_ps();
        let mut i = 0;
        while i < hd {
            a = _mm512_fmadd_ps(_mm512_loadu_ps(pq.add(i)), T::load16(row.add(i)), a);
            i += 16;
        }
        *out.get_unchecked_mut(j) = fin(a) * scale;
        j += 1;
    }
}

/// [`weighted_sum`](crate::backend::cpu::attention::weighted_sum) for 256 columns with 512-bit vectors: the whole output row in 16
/// registers, each value row read once, front to back.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub unsafe fn weighted_sum256<T: KvElem>(w: &[f32], v: &[T], offs: &[usize], out: &mut [f32]) {
    let pv = v.as_ptr();
    let mut acc = [_mm512_setzero_ps(); 16];
    for (&wj, &off) in w.iter().zip(offs) {
        let wv = _mm512_set1_ps(wj);
        let row = pv.add(off);
        for (r, a) in acc.iter_mut().enumerate() {
            *a = _mm512_fmadd_ps(wv, T::load16(row.add(16 * r)), *a);
        }
    }
    for (r, a) in acc.iter().enumerate() {
        _mm512_storeu_ps(out.as_mut_ptr().add(16 * r), *a);
    }
}

/// The sum of all lanes of `acc0 + acc1`, in [`dot`]'s order.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum2(acc0: __m256, acc1: __m256) -> f32 {
    let acc = _mm256_add_ps(acc0, acc1);
    let r = _mm_add_ps(_mm256_extractf128_ps::<1>(acc), _mm256_castps256_ps128(acc));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    let r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// [`scores`](crate::backend::cpu::attention::scores) for `q.len()` a multiple of 16: per key the two accumulator chains of
/// [`dot`], four keys at a time.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scores<T: KvElem>(q: &[f32], k: &[T], offs: &[usize], scale: f32, out: &mut [f32]) {
    let hd = q.len();
    let (pq, pk) = (q.as_ptr(), k.as_ptr());
    let mut j = 0;
    while j + 4 <= offs.len() {
        let rows = [pk.add(offs[j]), pk.add(offs[j + 1]), pk.add(offs[j + 2]), pk.add(offs[j + 3])];
        let mut a0 = [_mm256_setzero_ps(); 4];
        let mut a1 = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i < hd {
            let (q0, q1) = (_mm256_loadu_ps(pq.add(i)), _mm256_loadu_ps(pq.add(i + 8)));
            for r in 0..4 {
                a0[r] = _mm256_fmadd_ps(q0, T::load8(rows[r].add(i)), a0[r]);
                a1[r] = _mm256_fmadd_ps(q1, T::load8(rows[r].add(i + 8)), a1[r]);
            }
            i += 16;
        }
        for r in 0..4 {
            *out.get_unchecked_mut(j + r) = hsum2(a0[r], a1[r]) * scale;
        }
        j += 4;
    }
    while j < offs.len() {
        *out.get_unchecked_mut(j) = dot(q, std::slice::from_raw_parts(pk.add(offs[j]), hd)) * scale;
        j += 1;
    }
}

/// [`weighted_sum`](crate::backend::cpu::attention::weighted_sum) for `out.len()` a multiple of 8: 64 output columns at a time held
/// in eight registers over all rows, then the remaining columns eight at a time.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn weighted_sum<T: KvElem>(w: &[f32], v: &[T], offs: &[usize], out: &mut [f32]) {
    let hd = out.len();
    let mut c = 0;
    while c + 64 <= hd {
        columns::<T, 8>(w, v, offs, c, out);
        c += 64;
    }
    while c < hd {
        columns::<T, 1>(w, v, offs, c, out);
        c += 8;
    }
}

/// Columns `c..c + 8R` of [`weighted_sum`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn columns<T: KvElem, const R: usize>(w: &[f32], v: &[T], offs: &[usize], c: usize, out: &mut [f32]) {
    let pv = v.as_ptr();
    let mut acc = [_mm256_setzero_ps(); R];
    for (&wj, &off) in w.iter().zip(offs) {
        let wv = _mm256_set1_ps(wj);
        let row = pv.add(off + c);
        for (r, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(wv, T::load8(row.add(8 * r)), *a);
        }
    }
    for (r, a) in acc.iter().enumerate() {
        _mm256_storeu_ps(out.as_mut_ptr().add(c + 8 * r), *a);
    }
}

/// Runs the `H`-head kernels for up to four heads (`qs.len()` of them), the 512-bit ones if
/// `wide`.
///
/// # Safety
/// AVX2, FMA and F16C present (AVX-512F too if `wide`); `qs[h].len()` a multiple of 16, equal for all heads; every
/// key row `offs[j]..offs[j] + hd` inside `k`; every `outs[h]` at least `offs.len()` long.
pub unsafe fn scores_heads_dispatch<T: KvElem>(
    qs: &[&[f32]],
    k: &[T],
    offs: &[usize],
    scale: f32,
    outs: &mut [&mut [f32]],
    wide: bool,
    v: Option<Prefetch<T>>,
) {
    unsafe fn run<T: KvElem, const H: usize>(qs: &[&[f32]], k: &[T], offs: &[usize], scale: f32, outs: &mut [&mut [f32]], wide: bool, v: Option<Prefetch<T>>) {
        let hd = qs[0].len();
        let q: [*const f32; H] = std::array::from_fn(|h| qs[h].as_ptr());
        let o: [*mut f32; H] = std::array::from_fn(|h| outs[h].as_mut_ptr());
        // With value rows to prefetch (decode: the cache comes from DRAM), one key row at a
        // time: a single sequential stream, which the hardware prefetchers follow (the 512-bit
        // kernel's four rows at once ran 1.4–1.8× slower on a cold cache, the value rows'
        // prefetches added); else, with AVX-512, four rows at a time.
        if wide && v.is_none() {
            scores_heads512::<T, H>(q, hd, k.as_ptr(), offs, scale, o)
        } else {
            scores_heads256::<T, H>(q, hd, k.as_ptr(), offs, scale, o, v)
        }
    }
    match qs.len() {
        1 => run::<T, 1>(qs, k, offs, scale, outs, wide, v),
        2 => run::<T, 2>(qs, k, offs, scale, outs, wide, v),
        3 => run::<T, 3>(qs, k, offs, scale, outs, wide, v),
        _ => run::<T, 4>(qs, k, offs, scale, outs, wide, v),
    }
}

/// Prefetches, while the key rows are scored, the value rows a [`Prefetch`] lists, spread evenly
/// over the `n` key rows (no division per row), so the value sums
/// that follow find them in the caches rather than in DRAM: the token's weight stream evicts
/// the KV cache every token, and a value pass reads each row in 16–64-byte slices, one slice
/// per row per pass, which the hardware prefetchers do not follow. Into L2 (`prefetcht1`), not
/// L1: a thread's value columns of one layer (128 KiB at 512 positions) would only push the keys
/// it is scoring out of L1, and the split value pass took 12–14 µs per layer against 16–18 with
/// `prefetcht0` (2 threads, AVX2, 512 positions; decode 1.02–1.07× where this machine's 2-thread
/// bandwidth was high, 1.00× where it was low or at 1 thread).
struct Share<'a, T> {
    pv: *const T,
    offs: &'a [usize],
    bytes: usize,
    /// Rows per key row, the remainder spread Bresenham-style.
    per: usize,
    extra: usize,
    n: usize,
    acc: usize,
    next: usize,
}

impl<'a, T> Share<'a, T> {
    fn new(pf: Option<Prefetch<'a, T>>, n: usize) -> Option<Self> {
        let Prefetch { v, offs, width } = pf?;
        (n > 0).then(|| Share { pv: v.as_ptr(), offs, bytes: width * std::mem::size_of::<T>(), per: offs.len() / n, extra: offs.len() % n, n, acc: 0, next: 0 })
    }

    /// The next key row's share.
    #[inline(always)]
    unsafe fn step(&mut self) {
        let mut count = self.per;
        self.acc += self.extra;
        if self.acc >= self.n {
            self.acc -= self.n;
            count += 1;
        }
        let end = (self.next + count).min(self.offs.len());
        for &off in &self.offs[self.next..end] {
            let p = self.pv.add(off) as *const i8;
            for b in (0..self.bytes).step_by(64) {
                _mm_prefetch::<_MM_HINT_T1>(p.add(b));
            }
        }
        self.next = end;
    }
}

/// `H` heads of [`scores_heads`](crate::backend::cpu::attention::scores_heads) with 512-bit vectors, four key rows at a time: per
/// (row, head) the accumulator and reduction of [`scores512`], so results are identical.
#[allow(clippy::needless_range_loop)] // register arrays indexed in step
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn scores_heads512<T: KvElem, const H: usize>(q: [*const f32; H], hd: usize, pk: *const T, offs: &[usize], scale: f32, out: [*mut f32; H]) {
    let fin = |a: __m512| hsum2(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps::<1>(a));
    let mut j = 0;
    while j + 4 <= offs.len() {
        let rows = [pk.add(offs[j]), pk.add(offs[j + 1]), pk.add(offs[j + 2]), pk.add(offs[j + 3])];
        // The next four rows are fetched while these are scored (the cache rows come from
        // DRAM: the weight stream of the token evicts them).
        let next = if j + 8 <= offs.len() { [pk.add(offs[j + 4]), pk.add(offs[j + 5]), pk.add(offs[j + 6]), pk.add(offs[j + 7])] } else { rows };
        let mut a = [[_mm512_setzero_ps(); 4]; H];
        let mut i = 0;
        while i < hd {
            for n in next {
                _mm_prefetch::<_MM_HINT_T0>(n.add(i) as *const i8);
            }
            let kv = [T::load16(rows[0].add(i)), T::load16(rows[1].add(i)), T::load16(rows[2].add(i)), T::load16(rows[3].add(i))];
            for h in 0..H {
                let qv = _mm512_loadu_ps(q[h].add(i));
                for r in 0..4 {
                    a[h][r] = _mm512_fmadd_ps(qv, kv[r], a[h][r]);
                }
            }
            i += 16;
        }
        for h in 0..H {
            for r in 0..4 {
                *out[h].add(j + r) = fin(a[h][r]) * scale;
            }
        }
        j += 4;
    }
    while j < offs.len() {
        let row = pk.add(offs[j]);
        let mut a = [_mm512_setzero_ps(); H];
        let mut i = 0;
        while i < hd {
            let kv = T::load16(row.add(i));
            for h in 0..H {
                a[h] = _mm512_fmadd_ps(_mm512_loadu_ps(q[h].add(i)), kv, a[h]);
            }
            i += 16;
        }
        for h in 0..H {
            *out[h].add(j) = fin(a[h]) * scale;
        }
        j += 1;
    }
}

/// `H` heads of [`scores_heads`](crate::backend::cpu::attention::scores_heads) with 256-bit vectors, one key row at a time: per
/// (row, head) the two accumulator chains of [`dot`], so results are identical.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_heads256<T: KvElem, const H: usize>(
    q: [*const f32; H],
    hd: usize,
    pk: *const T,
    offs: &[usize],
    scale: f32,
    out: [*mut f32; H],
    pf: Option<Prefetch<T>>,
) {
    let mut share = Share::new(pf, offs.len());
    for (j, &off) in offs.iter().enumerate() {
        if let Some(share) = share.as_mut() {
            share.step();
        }
        let row = pk.add(off);
        let mut a0 = [_mm256_setzero_ps(); H];
        let mut a1 = [_mm256_setzero_ps(); H];
        let mut i = 0;
        while i < hd {
            let (k0, k1) = (T::load8(row.add(i)), T::load8(row.add(i + 8)));
            for h in 0..H {
                a0[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q[h].add(i)), k0, a0[h]);
                a1[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q[h].add(i + 8)), k1, a1[h]);
            }
            i += 16;
        }
        for h in 0..H {
            *out[h].add(j) = hsum2(a0[h], a1[h]) * scale;
        }
    }
}

/// Runs the `H`-head value kernels for up to four heads (`outs.len()` of them), the 512-bit
/// ones if `wide`.
///
/// # Safety
/// AVX2, FMA and F16C present (AVX-512F too if `wide`); every `outs[h]` of the same length, a multiple of 8; every
/// value row `offs[j]..offs[j] + width` inside `v`; every `ws[h]` at least `offs.len()` long.
pub unsafe fn weighted_sum_heads_dispatch<T: KvElem>(ws: &[&[f32]], v: &[T], offs: &[usize], outs: &mut [&mut [f32]], wide: bool) {
    unsafe fn run<T: KvElem, const H: usize>(ws: &[&[f32]], v: &[T], offs: &[usize], outs: &mut [&mut [f32]], wide: bool) {
        let width = outs[0].len();
        let o: [*mut f32; H] = std::array::from_fn(|h| outs[h].as_mut_ptr());
        let pv = v.as_ptr();
        // Rows in blocks of `ROWS` (8 KiB of half-precision values at width 256): a column
        // pass reads 16–64 bytes of each row, so every pass after a block's first finds its
        // rows in L1 (the scores pass has prefetched them from DRAM into the caches, see
        // `scores_heads_dispatch`). The sums go through `out` between blocks unchanged, so each
        // element's multiply-adds run in the same order as in one pass over all rows.
        const ROWS: usize = 16;
        if offs.is_empty() {
            for oh in o {
                std::ptr::write_bytes(oh, 0, width);
            }
            return;
        }
        for (bi, block) in offs.chunks(ROWS).enumerate() {
            let w: [*const f32; H] = std::array::from_fn(|h| ws[h].as_ptr().add(bi * ROWS));
            let first = bi == 0;
            let mut c = 0;
            if wide {
                while c + 64 <= width {
                    heads_columns512::<T, H, 4>(w, pv, block, c, o, first);
                    c += 64;
                }
                while c + 16 <= width {
                    heads_columns512::<T, H, 1>(w, pv, block, c, o, first);
                    c += 16;
                }
            }
            while c + 16 <= width {
                heads_columns256::<T, H, 2>(w, pv, block, c, o, first);
                c += 16;
            }
            while c < width {
                heads_columns256::<T, H, 1>(w, pv, block, c, o, first);
                c += 8;
            }
        }
    }
    match outs.len() {
        1 => run::<T, 1>(ws, v, offs, outs, wide),
        2 => run::<T, 2>(ws, v, offs, outs, wide),
        3 => run::<T, 3>(ws, v, offs, outs, wide),
        _ => run::<T, 4>(ws, v, offs, outs, wide),
    }
}

/// Columns `c..c + 16R` of `H` heads' value sums in registers over the rows of `offs` (`w`: their
/// weights), starting from zero if `first`, else from `out`; each row's columns widened once for
/// the heads; per element the fused multiply-adds of [`columns`].
#[inline]
#[allow(clippy::needless_range_loop)] // register arrays indexed in step
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn heads_columns512<T: KvElem, const H: usize, const R: usize>(
    w: [*const f32; H],
    pv: *const T,
    offs: &[usize],
    c: usize,
    out: [*mut f32; H],
    first: bool,
) {
    let mut acc = [[_mm512_setzero_ps(); R]; H];
    if !first {
        for h in 0..H {
            for r in 0..R {
                acc[h][r] = _mm512_loadu_ps(out[h].add(c + 16 * r));
            }
        }
    }
    for (j, &off) in offs.iter().enumerate() {
        let row = pv.add(off + c);
        let mut x = [_mm512_setzero_ps(); R];
        for (r, xr) in x.iter_mut().enumerate() {
            *xr = T::load16(row.add(16 * r));
        }
        for h in 0..H {
            let wv = _mm512_set1_ps(*w[h].add(j));
            for r in 0..R {
                acc[h][r] = _mm512_fmadd_ps(wv, x[r], acc[h][r]);
            }
        }
    }
    for h in 0..H {
        for r in 0..R {
            _mm512_storeu_ps(out[h].add(c + 16 * r), acc[h][r]);
        }
    }
}

/// [`heads_columns512`] with 256-bit vectors: columns `c..c + 8R`.
#[inline]
#[allow(clippy::needless_range_loop)] // register arrays indexed in step
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn heads_columns256<T: KvElem, const H: usize, const R: usize>(
    w: [*const f32; H],
    pv: *const T,
    offs: &[usize],
    c: usize,
    out: [*mut f32; H],
    first: bool,
) {
    let mut acc = [[_mm256_setzero_ps(); R]; H];
    if !first {
        for h in 0..H {
            for r in 0..R {
                acc[h][r] = _mm256_loadu_ps(out[h].add(c + 8 * r));
            }
        }
    }
    for (j, &off) in offs.iter().enumerate() {
        let row = pv.add(off + c);
        let mut x = [_mm256_setzero_ps(); R];
        for (r, xr) in x.iter_mut().enumerate() {
            *xr = T::load8(row.add(8 * r));
        }
        for h in 0..H {
            let wv = _mm256_set1_ps(*w[h].add(j));
            for r in 0..R {
                acc[h][r] = _mm256_fmadd_ps(wv, x[r], acc[h][r]);
            }
        }
    }
    for h in 0..H {
        for r in 0..R {
            _mm256_storeu_ps(out[h].add(c + 8 * r), acc[h][r]);
        }
    }
}

/// `out += w * v` with `v` of either element type (f32 for [`axpy`](crate::backend::cpu::ops::axpy)).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn axpy<T: KvElem>(out: &mut [f32], w: f32, v: &[T]) {
    let n = out.len().min(v.len());
    let (po, pv) = (out.as_mut_ptr(), v.as_ptr());
    let wv = _mm256_set1_ps(w);
    let mut i = 0;
    while i + 8 <= n {
        _mm256_storeu_ps(po.add(i), _mm256_fmadd_ps(wv, T::load8(pv.add(i)), _mm256_loadu_ps(po.add(i))));
        i += 8;
    }
    while i < n {
        out[i] += w * v[i].to_f32();
        i += 1;
    }
}

/// The largest `|v|` of `n` floats at `p` (a multiple of 8), NaNs ignored as `f32::max` ignores
/// them (`vmaxps` returns its second operand when either is NaN); the maximum of a set does not
/// depend on the order it is taken in, so this is the scalar loop's value.
#[inline(always)]
unsafe fn abs_max(p: *const f32, n: usize) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_setzero_ps();
    for i in (0..n).step_by(8) {
        m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(i))), m);
    }
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2)))
}

/// The low bytes of eight i32 lanes (`as i8`, wrapping) at `q`.
#[inline(always)]
unsafe fn store_i8x8(q: *mut i8, v: __m256i) {
    let low = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    let b = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, low), _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
    _mm_storel_epi64(q as *mut __m128i, _mm256_castsi256_si128(b));
}

/// ggml's `nearest_int` (`quant::nearest_int`) on eight lanes, the same operations: the
/// 1.5·2^23 addition, the mantissa bits, minus 2^22.
#[inline(always)]
unsafe fn nearest_int8(x: __m256) -> __m256i {
    let v = _mm256_castps_si256(_mm256_add_ps(x, _mm256_set1_ps(12582912.0)));
    _mm256_sub_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x007f_ffff)), _mm256_set1_epi32(0x0040_0000))
}

/// The sum of the eight i32 lanes.
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s)))
}

/// [`quantize_act_q8`](crate::backend::cpu::quant::quantize_act_q8) with AVX2, bit for bit:
/// the same amax, `v · (127/amax)` products, `nearest_int` and wrapping `as i8`, for any input.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn quantize_act_q8(x: &[f32], out: &mut [BlockQ8]) {
    assert_eq!(x.len(), out.len() * QK);
    for (xb, yb) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let p = xb.as_ptr();
        let amax = abs_max(p, QK);
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let mut sum = _mm256_setzero_si256();
        for i in (0..QK).step_by(8) {
            let q = nearest_int8(_mm256_mul_ps(_mm256_loadu_ps(p.add(i)), id));
            sum = _mm256_add_epi32(sum, q);
            store_i8x8(yb.qs.as_mut_ptr().add(i), q);
        }
        let sum = hsum_i32(sum);
        yb.d = round_f16(d);
        yb.s = round_f16(d * sum as f32);
        yb.qsum = sum;
    }
}

/// [`quantize_act_q8k`](crate::backend::cpu::quant::quantize_act_q8k) with AVX2, bit for bit:
/// the value of the first element of largest magnitude, then the same products, `nearest_int`,
/// clamp at 127, wrapping `as i8` and sums of the stored bytes in 16s, for any input.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn quantize_act_q8k(x: &[f32], out: &mut [BlockQ8K]) {
    assert_eq!(x.len(), out.len() * QK_K);
    for (xb, yb) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let p = xb.as_ptr();
        let amax = abs_max(p, QK_K);
        if amax == 0.0 {
            yb.d = 0.0;
            yb.qs = [0; QK_K];
            yb.bsums = [0; QK_K / 16];
            continue;
        }
        // The scalar loop keeps the first element whose magnitude beats every earlier one.
        let max = xb.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
        let iscale = -127.0 / max;
        let (is, top) = (_mm256_set1_ps(iscale), _mm256_set1_epi32(127));
        for j in 0..QK_K / 16 {
            let mut s = _mm256_setzero_si256();
            for h in 0..2 {
                let i = 16 * j + 8 * h;
                let q = _mm256_min_epi32(nearest_int8(_mm256_mul_ps(is, _mm256_loadu_ps(p.add(i)))), top);
                // The stored bytes' values (sign-extended low byte), as the scalar sums them.
                s = _mm256_add_epi32(s, _mm256_srai_epi32::<24>(_mm256_slli_epi32::<24>(q)));
                store_i8x8(yb.qs.as_mut_ptr().add(i), q);
            }
            yb.bsums[j] = hsum_i32(s) as i16;
        }
        yb.d = 1.0 / iscale;
    }
}
