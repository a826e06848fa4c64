//! f32 elementwise ops used by the forward pass: RMSNorm, RoPE, activations, softmax.
//! Written as plain loops over slices so LLVM vectorises them for the baseline target.

use half::f16;

/// `out = x / rms(x) * w`, with rms over the whole slice.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert_eq!(x.len(), w.len());
    debug_assert_eq!(x.len(), out.len());
    let ss: f32 = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let scale = 1.0 / (ss + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// In-place RMSNorm of each `w.len()`-sized chunk of `x` (per-head QK-norm, or per-token norm).
pub fn rms_norm_chunks_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    for chunk in x.chunks_exact_mut(d) {
        let ss: f32 = chunk.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let scale = 1.0 / (ss + eps).sqrt();
        for (v, &g) in chunk.iter_mut().zip(w) {
            *v = *v * scale * g;
        }
    }
}

/// Which dimensions RoPE rotates together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1): llama.cpp's `LLAMA_ROPE_TYPE_NORM` (Llama, Mistral; their
    /// GGUF conversion permutes Q/K so this matches the checkpoint).
    Interleaved,
    /// Halves (i, i + d/2): `LLAMA_ROPE_TYPE_NEOX` (Gemma 3, Qwen2).
    Neox,
}

/// Precomputed cos/sin for positions `0..max_pos`, shared by every layer that uses the same base.
pub struct RopeTable {
    pub rot_dim: usize,
    pub style: RopeStyle,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTable {
    /// `rot_dim` rotated dimensions per head (even), frequencies `base^(-2i/rot_dim)` divided by
    /// `freq_scale_inv` (linear scaling factor, 1.0 for none).
    pub fn new(rot_dim: usize, base: f32, linear_factor: f32, max_pos: usize, style: RopeStyle) -> Self {
        let half = rot_dim / 2;
        let mut cos = Vec::with_capacity(max_pos * half);
        let mut sin = Vec::with_capacity(max_pos * half);
        let inv: Vec<f32> = (0..half)
            .map(|i| 1.0 / base.powf(2.0 * i as f32 / rot_dim as f32) / linear_factor)
            .collect();
        for p in 0..max_pos {
            for &f in &inv {
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        RopeTable { rot_dim, style, cos, sin }
    }

    pub fn max_pos(&self) -> usize {
        self.cos.len() / (self.rot_dim / 2).max(1)
    }

    /// Rotates every head (chunks of `head_dim`) of one token's vector at position `pos`.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, pos: usize) {
        let half = self.rot_dim / 2;
        let cos = &self.cos[pos * half..(pos + 1) * half];
        let sin = &self.sin[pos * half..(pos + 1) * half];
        for head in x.chunks_exact_mut(head_dim) {
            match self.style {
                RopeStyle::Interleaved => {
                    for i in 0..half {
                        let (a, b) = (head[2 * i], head[2 * i + 1]);
                        head[2 * i] = a * cos[i] - b * sin[i];
                        head[2 * i + 1] = a * sin[i] + b * cos[i];
                    }
                }
                RopeStyle::Neox => {
                    for i in 0..half {
                        let (a, b) = (head[i], head[i + half]);
                        head[i] = a * cos[i] - b * sin[i];
                        head[i + half] = a * sin[i] + b * cos[i];
                    }
                }
            }
        }
    }
}

/// GELU, tanh approximation (`gelu_pytorch_tanh`), as ggml_gelu.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x)).tanh())
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `e^x` for f32 from plain arithmetic (Cephes `expf`: range reduction by ln 2, degree-6
/// polynomial; within 2 ulp of libm over the normal range; 0 below -87.3, clamped above 88.7),
/// written so that LLVM vectorises loops that call it.
#[inline(always)]
pub fn exp_approx(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2^23: adding it rounds to an integer
    let under = x < -87.336_55;
    let x = x.clamp(-87.336_55, 88.722_83);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 5.000_000_1e-1;
    let y = p * r * r + r + 1.0;
    // 2^n by building the exponent (n in -126..=128; split to keep both factors finite).
    let ni = n as i32;
    let a = ni >> 1;
    let b = ni - a;
    let pa = f32::from_bits(((a + 127) as u32) << 23);
    let pb = f32::from_bits(((b + 127) as u32) << 23);
    if under { 0.0 } else { y * pa * pb }
}

/// Fused gated activations over whole buffers: `gate[i] = act(gate[i]) * up[i]`.
pub fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd::avx2() {
        // SAFETY: AVX2 and FMA were detected.
        return unsafe { simd::gelu_tanh_mul(gate, up) };
    }
    gelu_tanh_mul_generic(gate, up)
}

/// [`gelu_tanh_mul`] with SiLU.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd::avx2() {
        // SAFETY: AVX2 and FMA were detected.
        return unsafe { simd::silu_mul(gate, up) };
    }
    silu_mul_generic(gate, up)
}

