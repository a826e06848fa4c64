//! AVX2 + FMA + F16C dot products (ports of ggml's x86 `ggml_vec_dot_*` AVX2 paths). Only
//! compiled on x86-64 and only called after `is_x86_feature_detected!` said yes (see
//! `dispatch::kernels`).
//!
//! Safety contract of every `dot_*` here (upheld by `matmul`): the CPU supports AVX2, FMA and
//! F16C, and `w` holds at least `a.len()` blocks of the weight format (`x.len()` elements for
//! the float formats).

#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

use crate::backend::cpu::dot::{self, Kernels};
use crate::backend::cpu::quant::{BlockQ8, BlockQ8K};

/// The AVX2 kernel set. F16 weights fall back to scalar without F16C (no such AVX2 CPU is
/// known, but the check is cheap).
pub fn kernels(f16c: bool) -> Kernels {
    if !f16c {
        // The quantized kernels read their f16 scales with F16C; without it use scalar.
        return dot::SCALAR;
    }
    Kernels {
        q4_0: dot_q4_0,
        q4_1: dot_q4_1,
        q5_0: dot_q5_0,
        q5_1: dot_q5_1,
        q8_0: dot_q8_0,
        q8_0_x4: dot_q8_0_x4,
        q4_k: dot_q4_k,
        q4_k_x4: dot_q4_k_x4,
        q5_k: dot_q5_k,
        q6_k: dot_q6_k,
        q6_k_x4: dot_q6_k_x4,
        f32: dot_f32,
        f16: dot_f16,
        bf16: dot_bf16,
        gemm: None,
        gemm_k: None,
        isa: "avx2",
    }
}

// ---------------------------------------------------------------------------------------------
// helpers
// ---------------------------------------------------------------------------------------------

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_ptr(p: *const u8) -> f32 {
    let bits = (p as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_ps(x: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    let r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_ps128(r: __m128) -> f32 {
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    let r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// 16 bytes of nibbles → 32 bytes: low nibbles in the low lane, high nibbles in the high lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bytes_from_nibbles_32(p: *const u8) -> __m256i {
    let tmp = _mm_loadu_si128(p as *const __m128i);
    let bytes = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4));
    _mm256_and_si256(_mm256_set1_epi8(0x0F), bytes)
}

/// 32 bits → 32 bytes of 0x00 / 0xFF.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bytes_from_bits_32(p: *const u8) -> __m256i {
    let x32 = (p as *const u32).read_unaligned() as i32;
    let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32), shuf);
    let bit_mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
    let bytes = _mm256_or_si256(bytes, bit_mask);
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// Σ pairs of (unsigned ax × signed sy), as 8 f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mul_sum_us8_pairs_float(ax: __m256i, sy: __m256i) -> __m256 {
    let dot = _mm256_maddubs_epi16(ax, sy);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), dot))
}

/// Σ pairs of (signed x × signed y), as 8 f32. Requires x != -128.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mul_sum_i8_pairs_float(x: __m256i, y: __m256i) -> __m256 {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    mul_sum_us8_pairs_float(ax, sy)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load256(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

// ---------------------------------------------------------------------------------------------
// 32-element formats × Q8
// ---------------------------------------------------------------------------------------------

/// Q4_0 × Q8_0.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4_0(w: &[u8], a: &[BlockQ8]) -> f32 {
    debug_assert!(w.len() >= a.len() * 18);
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let off = _mm256_set1_epi8(8);
    let p = w.as_ptr();
    let nb = a.len();
    let mut i = 0;
    while i + 1 < nb {
        let b0 = p.add(18 * i);
        let b1 = p.add(18 * (i + 1));
        let (y0, y1) = (a.get_unchecked(i), a.get_unchecked(i + 1));
        let d0 = _mm256_set1_ps(f16_ptr(b0) * y0.d);
        let d1 = _mm256_set1_ps(f16_ptr(b1) * y1.d);
        let q0 = _mm256_sub_epi8(bytes_from_nibbles_32(b0.add(2)), off);
        let q1 = _mm256_sub_epi8(bytes_from_nibbles_32(b1.add(2)), off);
        acc0 = _mm256_fmadd_ps(d0, mul_sum_i8_pairs_float(q0, load256(y0.qs.as_ptr() as *const u8)), acc0);
        acc1 = _mm256_fmadd_ps(d1, mul_sum_i8_pairs_float(q1, load256(y1.qs.as_ptr() as *const u8)), acc1);
        i += 2;
    }
    if i < nb {
        let b0 = p.add(18 * i);
        let y0 = a.get_unchecked(i);
        let d0 = _mm256_set1_ps(f16_ptr(b0) * y0.d);
        let q0 = _mm256_sub_epi8(bytes_from_nibbles_32(b0.add(2)), off);
        acc0 = _mm256_fmadd_ps(d0, mul_sum_i8_pairs_float(q0, load256(y0.qs.as_ptr() as *const u8)), acc0);
    }
    hsum_ps(_mm256_add_ps(acc0, acc1))
}

