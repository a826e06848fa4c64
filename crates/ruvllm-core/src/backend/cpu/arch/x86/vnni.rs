//! AVX-512 VNNI (on 256-bit vectors: AVX512VL) versions of the prefill kernel for Q8_0 weights.
//! Chosen at run time by `dispatch::kernels` when the CPU has `avx512vnni` and `avx512vl`.
//!
//! `vpdpbusd` multiplies unsigned by signed bytes and sums into i32 without the i16 saturation
//! of `vpmaddubsw`, so activations can be made unsigned once (`a + 128`, an xor with 0x80) and
//! the sign games of the AVX2 kernel disappear: for each weight block, `−128·Σw` is computed
//! once and used as the accumulator start for all four tokens, giving `Σ (a+128)·w − 128·Σw =
//! Σ a·w` exactly. The integer sums are therefore the AVX2 kernel's, and the float operations
//! are done in the same order, so results are bit-identical to [`super::simd_avx2`].
//!
//! Safety contract as in `simd_avx2`, plus: the CPU supports AVX512VNNI and AVX512VL.

#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

use super::avx2::{f16_ptr, hsum_ps};
use crate::backend::cpu::quant::BlockQ8;

/// Q8_0 × four Q8 activation rows (see the module docs).
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
pub unsafe fn dot_q8_0_x4(w: &[u8], a: [&[BlockQ8]; 4]) -> [f32; 4] {
    let nb = a[0].len();
    debug_assert!(w.len() >= nb * 34 && a.iter().all(|x| x.len() == nb));
    let mut even = [_mm256_setzero_ps(); 4];
    let mut odd = [_mm256_setzero_ps(); 4];
    let p = w.as_ptr();
    let flip = _mm256_set1_epi8(0x80u8 as i8);
    let zero = _mm256_setzero_si256();
    let mut i = 0;
    while i < nb {
        let b = p.add(34 * i);
        let dw = f16_ptr(b);
        let qx = _mm256_loadu_si256(b.add(2) as *const __m256i);
        // −128 · Σw per 4-byte group: the accumulator start that cancels the +128 offset.
        let corr = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, flip, qx));
        let accs = if i & 1 == 0 { &mut even } else { &mut odd };
        for t in 0..4 {
            let y = a[t].get_unchecked(i);
            let yu = _mm256_xor_si256(_mm256_loadu_si256(y.qs.as_ptr() as *const __m256i), flip);
            let q = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(corr, yu, qx));
            accs[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * y.d), q, accs[t]);
        }
        i += 1;
    }
    [
        hsum_ps(_mm256_add_ps(even[0], odd[0])),
        hsum_ps(_mm256_add_ps(even[1], odd[1])),
        hsum_ps(_mm256_add_ps(even[2], odd[2])),
        hsum_ps(_mm256_add_ps(even[3], odd[3])),
    ]
}
