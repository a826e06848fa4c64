//! f32 elementwise ops of the forward pass: RMSNorm, gated activations, softmax, add,
//! dot and axpy. Each dispatches once per call to the x86 SIMD version ([`super::arch`]) where
//! the CPU has it, else to the portable reference in [`super::vec`].

#[cfg(target_arch = "x86_64")]
use super::arch::x86::vec as simd;
use super::vec::{dot_generic, gelu_tanh_mul_generic, silu_mul_generic, softmax_generic};
pub use super::vec::{exp_approx, gelu_tanh, silu, KvElem};
pub use crate::backend::rope::{RopeStyle, RopeTable};

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

/// In-place softmax.
pub fn softmax_inplace(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd::avx2() {
        // SAFETY: AVX2 and FMA were detected.
        return unsafe { simd::softmax_inplace(x) };
    }
    softmax_generic(x)
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

#[cfg(test)]
mod tests {
    use super::*;

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