/// Q4_1 × Q8_1.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4_1(w: &[u8], a: &[BlockQ8]) -> f32 {
    debug_assert!(w.len() >= a.len() * 20);
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    let p = w.as_ptr();
    for (i, y) in a.iter().enumerate() {
        let b = p.add(20 * i);
        summs += f16_ptr(b.add(2)) * y.s;
        let d = _mm256_set1_ps(f16_ptr(b) * y.d);
        let qx = bytes_from_nibbles_32(b.add(4));
        let qy = load256(y.qs.as_ptr() as *const u8);
        acc = _mm256_fmadd_ps(d, mul_sum_us8_pairs_float(qx, qy), acc);
    }
    hsum_ps(acc) + summs
}

/// Q5_0 × Q8_0.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q5_0(w: &[u8], a: &[BlockQ8]) -> f32 {
    debug_assert!(w.len() >= a.len() * 22);
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let hi = _mm256_set1_epi8(0xF0u8 as i8);
    let p = w.as_ptr();
    let nb = a.len();
    let mut i = 0;
    while i + 1 < nb {
        let b0 = p.add(22 * i);
        let b1 = p.add(22 * (i + 1));
        let (y0, y1) = (a.get_unchecked(i), a.get_unchecked(i + 1));
        let d0 = _mm256_set1_ps(f16_ptr(b0) * y0.d);
        let d1 = _mm256_set1_ps(f16_ptr(b1) * y1.d);
        let q0 = _mm256_or_si256(bytes_from_nibbles_32(b0.add(6)), _mm256_andnot_si256(bytes_from_bits_32(b0.add(2)), hi));
        let q1 = _mm256_or_si256(bytes_from_nibbles_32(b1.add(6)), _mm256_andnot_si256(bytes_from_bits_32(b1.add(2)), hi));
        acc0 = _mm256_fmadd_ps(d0, mul_sum_i8_pairs_float(q0, load256(y0.qs.as_ptr() as *const u8)), acc0);
        acc1 = _mm256_fmadd_ps(d1, mul_sum_i8_pairs_float(q1, load256(y1.qs.as_ptr() as *const u8)), acc1);
        i += 2;
    }
    if i < nb {
        let b0 = p.add(22 * i);
        let y0 = a.get_unchecked(i);
        let d0 = _mm256_set1_ps(f16_ptr(b0) * y0.d);
        let q0 = _mm256_or_si256(bytes_from_nibbles_32(b0.add(6)), _mm256_andnot_si256(bytes_from_bits_32(b0.add(2)), hi));
        acc0 = _mm256_fmadd_ps(d0, mul_sum_i8_pairs_float(q0, load256(y0.qs.as_ptr() as *const u8)), acc0);
    }
    hsum_ps(_mm256_add_ps(acc0, acc1))
}

/// Q5_1 × Q8_1.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q5_1(w: &[u8], a: &[BlockQ8]) -> f32 {
    debug_assert!(w.len() >= a.len() * 24);
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    let bit5 = _mm256_set1_epi8(0x10);
    let p = w.as_ptr();
    for (i, y) in a.iter().enumerate() {
        let b = p.add(24 * i);
        summs += f16_ptr(b.add(2)) * y.s;
        let d = _mm256_set1_ps(f16_ptr(b) * y.d);
        let qx = _mm256_or_si256(bytes_from_nibbles_32(b.add(8)), _mm256_and_si256(bytes_from_bits_32(b.add(4)), bit5));
        let qy = load256(y.qs.as_ptr() as *const u8);
        acc = _mm256_fmadd_ps(d, mul_sum_us8_pairs_float(qx, qy), acc);
    }
    hsum_ps(acc) + summs
}

