//! Tiled ("flash") attention for prefill: the queries of several tokens and of every head of a
//! KV group go through the cache's key and value rows together, a block of positions at a
//! time, with an online softmax, so each key and value row is read (and widened) once per tile
//! instead of once per query.
//!
//! Layout: a tile holds up to [`LANES`] query rows (token × head); every per-row quantity is a
//! lane of a `[f32; LANES]` vector. The queries are stored transposed (`qt[d][lane]`), so the
//! scores of a key are `Σ_d k[d] · qt[d]`: a broadcast key element times a vector of queries,
//! with no horizontal sums; the softmax statistics and the output (`ot[d][lane]`) are lane-wise
//! as well. The kernels are generic over the lane vector ([`Lanes`]): AVX-512 or AVX2
//! registers with fused multiply-adds on x86, a plain array elsewhere.
//!
//! Every lane runs the same operations whatever the tile holds: blocks start at multiples of
//! [`BLOCK`] positions, a position outside a row's span contributes exactly nothing (its
//! weight is 0, and a block with none of the row's positions leaves its maximum, sum and
//! output as they were), so a row's result does not depend on the other rows of its tile, on
//! how the tokens were batched or on the thread count. It differs from the per-query kernels
//! (`attention::rows`, which decode uses) by rounding only: the softmax is accumulated block
//! by block instead of over the whole row at once.

use super::attention::Call;
use super::vec::{exp_approx, KvElem};
use crate::runtime::SharedMut;

/// Query rows per tile.
pub const LANES: usize = 32;
/// Key and value positions per block.
const BLOCK: usize = 64;

/// Calls of fewer tokens (decode) use the per-query kernels. Every prefill of two tokens or
/// more is tiled, so the suffix a prefix-cache hit evaluates gets the same bits as a fresh
/// prefill of the whole prompt (a row's result does not depend on its tile).
pub const MIN_TOKENS: usize = 2;

/// A vector of [`LANES`] f32, one per query row of a tile: the x86 variants hold it in two
/// 512-bit or four 256-bit registers and multiply-add fused; the portable one is an array
/// (the compiler vectorizes what it can) with two roundings per multiply-add where the target
/// has no fused one.
///
/// Safety contract of the methods: the CPU has the features of the variant, and every pointer
/// has [`LANES`] readable (writable) f32.
trait Lanes: Copy {
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(self, p: *mut f32);
    unsafe fn splat(x: f32) -> Self;
    /// `a · b + c` with `a` broadcast.
    unsafe fn madd(a: f32, b: Self, c: Self) -> Self;
    unsafe fn mul(self, o: Self) -> Self;
    unsafe fn add(self, o: Self) -> Self;
    unsafe fn sub(self, o: Self) -> Self;
    unsafe fn max(self, o: Self) -> Self;
}

#[derive(Clone, Copy)]
struct Array([f32; LANES]);

impl Array {
    #[inline(always)]
    fn zip(self, o: Self, f: impl Fn(f32, f32) -> f32) -> Self {
        Array(std::array::from_fn(|l| f(self.0[l], o.0[l])))
    }
}