/// `0.5·x·(1 + tanh(u)) = x / (1 + e^(-2u))`, with `u = √(2/π)·x·(1 + 0.044715·x²)`.
#[inline(always)]
fn gelu_tanh_exp(x: f32) -> f32 {
    const TWO_SQRT_2_OVER_PI: f32 = 1.595_769_1;
    x / (1.0 + exp_approx(-TWO_SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x)))
}

#[inline(always)]
fn gelu_tanh_mul_generic(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = gelu_tanh_exp(*g) * u;
    }
}

#[inline(always)]
fn silu_mul_generic(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + exp_approx(-*g)) * u;
    }
}

/// In-place softmax.
pub fn softmax_inplace(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd::avx2() {
        // SAFETY: AVX2 and FMA were detected.
        return unsafe { simd::softmax_inplace(x) };
    }
    softmax_generic(x)
}

#[inline(always)]
fn softmax_generic(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = exp_approx(*v - max);
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `a += b`.
pub fn add_inplace(a: &mut [f32], b: &[f32]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

/// `Σ a[i]·b[i]`.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd::avx2() {
        // SAFETY: AVX2 and FMA were detected.
        return unsafe { simd::dot(a, b) };
    }
    dot_generic(a, b)
}

/// Element types of the KV cache that the attention kernels read: f32, or IEEE half (the
/// cache's format), widened exactly to f32 as it is loaded.
pub trait KvElem: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    /// Eight elements at `p` as f32 (needs AVX; F16C for half).
    ///
    /// # Safety
    /// `p..p + 8` must be readable and the CPU must have the features.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
    /// Sixteen elements at `p` as f32 (needs AVX-512F).
    ///
    /// # Safety
    /// `p..p + 16` must be readable and the CPU must have the features.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
}

impl KvElem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_loadu_ps(p)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> std::arch::x86_64::__m512 {
        std::arch::x86_64::_mm512_loadu_ps(p)
    }
}

impl KvElem for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
}