/// Q8_0 × Q8_0.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q8_0(w: &[u8], a: &[BlockQ8]) -> f32 {
    debug_assert!(w.len() >= a.len() * 34);
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let p = w.as_ptr();
    let nb = a.len();
    let mut i = 0;
    while i + 1 < nb {
        let b0 = p.add(34 * i);
        let b1 = p.add(34 * (i + 1));
        let (y0, y1) = (a.get_unchecked(i), a.get_unchecked(i + 1));
        let d0 = _mm256_set1_ps(f16_ptr(b0) * y0.d);
        let d1 = _mm256_set1_ps(f16_ptr(b1) * y1.d);
        acc0 = _mm256_fmadd_ps(d0, mul_sum_i8_pairs_float(load256(b0.add(2)), load256(y0.qs.as_ptr() as *const u8)), acc0);
        acc1 = _mm256_fmadd_ps(d1, mul_sum_i8_pairs_float(load256(b1.add(2)), load256(y1.qs.as_ptr() as *const u8)), acc1);
        i += 2;
    }
    if i < nb {
        let b0 = p.add(34 * i);
        let y0 = a.get_unchecked(i);
        let d0 = _mm256_set1_ps(f16_ptr(b0) * y0.d);
        acc0 = _mm256_fmadd_ps(d0, mul_sum_i8_pairs_float(load256(b0.add(2)), load256(y0.qs.as_ptr() as *const u8)), acc0);
    }
    hsum_ps(_mm256_add_ps(acc0, acc1))
}

/// Q8_0 × four Q8 activation rows; the same operations in the same order as [`dot_q8_0`] for
/// each token (so results are bit-identical), with the weight block loaded once.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q8_0_x4(w: &[u8], a: [&[BlockQ8]; 4]) -> [f32; 4] {
    let nb = a[0].len();
    debug_assert!(w.len() >= nb * 34 && a.iter().all(|x| x.len() == nb));
    let mut even = [_mm256_setzero_ps(); 4];
    let mut odd = [_mm256_setzero_ps(); 4];
    let p = w.as_ptr();
    let ones = _mm256_set1_epi16(1);
    #[inline(always)]
    unsafe fn step(qx: __m256i, ax: __m256i, dw: f32, y: &BlockQ8, ones: __m256i, acc: __m256) -> __m256 {
        let sy = _mm256_sign_epi8(load256(y.qs.as_ptr() as *const u8), qx);
        let q = _mm256_cvtepi32_ps(_mm256_madd_epi16(ones, _mm256_maddubs_epi16(ax, sy)));
        _mm256_fmadd_ps(_mm256_set1_ps(dw * y.d), q, acc)
    }
    let mut i = 0;
    while i < nb {
        let b = p.add(34 * i);
        let dw = f16_ptr(b);
        let qx = load256(b.add(2));
        let ax = _mm256_sign_epi8(qx, qx);
        if i & 1 == 0 {
            for t in 0..4 {
                even[t] = step(qx, ax, dw, a[t].get_unchecked(i), ones, even[t]);
            }
        } else {
            for t in 0..4 {
                odd[t] = step(qx, ax, dw, a[t].get_unchecked(i), ones, odd[t]);
            }
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

// ---------------------------------------------------------------------------------------------
// K-quants × Q8_K
// ---------------------------------------------------------------------------------------------

const KMASK1: u32 = 0x3f3f3f3f;
const KMASK2: u32 = 0x0f0f0f0f;
const KMASK3: u32 = 0x03030303;

/// Unpacks the 12 scale bytes of a Q4_K/Q5_K block into 8 scales (bytes 0..8) and 8 mins
/// (bytes 8..16), as ggml's `utmp` dance.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_scales_k4(p: *const u8) -> __m128i {
    let mut u = [0u32; 4];
    std::ptr::copy_nonoverlapping(p, u.as_mut_ptr() as *mut u8, 12);
    u[3] = ((u[2] >> 4) & KMASK2) | (((u[1] >> 6) & KMASK3) << 4);
    let uaux = u[1] & KMASK1;
    u[1] = (u[2] & KMASK2) | (((u[0] >> 6) & KMASK3) << 4);
    u[2] = uaux;
    u[0] &= KMASK1;
    _mm_set_epi32(u[3] as i32, u[2] as i32, u[1] as i32, u[0] as i32)
}

const fn make_shuffles_i16() -> [[u8; 32]; 8] {
    let mut t = [[0u8; 32]; 8];
    let mut i = 0;
    while i < 8 {
        let mut k = 0;
        while k < 16 {
            t[i][2 * k] = (2 * i) as u8;
            t[i][2 * k + 1] = (2 * i + 1) as u8;
            k += 1;
        }
        i += 1;
    }
    t
}

/// `i16` broadcast shuffles: entry `i` selects 16-bit element `i` of each 128-bit lane.
static SHUFFLES_I16: [[u8; 32]; 8] = make_shuffles_i16();

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn shuffles_i16() -> [__m256i; 8] {
    let t = &SHUFFLES_I16;
    [
        load256(t[0].as_ptr()),
        load256(t[1].as_ptr()),
        load256(t[2].as_ptr()),
        load256(t[3].as_ptr()),
        load256(t[4].as_ptr()),
        load256(t[5].as_ptr()),
        load256(t[6].as_ptr()),
        load256(t[7].as_ptr()),
    ]
}

/// The min correction of a Q4_K/Q5_K block, accumulated into `acc_m` with factor `dmin`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_mins(mins_and_scales: __m256i, y: &BlockQ8K, dmin: f32, acc_m: __m128) -> __m128 {
    let q8sums = _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i);
    let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256::<1>(q8sums));
    let prod = _mm_madd_epi16(_mm256_extracti128_si256::<1>(mins_and_scales), q8s);
    _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m)
}