impl Lanes for Array {
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        Array(std::ptr::read_unaligned(p as *const [f32; LANES]))
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        std::ptr::write_unaligned(p as *mut [f32; LANES], self.0)
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        Array([x; LANES])
    }
    #[inline(always)]
    unsafe fn madd(a: f32, b: Self, c: Self) -> Self {
        // aarch64 always has fused multiply-adds; baseline x86-64 does not.
        if cfg!(target_arch = "aarch64") {
            b.zip(c, |b, c| a.mul_add(b, c))
        } else {
            b.zip(c, |b, c| a * b + c)
        }
    }
    #[inline(always)]
    unsafe fn mul(self, o: Self) -> Self {
        self.zip(o, |a, b| a * b)
    }
    #[inline(always)]
    unsafe fn add(self, o: Self) -> Self {
        self.zip(o, |a, b| a + b)
    }
    #[inline(always)]
    unsafe fn sub(self, o: Self) -> Self {
        self.zip(o, |a, b| a - b)
    }
    #[inline(always)]
    unsafe fn max(self, o: Self) -> Self {
        self.zip(o, f32::max)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Lanes, LANES};
    use std::arch::x86_64::*;

    /// `self` op `o`, vector by vector.
    macro_rules! lanewise {
        ($a:expr, $b:expr, $w:literal, $op:ident) => {{
            let (a, b) = ($a, $b);
            let mut r = a;
            for i in 0..LANES / $w {
                r.0[i] = $op(a.0[i], b.0[i]);
            }
            r
        }};
    }

    macro_rules! lanes {
        ($name:ident, $v:ty, $w:literal, $load:ident, $store:ident, $set1:ident, $fmadd:ident, $mul:ident, $add:ident, $sub:ident, $max:ident) => {
            #[derive(Clone, Copy)]
            pub struct $name([$v; LANES / $w]);

            // Loops, not `std::array::from_fn`: a closure does not inherit the caller's target
            // features, so the intrinsics inside it would not be inlined.
            impl Lanes for $name {
                #[inline(always)]
                unsafe fn load(p: *const f32) -> Self {
                    let mut r = $name([$set1(0.0); LANES / $w]);
                    for i in 0..LANES / $w {
                        r.0[i] = $load(p.add(i * $w));
                    }
                    r
                }
                #[inline(always)]
                unsafe fn store(self, p: *mut f32) {
                    for i in 0..LANES / $w {
                        $store(p.add(i * $w), self.0[i]);
                    }
                }
                #[inline(always)]
                unsafe fn splat(x: f32) -> Self {
                    $name([$set1(x); LANES / $w])
                }
                #[inline(always)]
                unsafe fn madd(a: f32, b: Self, c: Self) -> Self {
                    let (a, mut r) = ($set1(a), c);
                    for i in 0..LANES / $w {
                        r.0[i] = $fmadd(a, b.0[i], c.0[i]);
                    }
                    r
                }
                #[inline(always)]
                unsafe fn mul(self, o: Self) -> Self {
                    lanewise!(self, o, $w, $mul)
                }
                #[inline(always)]
                unsafe fn add(self, o: Self) -> Self {
                    lanewise!(self, o, $w, $add)
                }
                #[inline(always)]
                unsafe fn sub(self, o: Self) -> Self {
                    lanewise!(self, o, $w, $sub)
                }
                #[inline(always)]
                unsafe fn max(self, o: Self) -> Self {
                    lanewise!(self, o, $w, $max)
                }
            }
        };
    }

    lanes!(Z512, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_mul_ps, _mm512_add_ps, _mm512_sub_ps, _mm512_max_ps);
    lanes!(Y256, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_mul_ps, _mm256_add_ps, _mm256_sub_ps, _mm256_max_ps);
}

/// Copies a cache row into f32 (exactly): SIMD conversion of the f16 cache on x86.
trait Widen {
    fn widen<T: KvElem>(src: &[T], dst: &mut [f32]);
}

struct Scalar;
impl Widen for Scalar {
    #[inline(always)]
    fn widen<T: KvElem>(src: &[T], dst: &mut [f32]) {
        dst.iter_mut().zip(src).for_each(|(d, s)| *d = s.to_f32());
    }
}

#[cfg(target_arch = "x86_64")]
struct Simd8;
#[cfg(target_arch = "x86_64")]
impl Widen for Simd8 {
    #[inline(always)]
    fn widen<T: KvElem>(src: &[T], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: only called from the AVX-512 and AVX2 variants (the CPU has AVX2 and
            // F16C); `i + 8` elements lie inside both slices.
            unsafe { std::arch::x86_64::_mm256_storeu_ps(dst.as_mut_ptr().add(i), T::load8(src.as_ptr().add(i))) };
            i += 8;
        }
        Scalar::widen(&src[i..n], &mut dst[i..n]);
    }
}

