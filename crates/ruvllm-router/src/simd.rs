//! The head trainer's `y += a * x`: AVX2+FMA when the CPU has it (as `ruvllm_core::runtime::cpu`
//! decided), portable code otherwise. Dot products are the embedder crate's, so a route scores
//! with exactly the arithmetic of `ruvllm_embed::cosine`.

pub use ruvllm_embed::simd::dot;

#[inline(always)]
fn axpy_generic(y: &mut [f32], a: f32, x: &[f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi = xi.mul_add(a, *yi);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2(y: &mut [f32], a: f32, x: &[f32]) {
    axpy_generic(y, a, x)
}

/// `y += a * x` over the shorter of the two lengths.
#[inline]
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if ruvllm_embed::simd::has_avx2() {
            // SAFETY: the CPU supports AVX2 and FMA (checked above).
            return unsafe { axpy_avx2(y, a, x) };
        }
    }
    axpy_generic(y, a, x)
}

#[cfg(test)]
mod tests {
    #[test]
    fn axpy_matches_naive() {
        for n in [0usize, 1, 7, 16, 33, 384] {
            let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let y0: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let mut y = y0.clone();
            super::axpy(&mut y, -0.75, &x);
            for i in 0..n {
                assert!((y[i] - (y0[i] - 0.75 * x[i])).abs() < 1e-6, "n={n} i={i}");
            }
        }
    }
}