/// Q4_K × Q8_K.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    debug_assert!(w.len() >= a.len() * 144);
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    let sh: [__m256i; 8] = shuffles_i16();
    let p = w.as_ptr();
    for (i, y) in a.iter().enumerate() {
        let b = p.add(144 * i);
        let d = y.d * f16_ptr(b);
        let dmin = -y.d * f16_ptr(b.add(2));
        let mins_and_scales = _mm256_cvtepu8_epi16(unpack_scales_k4(b.add(4)));
        acc_m = k4_mins(mins_and_scales, y, dmin, acc_m);
        let sc128 = _mm256_castsi256_si128(mins_and_scales);
        let scales = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(sc128), sc128);
        let q4 = b.add(16);
        let q8 = y.qs.as_ptr() as *const u8;
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let scale_l = _mm256_shuffle_epi8(scales, sh[2 * j]);
            let scale_h = _mm256_shuffle_epi8(scales, sh[2 * j + 1]);
            let q4bits = load256(q4.add(32 * j));
            let q4l = _mm256_and_si256(q4bits, m4);
            let q4h = _mm256_and_si256(_mm256_srli_epi16(q4bits, 4), m4);
            let p16l = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, load256(q8.add(64 * j))));
            let p16h = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q4h, load256(q8.add(64 * j + 32))));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16l, p16h));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc) + hsum_ps128(acc_m)
}

/// Q5_K × Q8_K.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q5_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    debug_assert!(w.len() >= a.len() * 176);
    let m4 = _mm256_set1_epi8(0xF);
    let bit5 = _mm256_set1_epi8(0x10);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    let sh: [__m256i; 8] = shuffles_i16();
    let p = w.as_ptr();
    for (i, y) in a.iter().enumerate() {
        let b = p.add(176 * i);
        let d = y.d * f16_ptr(b);
        let dmin = -y.d * f16_ptr(b.add(2));
        let mins_and_scales = _mm256_cvtepu8_epi16(unpack_scales_k4(b.add(4)));
        acc_m = k4_mins(mins_and_scales, y, dmin, acc_m);
        let sc128 = _mm256_castsi256_si128(mins_and_scales);
        let scales = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(sc128), sc128);
        let hbits = load256(b.add(16));
        let q5 = b.add(48);
        let q8 = y.qs.as_ptr() as *const u8;
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let scale_l = _mm256_shuffle_epi8(scales, sh[2 * j]);
            let scale_h = _mm256_shuffle_epi8(scales, sh[2 * j + 1]);
            let q5bits = load256(q5.add(32 * j));
            // bit (2j) of hbits → 0x10 for the low nibbles, bit (2j+1) for the high ones.
            let h = _mm256_srl_epi16(hbits, _mm_cvtsi32_si128((2 * j) as i32));
            let h_l = _mm256_and_si256(_mm256_slli_epi16(h, 4), bit5);
            let h_h = _mm256_and_si256(_mm256_slli_epi16(h, 3), bit5);
            let q5l = _mm256_or_si256(_mm256_and_si256(q5bits, m4), h_l);
            let q5h = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q5bits, 4), m4), h_h);
            let p16l = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q5l, load256(q8.add(64 * j))));
            let p16h = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q5h, load256(q8.add(64 * j + 32))));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16l, p16h));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc) + hsum_ps128(acc_m)
}