/// One tile's per-thread buffers: the transposed queries, a block of widened key (then
/// value) rows, the block's scores (then weights) and the transposed output.
#[derive(Default)]
struct Scratch {
    qt: Vec<f32>,
    rows: Vec<f32>,
    s: Vec<f32>,
    ot: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// A tile: its rows' token indices and heads (lane `i` is token `t0 + i / heads`, head
/// `h0 + i % heads`), KV head `g`.
#[derive(Clone, Copy)]
struct Tile {
    t0: usize,
    tokens: usize,
    h0: usize,
    heads: usize,
    g: usize,
}

/// Runs `c` (prefill of `c.n >= MIN_TOKENS` tokens) over key and value rows `kc`, `vc`.
pub fn run<T: KvElem>(c: Call, kc: &[T], vc: &[T]) {
    let (n, pos0, span) = (c.n, c.pos0, c.span);
    let (hd, n_head, n_kv) = (c.shape.head_dim, c.shape.n_head, c.shape.n_kv_head);
    let group = n_head / n_kv;
    // Heads per tile (all of the group where it fits) and tokens per tile.
    let heads = group.min(LANES);
    let subs = group.div_ceil(heads);
    let per_tile = LANES / heads;
    let tiles = n.div_ceil(per_tile);
    let attn = SharedMut(c.attn.as_mut_ptr());
    let (q_all, cache, stored) = (c.q, c.cache, pos0 + n);
    let kv_row = n_kv * hd;
    let shape = c.shape;
    let task = |i: usize| {
        // The last tokens (the longest spans) first, so that the threads finish together.
        let (tile, rest) = (tiles - 1 - i / (n_kv * subs), i % (n_kv * subs));
        let (g, sub) = (rest / subs, rest % subs);
        let t0 = tile * per_tile;
        let h0 = g * group + sub * heads;
        let tl = Tile { t0, tokens: per_tile.min(n - t0), h0, heads: heads.min(g * group + group - h0), g };
        SCRATCH.with(|cell| {
            let sc = &mut *cell.borrow_mut();
            let (mut lo, mut hi) = ([0; LANES], [usize::MAX; LANES]);
            let (mut first, mut last) = (usize::MAX, 0);
            for tt in 0..tl.tokens {
                let (l, cnt) = span.of(pos0 + tl.t0 + tt, stored);
                (first, last) = (first.min(l), last.max(l + cnt - 1));
                for hh in 0..tl.heads {
                    (lo[tt * tl.heads + hh], hi[tt * tl.heads + hh]) = (l, l + cnt - 1);
                }
            }
            sc.qt.clear();
            sc.qt.resize(hd * LANES, 0.0);
            for tt in 0..tl.tokens {
                for hh in 0..tl.heads {
                    let q = &q_all[(tl.t0 + tt) * n_head * hd + (tl.h0 + hh) * hd..][..hd];
                    for (d, &x) in q.iter().enumerate() {
                        sc.qt[d * LANES + tt * tl.heads + hh] = x * shape.scale;
                    }
                }
            }
            let key_row = |p: usize| cache.slot(p) * kv_row + tl.g * hd;
            let args = Args { hd, first, last, lo: &lo, hi: &hi, softcap: shape.softcap, kc, vc, row: &key_row };
            tile_dispatch(&args, sc);
            for tt in 0..tl.tokens {
                for hh in 0..tl.heads {
                    let lane = tt * tl.heads + hh;
                    // SAFETY: the tile owns the outputs of its tokens' heads h0..h0 + heads:
                    // disjoint across tasks.
                    let out = unsafe { std::slice::from_raw_parts_mut(attn.ptr().add((tl.t0 + tt) * n_head * hd + (tl.h0 + hh) * hd), hd) };
                    // The final normalization; `s` holds the sums (see `tile`).
                    let inv = 1.0 / sc.s[lane];
                    for (d, o) in out.iter_mut().enumerate() {
                        *o = sc.ot[d * LANES + lane] * inv;
                    }
                }
            }
        });
    };
    c.pool.for_each(tiles * n_kv * subs, &task);
}

/// What a tile's kernel reads: head size, per-lane first and last visible positions (lanes
/// without a row: every position, their results unused), the soft-cap, the cache rows and
/// where position `p`'s row of the tile's KV head starts.
struct Args<'a, T> {
    hd: usize,
    /// The first and last position any row sees.
    first: usize,
    last: usize,
    lo: &'a [usize; LANES],
    hi: &'a [usize; LANES],
    softcap: Option<f32>,
    kc: &'a [T],
    vc: &'a [T],
    row: &'a dyn Fn(usize) -> usize,
}