#[inline(always)]
fn dot_generic(a: &[f32], b: &[f32]) -> f32 {
    // Eight accumulators so LLVM vectorises without fast-math.
    let n = a.len().min(b.len());
    let mut acc = [0.0f32; 8];
    let chunks = n / 8;
    for c in 0..chunks {
        for j in 0..8 {
            acc[j] += a[c * 8 + j] * b[c * 8 + j];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in chunks * 8..n {
        s += a[i] * b[i];
    }
    s
}

/// `out += w * v`.
#[inline]
pub fn axpy(out: &mut [f32], w: f32, v: &[f32]) {
    axpy_elem(out, w, v)
}

/// `out += w * v` with `v` in f32 or half (widened exactly as it is loaded).
#[inline]
pub fn axpy_elem<T: KvElem>(out: &mut [f32], w: f32, v: &[T]) {
    #[cfg(target_arch = "x86_64")]
    if simd::avx2() {
        // SAFETY: AVX2, FMA and F16C were detected.
        return unsafe { simd::axpy(out, w, v) };
    }
    for (o, &x) in out.iter_mut().zip(v) {
        *o += w * x.to_f32();
    }
}

/// `Σ a[i]·b[i]` with `b` in f32 or half: [`dot`]'s operations, `b` widened exactly as loaded.
#[inline]
pub fn dot_elem<T: KvElem>(a: &[f32], b: &[T]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd::avx2() {
        // SAFETY: AVX2, FMA and F16C were detected.
        return unsafe { simd::dot(a, b) };
    }
    let n = a.len().min(b.len());
    let mut acc = [0.0f32; 8];
    let chunks = n / 8;
    for c in 0..chunks {
        for j in 0..8 {
            acc[j] += a[c * 8 + j] * b[c * 8 + j].to_f32();
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in chunks * 8..n {
        s += a[i] * b[i].to_f32();
    }
    s
}

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
/// Panics if the heads differ in length, `outs` is shorter than `qs` or an output row shorter
/// than `offs`, or a key row lies outside `k`.
pub fn scores_heads<T: KvElem>(qs: &[&[f32]], k: &[T], offs: &[usize], scale: f32, outs: &mut [&mut [f32]]) {
    let Some(hd) = qs.first().map(|q| q.len()) else { return };
    assert!(
        outs.len() >= qs.len() && qs.iter().all(|q| q.len() == hd) && outs.iter().all(|o| o.len() >= offs.len()),
        "scores_heads: heads or output rows do not match"
    );
    #[cfg(target_arch = "x86_64")]
    if qs.len() > 1 && simd::avx2() && hd.is_multiple_of(16) {
        assert!(offs.iter().all(|&o| o + hd <= k.len()), "scores: key rows out of range");
        for (q4, o4) in qs.chunks(4).zip(outs.chunks_mut(4)) {
            // SAFETY: AVX2/FMA/F16C (and AVX-512F for the 512-bit variant) were detected; every
            // key row is inside `k`, every query has `hd` elements and every output row
            // `offs.len()`.
            unsafe { simd::scores_heads_dispatch(q4, k, offs, scale, o4, simd::avx512()) };
        }
        return;
    }
    for (q, o) in qs.iter().zip(outs.iter_mut()) {
        scores(q, k, offs, scale, o);
    }
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

/// AVX2 + FMA versions, chosen at run time (the crate is built for baseline x86-64).
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::KvElem;
    use std::sync::OnceLock;

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
        super::gelu_tanh_mul_generic(gate, up)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn silu_mul(gate: &mut [f32], up: &[f32]) {
        super::silu_mul_generic(gate, up)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn softmax_inplace(x: &mut [f32]) {
        super::softmax_generic(x)
    }

    /// `Σ a[i]·b[i]` with `b` of either KV element type (f32 for [`super::dot`]).
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

    /// [`super::scores`] with 512-bit vectors: lanes 0-7 of a 16-lane accumulator are
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

    /// [`super::weighted_sum`] for 256 columns with 512-bit vectors: the whole output row in 16
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

    /// [`super::scores`] for `q.len()` a multiple of 16: per key the two accumulator chains of
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

    /// [`super::weighted_sum`] for `out.len()` a multiple of 8: 64 output columns at a time held
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
    pub unsafe fn scores_heads_dispatch<T: KvElem>(qs: &[&[f32]], k: &[T], offs: &[usize], scale: f32, outs: &mut [&mut [f32]], wide: bool) {
        unsafe fn run<T: KvElem, const H: usize>(qs: &[&[f32]], k: &[T], offs: &[usize], scale: f32, outs: &mut [&mut [f32]], wide: bool) {
            let hd = qs[0].len();
            let q: [*const f32; H] = std::array::from_fn(|h| qs[h].as_ptr());
            let o: [*mut f32; H] = std::array::from_fn(|h| outs[h].as_mut_ptr());
            if wide {
                scores_heads512::<T, H>(q, hd, k.as_ptr(), offs, scale, o)
            } else {
                scores_heads256::<T, H>(q, hd, k.as_ptr(), offs, scale, o)
            }
        }
        match qs.len() {
            1 => run::<T, 1>(qs, k, offs, scale, outs, wide),
            2 => run::<T, 2>(qs, k, offs, scale, outs, wide),
            3 => run::<T, 3>(qs, k, offs, scale, outs, wide),
            _ => run::<T, 4>(qs, k, offs, scale, outs, wide),
        }
    }

    /// `H` heads of [`super::scores_heads`] with 512-bit vectors, four key rows at a time: per
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

    /// `H` heads of [`super::scores_heads`] with 256-bit vectors, one key row at a time: per
    /// (row, head) the two accumulator chains of [`dot`], so results are identical.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores_heads256<T: KvElem, const H: usize>(q: [*const f32; H], hd: usize, pk: *const T, offs: &[usize], scale: f32, out: [*mut f32; H]) {
        for (j, &off) in offs.iter().enumerate() {
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
            let w: [*const f32; H] = std::array::from_fn(|h| ws[h].as_ptr());
            let o: [*mut f32; H] = std::array::from_fn(|h| outs[h].as_mut_ptr());
            let pv = v.as_ptr();
            let mut c = 0;
            if wide {
                while c + 64 <= width {
                    heads_columns512::<T, H, 4>(w, pv, offs, c, o);
                    c += 64;
                }
                while c + 16 <= width {
                    heads_columns512::<T, H, 1>(w, pv, offs, c, o);
                    c += 16;
                }
            }
            while c + 16 <= width {
                heads_columns256::<T, H, 2>(w, pv, offs, c, o);
                c += 16;
            }
            while c < width {
                heads_columns256::<T, H, 1>(w, pv, offs, c, o);
                c += 8;
            }
        }
        match outs.len() {
            1 => run::<T, 1>(ws, v, offs, outs, wide),
            2 => run::<T, 2>(ws, v, offs, outs, wide),
            3 => run::<T, 3>(ws, v, offs, outs, wide),
            _ => run::<T, 4>(ws, v, offs, outs, wide),
        }
    }

    /// Columns `c..c + 16R` of `H` heads' value sums in registers over all rows, each row's
    /// columns widened once for the heads; per element the fused multiply-adds of [`columns`].
    #[inline]
    #[allow(clippy::needless_range_loop)] // register arrays indexed in step
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn heads_columns512<T: KvElem, const H: usize, const R: usize>(w: [*const f32; H], pv: *const T, offs: &[usize], c: usize, out: [*mut f32; H]) {
        let mut acc = [[_mm512_setzero_ps(); R]; H];
        for (j, &off) in offs.iter().enumerate() {
            let row = pv.add(off + c);
            // Four rows ahead (the cache rows come from DRAM, see `scores_heads512`).
            if let Some(&ahead) = offs.get(j + 4) {
                let p = pv.add(ahead + c) as *const i8;
                for b in (0..16 * R * std::mem::size_of::<T>()).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(p.add(b));
                }
            }
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
    unsafe fn heads_columns256<T: KvElem, const H: usize, const R: usize>(w: [*const f32; H], pv: *const T, offs: &[usize], c: usize, out: [*mut f32; H]) {
        let mut acc = [[_mm256_setzero_ps(); R]; H];
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

    /// `out += w * v` with `v` of either element type (f32 for [`super::axpy`]).
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks `scores`/`weighted_sum` over cache rows `k`, `v` of element type `T` against the
    /// per-row `dot` and `axpy` on the rows widened to f32 (`kw`, `vw`), exactly, through the
    /// dispatcher and each SIMD variant this CPU has.
    fn check_attention_kernels<T: KvElem>(hd: usize, rows: usize, k: &[T], v: &[T], q: &[f32], w_all: &[f32]) {
        let kw: Vec<f32> = k.iter().map(|x| x.to_f32()).collect();
        let vw: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
        let ty = std::any::type_name::<T>();
        for span in [0, 1, 3, 4, 5, 9] {
            // Ring-buffer-like order with an odd start offset.
            let offs: Vec<usize> = (0..span).map(|j| ((j * 7 + 3) % rows) * hd + 1).collect();
            let mut got = vec![f32::NAN; span];
            scores(q, k, &offs, 0.37, &mut got);
            let want: Vec<f32> = offs.iter().map(|&o| dot(q, &kw[o..o + hd]) * 0.37).collect();
            assert_eq!(got, want, "scores {ty} hd={hd} span={span}");
            #[cfg(target_arch = "x86_64")]
            if simd::avx2() && hd.is_multiple_of(16) {
                let mut got = vec![f32::NAN; span];
                unsafe { simd::scores(q, k, &offs, 0.37, &mut got) };
                assert_eq!(got, want, "avx2 scores {ty} hd={hd} span={span}");
            }
            #[cfg(target_arch = "x86_64")]
            if simd::avx512() && hd.is_multiple_of(16) {
                let mut got = vec![f32::NAN; span];
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
                unsafe { simd::weighted_sum(w, v, &offs, &mut got) };
                assert_eq!(got, want, "avx2 weighted_sum {ty} hd={hd} span={span}");
            }
            #[cfg(target_arch = "x86_64")]
            if simd::avx512() && hd == 256 {
                let mut got = vec![f32::NAN; hd];
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
                let mut got = vec![vec![f32::NAN; span]; heads];
                scores_heads(&qs, k, &offs, 0.37, &mut got.iter_mut().map(|x| x.as_mut_slice()).collect::<Vec<_>>());
                assert_eq!(got, want, "scores_heads {ty} hd={hd} span={span} heads={heads}");
                #[cfg(target_arch = "x86_64")]
                for wide in [false, true] {
                    if simd::avx2() && hd.is_multiple_of(16) && (!wide || simd::avx512()) {
                        let mut got = vec![vec![f32::NAN; span]; heads];
                        let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|x| x.as_mut_slice()).collect();
                        for (q4, o4) in qs.chunks(4).zip(outs.chunks_mut(4)) {
                            unsafe { simd::scores_heads_dispatch(q4, k, &offs, 0.37, o4, wide) };
                        }
                        assert_eq!(got, want, "scores_heads wide={wide} {ty} hd={hd} span={span} heads={heads}");
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
            let w: Vec<f32> = (0..16).map(|_| rnd()).collect();
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

    #[test]
    fn rms_norm_unit_weights_gives_unit_rms() {
        let x = [1.0, -2.0, 3.0, -4.0];
        let mut out = [0.0; 4];
        rms_norm(&x, &[1.0; 4], 0.0, &mut out);
        let rms = (out.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
    }

    #[test]
    fn rope_position_zero_is_identity_and_rotation_preserves_norm() {
        for style in [RopeStyle::Interleaved, RopeStyle::Neox] {
            let t = RopeTable::new(8, 10000.0, 1.0, 16, style);
            let orig: Vec<f32> = (0..16).map(|i| i as f32 * 0.3 - 1.0).collect();
            let mut x = orig.clone();
            t.apply(&mut x, 8, 0);
            assert_eq!(x, orig);
            t.apply(&mut x, 8, 7);
            let n0: f32 = orig.iter().map(|v| v * v).sum();
            let n1: f32 = x.iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-4);
            assert_ne!(x, orig);
        }
    }

    #[test]
    fn rope_relative_property() {
        // <rope(q, m), rope(k, n)> depends only on m - n.
        let t = RopeTable::new(4, 100.0, 1.0, 32, RopeStyle::Neox);
        let q = [0.5, -1.0, 2.0, 0.25];
        let k = [1.5, 0.5, -0.75, 1.0];
        let score = |m: usize, n: usize| {
            let (mut a, mut b) = (q, k);
            t.apply(&mut a, 4, m);
            t.apply(&mut b, 4, n);
            dot(&a, &b)
        };
        assert!((score(5, 2) - score(13, 10)).abs() < 1e-4);
    }

    #[test]
    fn exp_approx_is_within_a_few_ulp_of_libm() {
        let mut worst = 0f32;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (a, b) = (exp_approx(x), x.exp());
            worst = worst.max(((a - b) / b).abs());
            x += 0.001_7;
        }
        assert!(worst < 3.0 * f32::EPSILON, "worst relative error {worst}");
        assert_eq!(exp_approx(-100.0), 0.0);
        assert!(exp_approx(100.0).is_finite());
        assert_eq!(exp_approx(0.0), 1.0);
    }

    #[test]
    fn fused_activations_match_the_formulas() {
        let x: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.031).collect();
        let up: Vec<f32> = (0..1000).map(|i| 1.0 + (i % 7) as f32 * 0.1).collect();
        let (mut g, mut s) = (x.clone(), x.clone());
        gelu_tanh_mul(&mut g, &up);
        silu_mul(&mut s, &up);
        for i in 0..x.len() {
            let want = gelu_tanh(x[i]) * up[i];
            assert!((g[i] - want).abs() <= 1e-6 * want.abs().max(1.0), "gelu({}) = {} want {want}", x[i], g[i]);
            let want = silu(x[i]) * up[i];
            assert!((s[i] - want).abs() <= 1e-6 * want.abs().max(1.0), "silu({}) = {} want {want}", x[i], s[i]);
        }
    }

    #[test]
    fn simd_dot_and_axpy_match_scalar() {
        for n in [0, 1, 7, 8, 15, 16, 17, 64, 100, 256] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot(&a, &b) as f64 - want).abs() < 1e-4, "n={n}");
            let mut o = b.clone();
            axpy(&mut o, 0.5, &a);
            for i in 0..n {
                assert!((o[i] - (b[i] + 0.5 * a[i])).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut x = [1.0, 2.0, 3.0, 1000.0];
        softmax_inplace(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }
}