/// Q6_K × Q8_K.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q6_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    debug_assert!(w.len() >= a.len() * 210);
    let m4 = _mm256_set1_epi8(0xF);
    let m2 = _mm256_set1_epi8(3);
    let m32s = _mm256_set1_epi8(32);
    let mut acc = _mm256_setzero_ps();
    let p = w.as_ptr();
    for (i, y) in a.iter().enumerate() {
        let b = p.add(210 * i);
        let d = y.d * f16_ptr(b.add(208));
        let scp = b.add(192) as *const i8;
        let q8 = y.qs.as_ptr() as *const u8;
        let mut sumi = _mm256_setzero_si256();
        for j in 0..2 {
            let ql = b.add(64 * j);
            let qh = b.add(128 + 32 * j);
            let q4bits1 = load256(ql);
            let q4bits2 = load256(ql.add(32));
            let q4bits_h = load256(qh);
            let q4h0 = _mm256_slli_epi16(_mm256_and_si256(q4bits_h, m2), 4);
            let q4h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(q4bits_h, 2), m2), 4);
            let q4h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(q4bits_h, 4), m2), 4);
            let q4h3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(q4bits_h, 6), m2), 4);
            let q = [
                _mm256_or_si256(_mm256_and_si256(q4bits1, m4), q4h0),
                _mm256_or_si256(_mm256_and_si256(q4bits2, m4), q4h1),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits1, 4), m4), q4h2),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits2, 4), m4), q4h3),
            ];
            for (k, qk) in q.iter().enumerate() {
                let y8 = load256(q8.add(128 * j + 32 * k));
                let p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(*qk, y8), _mm256_maddubs_epi16(m32s, y8));
                let s0 = *scp.add(8 * j + 2 * k) as i16;
                let s1 = *scp.add(8 * j + 2 * k + 1) as i16;
                let scale = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(_mm_set1_epi16(s0)), _mm_set1_epi16(s1));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(scale, p16));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

/// Q4_K × four Q8_K activation rows: [`dot_q4_k`]'s operations in the same order for each
/// token (bit-identical results), with the weight block unpacked once for the four.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4_k_x4(w: &[u8], a: [&[BlockQ8K]; 4]) -> [f32; 4] {
    let nb = a[0].len();
    debug_assert!(w.len() >= nb * 144 && a.iter().all(|x| x.len() == nb));
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut acc_m = [_mm_setzero_ps(); 4];
    let sh: [__m256i; 8] = shuffles_i16();
    let p = w.as_ptr();
    for i in 0..nb {
        let b = p.add(144 * i);
        let (dw, dminw) = (f16_ptr(b), f16_ptr(b.add(2)));
        let mins_and_scales = _mm256_cvtepu8_epi16(unpack_scales_k4(b.add(4)));
        let ys = [a[0].get_unchecked(i), a[1].get_unchecked(i), a[2].get_unchecked(i), a[3].get_unchecked(i)];
        for t in 0..4 {
            acc_m[t] = k4_mins(mins_and_scales, ys[t], -ys[t].d * dminw, acc_m[t]);
        }
        let sc128 = _mm256_castsi256_si128(mins_and_scales);
        let scales = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(sc128), sc128);
        let q4 = b.add(16);
        let mut sumi = [_mm256_setzero_si256(); 4];
        for j in 0..4 {
            let scale_l = _mm256_shuffle_epi8(scales, sh[2 * j]);
            let scale_h = _mm256_shuffle_epi8(scales, sh[2 * j + 1]);
            let q4bits = load256(q4.add(32 * j));
            let q4l = _mm256_and_si256(q4bits, m4);
            let q4h = _mm256_and_si256(_mm256_srli_epi16(q4bits, 4), m4);
            for t in 0..4 {
                let q8 = ys[t].qs.as_ptr() as *const u8;
                let p16l = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, load256(q8.add(64 * j))));
                let p16h = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q4h, load256(q8.add(64 * j + 32))));
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(p16l, p16h));
            }
        }
        for t in 0..4 {
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(ys[t].d * dw), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    [
        hsum_ps(acc[0]) + hsum_ps128(acc_m[0]),
        hsum_ps(acc[1]) + hsum_ps128(acc_m[1]),
        hsum_ps(acc[2]) + hsum_ps128(acc_m[2]),
        hsum_ps(acc[3]) + hsum_ps128(acc_m[3]),
    ]
}

