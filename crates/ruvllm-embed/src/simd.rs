//! Dot products of embeddings (cosine of unit vectors; the router's scans and head use the same
//! one): AVX2+FMA when the CPU has it (`ruvllm_core::runtime::cpu`, detected once), portable code
//! otherwise. The dot product uses 16 independent accumulators, which LLVM turns into vector
//! registers.

#[inline(always)]
pub(crate) fn dot_generic(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 16];
    let mut ca = a.chunks_exact(16);
    let mut cb = b.chunks_exact(16);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..16 {
            acc[i] = x[i].mul_add(y[i], acc[i]);
        }
    }
    let mut s = 0.0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        s += x * y;
    }
    let mut t = 0.0;
    for v in acc {
        t += v;
    }
    s + t
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_generic(a, b)
}

/// Whether the AVX2+FMA kernels run here, as `ruvllm_core::runtime::cpu` decided (CPU features
/// and the `RUVLLM_*` switches).
#[cfg(target_arch = "x86_64")]
pub fn has_avx2() -> bool {
    ruvllm_core::runtime::cpu().avx2_fma()
}

/// `a · b` over the shorter of the two lengths.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx2() {
            // SAFETY: the CPU supports AVX2 and FMA (checked above).
            return unsafe { dot_avx2(a, b) };
        }
    }
    dot_generic(a, b)
}

#[cfg(test)]
mod tests {
    #[test]
    fn dot_matches_naive() {
        for n in [0usize, 1, 7, 16, 33, 384] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert!((super::dot(&a, &b) - naive).abs() < 1e-4, "n={n}");
        }
    }
}
