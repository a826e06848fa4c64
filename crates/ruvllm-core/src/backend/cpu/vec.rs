//! Portable reference versions of the f32 elementwise ops (plain loops LLVM vectorises for the
//! baseline target; the x86 SIMD versions in `arch::x86::vec` compile these same loops with AVX2
//! enabled, so both give the same results) and the KV element type the attention kernels read.

use half::f16;

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
    p = p * r + 5e-1;
    let y = p * r * r + r + 1.0;
    // 2^n by building the exponent (n in -126..=128; split to keep both factors finite).
    let ni = n as i32;
    let a = ni >> 1;
    let b = ni - a;
    let pa = f32::from_bits(((a + 127) as u32) << 23);
    let pb = f32::from_bits(((b + 127) as u32) << 23);
    if under {
        0.0
    } else {
        y * pa * pb
    }
}

/// `0.5·x·(1 + tanh(u)) = x / (1 + e^(-2u))`, with `u = √(2/π)·x·(1 + 0.044715·x²)`.
#[inline(always)]
fn gelu_tanh_exp(x: f32) -> f32 {
    const TWO_SQRT_2_OVER_PI: f32 = 1.595_769;
    x / (1.0 + exp_approx(-TWO_SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x)))
}

#[inline(always)]
pub(crate) fn gelu_tanh_mul_generic(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = gelu_tanh_exp(*g) * u;
    }
}

#[inline(always)]
pub(crate) fn silu_mul_generic(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + exp_approx(-*g)) * u;
    }
}

#[inline(always)]
pub(crate) fn softmax_generic(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // The exponentials in their own loop, which LLVM vectorises; the sum stays in order (a
    // floating-point sum in one chain), so the results are those of one fused loop.
    for v in x.iter_mut() {
        *v = exp_approx(*v - max);
    }
    let sum: f32 = x.iter().fold(0.0, |s, &v| s + v);
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
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
pub(crate) fn dot_generic(a: &[f32], b: &[f32]) -> f32 {
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