/// Q6_K × four Q8_K activation rows: [`dot_q6_k`]'s operations in the same order for each
/// token (bit-identical results), with the weight block unpacked once for the four.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q6_k_x4(w: &[u8], a: [&[BlockQ8K]; 4]) -> [f32; 4] {
    let nb = a[0].len();
    debug_assert!(w.len() >= nb * 210 && a.iter().all(|x| x.len() == nb));
    let m4 = _mm256_set1_epi8(0xF);
    let m2 = _mm256_set1_epi8(3);
    let m32s = _mm256_set1_epi8(32);
    let mut acc = [_mm256_setzero_ps(); 4];
    let p = w.as_ptr();
    for i in 0..nb {
        let b = p.add(210 * i);
        let dw = f16_ptr(b.add(208));
        let scp = b.add(192) as *const i8;
        let ys = [a[0].get_unchecked(i), a[1].get_unchecked(i), a[2].get_unchecked(i), a[3].get_unchecked(i)];
        let mut sumi = [_mm256_setzero_si256(); 4];
        for j in 0..2 {
            let ql = b.add(64 * j);
            let qh = b.add(128 + 32 * j);
            let q4bits1 = load256(ql);
            let q4bits2 = load256(ql.add(32));
            let q4bits_h = load256(qh);
            let q4h0 = _mm256_slli_epi16(_mm256_and_si256(q4bits_h, m2), 4);
            let q4h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(q4bits_h, 2), m2), 4);
            let q4h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(q4bits_h, 4), m2), 4);
            let q4h3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(q4bits_h, 6), m2), 4);
            let q = [
                _mm256_or_si256(_mm256_and_si256(q4bits1, m4), q4h0),
                _mm256_or_si256(_mm256_and_si256(q4bits2, m4), q4h1),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits1, 4), m4), q4h2),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits2, 4), m4), q4h3),
            ];
            for (k, qk) in q.iter().enumerate() {
                let s0 = *scp.add(8 * j + 2 * k) as i16;
                let s1 = *scp.add(8 * j + 2 * k + 1) as i16;
                let scale = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(_mm_set1_epi16(s0)), _mm_set1_epi16(s1));
                for t in 0..4 {
                    let y8 = load256((ys[t].qs.as_ptr() as *const u8).add(128 * j + 32 * k));
                    let p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(*qk, y8), _mm256_maddubs_epi16(m32s, y8));
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(scale, p16));
                }
            }
        }
        for t in 0..4 {
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(ys[t].d * dw), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    [hsum_ps(acc[0]), hsum_ps(acc[1]), hsum_ps(acc[2]), hsum_ps(acc[3])]
}

// ---------------------------------------------------------------------------------------------
// float formats
// ---------------------------------------------------------------------------------------------

/// F32 × f32.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f32(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    debug_assert!(w.len() >= 4 * n);
    let wp = w.as_ptr() as *const f32;
    let xp = x.as_ptr();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(i + 8 * k)), _mm256_loadu_ps(xp.add(i + 8 * k)), *a);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(i)), _mm256_loadu_ps(xp.add(i)), acc[0]);
        i += 8;
    }
    let mut s = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    while i < n {
        s += wp.add(i).read_unaligned() * *xp.add(i);
        i += 1;
    }
    s
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ld_f16x8(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ld_bf16x8(p: *const u8) -> __m256 {
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i)), 16))
}

/// F16 × f32.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f16(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    debug_assert!(w.len() >= 2 * n);
    let wp = w.as_ptr();
    let xp = x.as_ptr();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(ld_f16x8(wp.add(2 * (i + 8 * k))), _mm256_loadu_ps(xp.add(i + 8 * k)), *a);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(ld_f16x8(wp.add(2 * (i))), _mm256_loadu_ps(xp.add(i)), acc[0]);
        i += 8;
    }
    let mut s = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    while i < n {
        s += f16_ptr(wp.add(2 * i)) * *xp.add(i);
        i += 1;
    }
    s
}

/// BF16 × f32.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    debug_assert!(w.len() >= 2 * n);
    let wp = w.as_ptr();
    let xp = x.as_ptr();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(ld_bf16x8(wp.add(2 * (i + 8 * k))), _mm256_loadu_ps(xp.add(i + 8 * k)), *a);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(ld_bf16x8(wp.add(2 * (i))), _mm256_loadu_ps(xp.add(i)), acc[0]);
        i += 8;
    }
    let mut s = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    while i < n {
        let bits = (wp.add(2 * i) as *const u16).read_unaligned();
        s += f32::from_bits((bits as u32) << 16) * *xp.add(i);
        i += 1;
    }
    s
}