fn tile_dispatch<T: KvElem>(a: &Args<T>, sc: &mut Scratch) {
    #[cfg(target_arch = "x86_64")]
    {
        use super::arch::x86::vec as simd;
        if simd::avx512() {
            // SAFETY: AVX-512F, AVX2, FMA and F16C were detected.
            return unsafe { tile_avx512(a, sc) };
        }
        if simd::avx2() {
            // SAFETY: AVX2, FMA and F16C were detected.
            return unsafe { tile_avx2(a, sc) };
        }
    }
    // SAFETY: the array variant needs no CPU feature.
    unsafe { tile::<T, Array, Scalar, 4, 4>(a, sc) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn tile_avx512<T: KvElem>(a: &Args<T>, sc: &mut Scratch) {
    tile::<T, x86::Z512, Simd8, 6, 6>(a, sc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_avx2<T: KvElem>(a: &Args<T>, sc: &mut Scratch) {
    tile::<T, x86::Y256, Simd8, 2, 2>(a, sc)
}

/// One tile over every block any of its rows sees. `KB` keys per pass in the score loop,
/// `DB` head dimensions per pass in the value loop (register blocking only: each lane's
/// operations are the same for any `KB`, `DB`). Leaves the output, unnormalized, in `ot` and
/// each lane's softmax sum in `s[..LANES]`.
///
/// Safety: the CPU has the features of `V` and `W`.
#[inline(always)]
unsafe fn tile<T: KvElem, V: Lanes, W: Widen, const KB: usize, const DB: usize>(a: &Args<T>, sc: &mut Scratch) {
    let hd = a.hd;
    let (first, last) = (a.first, a.last);
    sc.ot.clear();
    sc.ot.resize(hd * LANES, 0.0);
    sc.rows.resize(BLOCK * hd, 0.0);
    sc.s.resize(BLOCK * LANES, 0.0);
    let mut m = [f32::NEG_INFINITY; LANES];
    let mut sum = V::splat(0.0);
    let mut b0 = first / BLOCK * BLOCK;
    while b0 <= last {
        let b1 = (b0 + BLOCK).min(last + 1);
        let bk = b1 - b0;
        widen_block::<T, W>(a, a.kc, b0, bk, &mut sc.rows);
        scores::<V, KB>(&sc.qt, &sc.rows, bk, hd, &mut sc.s);
        let alpha = weights::<T, V>(&mut sc.s[..bk * LANES], b0, a, &mut m, &mut sum);
        widen_block::<T, W>(a, a.vc, b0, bk, &mut sc.rows);
        values::<V, DB>(&sc.s, &sc.rows, bk, hd, &mut sc.ot, alpha);
        b0 += BLOCK;
    }
    sum.store(sc.s.as_mut_ptr());
}

/// The cache rows (of `src`: keys or values) of positions `b0..b0 + bk`, widened into
/// consecutive rows of `rows`.
#[inline(always)]
fn widen_block<T: KvElem, W: Widen>(a: &Args<T>, src: &[T], b0: usize, bk: usize, rows: &mut [f32]) {
    for (j, dst) in rows.chunks_exact_mut(a.hd).take(bk).enumerate() {
        let o = (a.row)(b0 + j);
        W::widen(&src[o..o + a.hd], dst);
    }
}

/// `s[j][lane] = Σ_d k[j][d] · qt[d][lane]` for the `bk` key rows of `k`, `KB` at a time.
#[inline(always)]
unsafe fn scores<V: Lanes, const KB: usize>(qt: &[f32], k: &[f32], bk: usize, hd: usize, s: &mut [f32]) {
    assert!(qt.len() >= hd * LANES && k.len() >= bk * hd && s.len() >= bk * LANES);
    let (qt, k, s) = (qt.as_ptr(), k.as_ptr(), s.as_mut_ptr());
    let mut j = 0;
    while j + KB <= bk {
        score_keys::<V, KB>(qt, k, j, hd, s);
        j += KB;
    }
    for j in j..bk {
        score_keys::<V, 1>(qt, k, j, hd, s);
    }
}

/// [`scores`] of keys `j..j + K`.
#[inline(always)]
unsafe fn score_keys<V: Lanes, const K: usize>(qt: *const f32, k: *const f32, j: usize, hd: usize, s: *mut f32) {
    let mut acc = [V::splat(0.0); K];
    for d in 0..hd {
        let q = V::load(qt.add(d * LANES));
        for (kk, acc) in acc.iter_mut().enumerate() {
            *acc = V::madd(*k.add((j + kk) * hd + d), q, *acc);
        }
    }
    for (kk, acc) in acc.iter().enumerate() {
        acc.store(s.add((j + kk) * LANES));
    }
}

/// The online softmax over a block of scores starting at position `p0`: masks the positions
/// outside each lane's span, raises the running maximum `m`, turns the scores into weights
/// `exp(s - m)` (0 where masked) in place, adds them to `sum` and returns the factor the
/// output is rescaled by (the sum was rescaled by it).
#[inline(always)]
unsafe fn weights<T, V: Lanes>(s: &mut [f32], p0: usize, a: &Args<T>, m: &mut [f32; LANES], sum: &mut V) -> V {
    if let Some(cap) = a.softcap {
        let inv = 1.0 / cap;
        s.iter_mut().for_each(|x| *x = (*x * inv).tanh() * cap);
    }
    let rows = s.len() / LANES;
    // Masking only where some lane does not see every position of the block.
    if (0..LANES).any(|l| a.lo[l] > p0 || a.hi[l] < p0 + rows - 1) {
        for (j, row) in s.chunks_exact_mut(LANES).enumerate() {
            for ((x, &lo), &hi) in row.iter_mut().zip(a.lo).zip(a.hi) {
                if p0 + j < lo || p0 + j > hi {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
    }
    let ps = s.as_mut_ptr();
    let mut bmax = V::splat(f32::NEG_INFINITY);
    for j in 0..rows {
        bmax = bmax.max(V::load(ps.add(j * LANES)));
    }
    let mut bm = [0f32; LANES];
    bmax.store(bm.as_mut_ptr());
    let mut alpha = [1f32; LANES];
    let mut sub = [0f32; LANES];
    for l in 0..LANES {
        let mn = m[l].max(bm[l]);
        // A lane whose maximum did not rise keeps its sums exactly (factor 1); from -inf (no
        // position yet) the factor is exp_approx(-inf) = 0, on sums that are 0.
        if mn > m[l] {
            alpha[l] = exp_approx(m[l] - mn);
        }
        m[l] = mn;
        // Masked scores are -inf and give exp_approx(-inf) = 0; a lane with no position yet
        // subtracts 0, not -inf.
        sub[l] = if mn == f32::NEG_INFINITY { 0.0 } else { mn };
    }
    let sub = V::load(sub.as_ptr());
    for j in 0..rows {
        V::load(ps.add(j * LANES)).sub(sub).store(ps.add(j * LANES));
    }
    // A plain loop over the block, which the compiler vectorizes.
    s.iter_mut().for_each(|x| *x = exp_approx(*x));
    let mut bsum = V::splat(0.0);
    for j in 0..rows {
        bsum = bsum.add(V::load(ps.add(j * LANES)));
    }
    let alpha = V::load(alpha.as_ptr());
    *sum = sum.mul(alpha).add(bsum);
    alpha
}

/// `ot[d][lane] = ot[d][lane] · alpha[lane] + Σ_j v[j][d] · w[j][lane]`, `DB` dimensions at a
/// time.
#[inline(always)]
unsafe fn values<V: Lanes, const DB: usize>(w: &[f32], v: &[f32], bk: usize, hd: usize, ot: &mut [f32], alpha: V) {
    assert!(w.len() >= bk * LANES && v.len() >= bk * hd && ot.len() >= hd * LANES);
    let (w, v, ot) = (w.as_ptr(), v.as_ptr(), ot.as_mut_ptr());
    let mut d0 = 0;
    while d0 + DB <= hd {
        value_dims::<V, DB>(w, v, bk, hd, d0, ot, alpha);
        d0 += DB;
    }
    for d in d0..hd {
        value_dims::<V, 1>(w, v, bk, hd, d, ot, alpha);
    }
}

/// [`values`] of dimensions `d0..d0 + D`.
#[inline(always)]
unsafe fn value_dims<V: Lanes, const D: usize>(w: *const f32, v: *const f32, bk: usize, hd: usize, d0: usize, ot: *mut f32, alpha: V) {
    let mut acc = [alpha; D];
    for (dd, acc) in acc.iter_mut().enumerate() {
        *acc = V::load(ot.add((d0 + dd) * LANES)).mul(alpha);
    }
    for j in 0..bk {
        let wj = V::load(w.add(j * LANES));
        for (dd, acc) in acc.iter_mut().enumerate() {
            *acc = V::madd(*v.add(j * hd + d0 + dd), wj, *acc);
        }
    }
    for (dd, acc) in acc.iter().enumerate() {
        acc.store(ot.add((d0 + dd) * LANES));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::kv::{KvRows, KvType, LayerCache};
    use crate::backend::{AttentionMask, AttnShape, Span};
    use crate::runtime::ThreadPool;

    struct Case {
        hd: usize,
        n_head: usize,
        n_kv: usize,
        capacity: usize,
        softcap: Option<f32>,
    }

    fn rnd(seed: &mut u64) -> f32 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        (*seed % 20001) as f32 / 10000.0 - 1.0
    }

    /// A cache of `stored` positions (in a ring of `c.capacity` slots) of random keys and
    /// values, and random queries for the last `n`.
    fn fill(c: &Case, ty: KvType, stored: usize, seed: &mut u64) -> (LayerCache, Vec<f32>, Vec<f32>) {
        let row = c.n_kv * c.hd;
        let mut cache = LayerCache::new(c.capacity, row, ty);
        let mut kw = vec![0f32; c.capacity * row];
        let mut vw = vec![0f32; c.capacity * row];
        for p in 0..stored {
            let s = cache.slot(p) * row;
            for i in 0..row {
                // Keys scaled so that the softmax is far from uniform.
                kw[s + i] = 3.0 * rnd(seed);
                vw[s + i] = rnd(seed);
            }
        }
        match &mut cache.rows {
            KvRows::F16 { k, v } => {
                for i in 0..kw.len() {
                    (k[i], v[i]) = (half::f16::from_f32(kw[i]), half::f16::from_f32(vw[i]));
                    (kw[i], vw[i]) = (k[i].to_f32(), v[i].to_f32());
                }
            }
            KvRows::F32 { k, v } => {
                k.copy_from_slice(&kw);
                v.copy_from_slice(&vw);
            }
            KvRows::Q8 { .. } | KvRows::Device(_) => unreachable!(),
        }
        (cache, kw, vw)
    }

    fn flash(pool: &ThreadPool, cache: &LayerCache, c: &Case, q: &[f32], span: Span, pos0: usize, n: usize) -> Vec<f32> {
        let shape = AttnShape { n_head: c.n_head, n_kv_head: c.n_kv, head_dim: c.hd, scale: 0.3, softcap: c.softcap };
        let mut attn = vec![f32::NAN; n * c.n_head * c.hd];
        let mut scores = Vec::new();
        let call = Call { pool, cache, q, attn: &mut attn, scores: &mut scores, shape, span, pos0, n };
        match &cache.rows {
            KvRows::F16 { k, v } => run(call, k, v),
            KvRows::F32 { k, v } => run(call, k, v),
            KvRows::Q8 { .. } | KvRows::Device(_) => unreachable!(),
        }
        attn
    }

    #[test]
    fn tiles_match_an_f64_reference_and_do_not_depend_on_batching_or_threads() {
        let cases = [
            // Qwen2.5-0.5B's heads (7 per KV head: tiles of 4 tokens, 28 of 32 lanes).
            Case { hd: 64, n_head: 14, n_kv: 2, capacity: 400, softcap: None },
            // Gemma 3's (one KV head), in a ring smaller than the context, with a window.
            Case { hd: 256, n_head: 4, n_kv: 1, capacity: 250, softcap: None },
            // No GQA, an odd head size; Gemma 2's soft-cap.
            Case { hd: 20, n_head: 3, n_kv: 3, capacity: 400, softcap: Some(5.0) },
            // More heads per KV head than lanes.
            Case { hd: 16, n_head: 40, n_kv: 1, capacity: 400, softcap: None },
            Case { hd: 256, n_head: 4, n_kv: 1, capacity: 1024, softcap: None },
        ];
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let pools = [ThreadPool::new(1), ThreadPool::new(3)];
        for c in &cases {
            let (pos0, n) = if c.capacity == 1024 { (0, 40) } else { (137, 163) };
            let stored = pos0 + n;
            let window = (c.capacity < stored).then_some(c.capacity - n);
            for ty in [KvType::F32, KvType::F16] {
                let (cache, kw, vw) = fill(c, ty, stored, &mut seed);
                let q: Vec<f32> = (0..n * c.n_head * c.hd).map(|_| rnd(&mut seed)).collect();
                let masks = [AttentionMask::Causal, AttentionMask::Bidirectional, AttentionMask::BlockCausal { block: 24 }];
                for mask in masks {
                    let span = Span { mask, window };
                    let got = flash(&pools[0], &cache, c, &q, span, pos0, n);
                    let (group, row) = (c.n_head / c.n_kv, c.n_kv * c.hd);
                    for t in 0..n {
                        let (lo, cnt) = span.of(pos0 + t, stored);
                        for h in 0..c.n_head {
                            let g = h / group;
                            let qh = &q[(t * c.n_head + h) * c.hd..][..c.hd];
                            let off = |p: usize| cache.slot(p) * row + g * c.hd;
                            let s: Vec<f64> = (lo..lo + cnt)
                                .map(|p| {
                                    let x = qh.iter().zip(&kw[off(p)..]).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * 0.3;
                                    c.softcap.map_or(x, |cap| cap as f64 * (x / cap as f64).tanh())
                                })
                                .collect();
                            let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                            let w: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
                            let z: f64 = w.iter().sum();
                            for d in 0..c.hd {
                                let want = (lo..lo + cnt).zip(&w).map(|(p, wj)| wj * vw[off(p) + d] as f64).sum::<f64>() / z;
                                let g = got[(t * c.n_head + h) * c.hd + d] as f64;
                                assert!((g - want).abs() < 2e-5, "hd {} {ty:?} {mask:?} t {t} h {h} d {d}: {g} vs {want}", c.hd);
                            }
                        }
                    }
                    // Other threads, and (causal) the last 21 tokens as a batch of their own:
                    // the same bits.
                    assert!(got.iter().zip(flash(&pools[1], &cache, c, &q, span, pos0, n)).all(|(a, b)| a.to_bits() == b.to_bits()), "threads");
                    if mask == AttentionMask::Causal {
                        let tail = 21;
                        let from = (n - tail) * c.n_head * c.hd;
                        let part = flash(&pools[1], &cache, c, &q[from..], span, pos0 + n - tail, tail);
                        assert!(got[from..].iter().zip(&part).all(|(a, b)| a.to_bits() == b.to_bits()), "hd {}: batching changed a row", c.hd);
                    }
                }
            }
        }
    }
}
