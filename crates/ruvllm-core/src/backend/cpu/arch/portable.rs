//! Portable vector dot products: plain Rust shaped for LLVM's auto-vectorizer, for every CPU
//! without an `arch` variant (aarch64 first: NEON there; SSE2 on an x86-64 without AVX2, or
//! with `RUVLLM_PORTABLE=1`).
//!
//! Every kernel decodes a block into fixed lane arrays of `i16` (`[i16; 32]` per 32 weights:
//! widen the i8/nibble/5-bit quants once, as ggml's NEON path does with `vmovl`), multiplies
//! them with the activation quants widened the same way, and sums adjacent pairs into `i32`
//! lanes (`x[2i]·y[2i] + x[2i+1]·y[2i+1]`: `pmaddwd` on SSE2, `smull`/`smlal`/`addp` or
//! `sdot` on NEON). Integer sums are exact in any order, and the float part (one multiply
//! per block, accumulated block by block) is written exactly as in [`crate::backend::cpu::dot`],
//! so every kernel here returns the scalar reference's value bit for bit. The f16 scales and
//! F16 weights are converted by a branch-free bit formula (exact, as `half`'s) so that the
//! conversion vectorizes too.
//!
//! Vectorized: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (+ ×4 tokens), Q4_K (+ ×4), Q5_K, Q6_K (+ ×4), F16,
//! BF16. F32 reuses the scalar reference, already written in this shape (8 lane partial sums).
//! No `unsafe`, no intrinsics: what runs here under `RUVLLM_PORTABLE=1` on x86-64 is the code
//! an aarch64 build compiles (to NEON) by default.

// Loops are kept index-based so that each one reads as one vector operation over its lanes.
#![allow(clippy::needless_range_loop)]

use crate::backend::cpu::dot::{self, Kernels};
use crate::backend::cpu::quant::{get_scale_min_k4, BlockQ8, BlockQ8K};

/// The portable kernel set (`isa` "portable").
pub static KERNELS: Kernels = Kernels {
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
    f32: dot::dot_f32,
    f16: dot_f16,
    bf16: dot_bf16,
    gemm: None,
    gemm_k: None,
    isa: "portable",
};

// ---------------------------------------------------------------------------------------------
// lane helpers
// ---------------------------------------------------------------------------------------------

/// f16 bits → f32, exact (equal to `half::f16::to_f32` for every input, NaNs quieted as it
/// does), without branches: the exponent and mantissa moved into place and rebiased by one
/// multiply by 2^112 (which also normalizes subnormals), infinities and NaNs selected.
#[inline(always)]
fn f16_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7FFF;
    let finite = (f32::from_bits(em << 13) * f32::from_bits(0x7780_0000)).to_bits();
    let special = (em << 13) | 0x7F80_0000 | if em > 0x7C00 { 0x0040_0000 } else { 0 };
    f32::from_bits(sign | if em >= 0x7C00 { special } else { finite })
}

/// The f16 at `b[o..o + 2]`.
#[inline(always)]
fn f16_le(b: &[u8], o: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[o], b[o + 1]]))
}

/// bf16 bits → f32, as `half::bf16::to_f32` (NaNs quieted).
#[inline(always)]
fn bf16_to_f32(h: u16) -> f32 {
    let q = if h & 0x7FFF > 0x7F80 { 0x0040 } else { 0 };
    f32::from_bits(((h | q) as u32) << 16)
}

/// 32 activation quants widened to i16.
#[inline(always)]
fn widen32(q: &[i8]) -> [i16; 32] {
    let q: &[i8; 32] = q.try_into().unwrap();
    let mut x = [0i16; 32];
    for i in 0..32 {
        x[i] = q[i] as i16;
    }
    x
}

/// `Σ x[i]·y[i]` over 32 lanes: adjacent pairs summed into 8 i32 lanes (`pmaddwd`), then
/// reduced.
#[inline(always)]
fn dot32(x: &[i16; 32], y: &[i16; 32]) -> i32 {
    let mut acc = [0i32; 8];
    for h in 0..2 {
        for i in 0..8 {
            let k = 16 * h + 2 * i;
            acc[i] += x[k] as i32 * y[k] as i32 + x[k + 1] as i32 * y[k + 1] as i32;
        }
    }
    acc.iter().sum()
}

/// The two 16-lane halves of [`dot32`] (the Q6_K scale groups).
#[inline(always)]
fn dot32_halves(x: &[i16; 32], y: &[i16; 32]) -> [i32; 2] {
    let mut r = [0i32; 2];
    for h in 0..2 {
        let mut acc = [0i32; 8];
        for i in 0..8 {
            let k = 16 * h + 2 * i;
            acc[i] = x[k] as i32 * y[k] as i32 + x[k + 1] as i32 * y[k + 1] as i32;
        }
        r[h] = acc.iter().sum();
    }
    r
}

/// `0x10` where `v & m` (a one-bit mask `m`) is set, else 0, in uniform lane operations (no
/// per-lane shift or compare-select, which SSE2 lowers badly): `+ 0x7FFF` carries any set bit
/// into bit 15, which moves to bit 4.
#[inline(always)]
fn bit_to_0x10(v: u16, m: u16) -> i16 {
    (((v & m).wrapping_add(0x7FFF) >> 11) & 0x10) as i16
}

/// The 16 low and 16 high nibbles of `qs` (16 bytes) as lanes 0..16 and 16..32, each with
/// bit `j` of `qh` (a u32) at 0x10 in lane `j` when `five`, minus `bias`.
#[inline(always)]
fn nibbles32(qs: &[u8], qh: u32, five: bool, bias: i16) -> [i16; 32] {
    let qs: &[u8; 16] = qs.try_into().unwrap();
    let (lo, hi) = (qh as u16, (qh >> 16) as u16);
    let mut x = [0i16; 32];
    for j in 0..16 {
        let (h0, h1) = if five { (bit_to_0x10(lo, 1 << j), bit_to_0x10(hi, 1 << j)) } else { (0, 0) };
        x[j] = ((qs[j] & 0x0F) as i16 | h0) - bias;
        x[j + 16] = ((qs[j] >> 4) as i16 | h1) - bias;
    }
    x
}

// ---------------------------------------------------------------------------------------------
// the 32-element formats
// ---------------------------------------------------------------------------------------------

/// Q4_0 × Q8_0.
pub fn dot_q4_0(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut sumf = 0f32;
    for (b, y) in w.chunks_exact(18).zip(a) {
        let x = nibbles32(&b[2..18], 0, false, 8);
        let sumi = dot32(&x, &widen32(&y.qs));
        sumf += sumi as f32 * (f16_le(b, 0) * y.d);
    }
    sumf
}

/// Q4_1 × Q8_1.
pub fn dot_q4_1(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut sumf = 0f32;
    for (b, y) in w.chunks_exact(20).zip(a) {
        let x = nibbles32(&b[4..20], 0, false, 0);
        let sumi = dot32(&x, &widen32(&y.qs));
        sumf += sumi as f32 * (f16_le(b, 0) * y.d) + f16_le(b, 2) * y.s;
    }
    sumf
}

/// Q5_0 × Q8_0.
pub fn dot_q5_0(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut sumf = 0f32;
    for (b, y) in w.chunks_exact(22).zip(a) {
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let x = nibbles32(&b[6..22], qh, true, 16);
        let sumi = dot32(&x, &widen32(&y.qs));
        sumf += sumi as f32 * (f16_le(b, 0) * y.d);
    }
    sumf
}

/// Q5_1 × Q8_1.
pub fn dot_q5_1(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut sumf = 0f32;
    for (b, y) in w.chunks_exact(24).zip(a) {
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let x = nibbles32(&b[8..24], qh, true, 0);
        let sumi = dot32(&x, &widen32(&y.qs));
        sumf += sumi as f32 * (f16_le(b, 0) * y.d) + f16_le(b, 2) * y.s;
    }
    sumf
}

/// Q8_0 × Q8_0.
pub fn dot_q8_0(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut sumf = 0f32;
    for (b, y) in w.chunks_exact(34).zip(a) {
        let x = q8_0_weights(b);
        let sumi = dot32(&x, &widen32(&y.qs));
        sumf += sumi as f32 * (f16_le(b, 0) * y.d);
    }
    sumf
}

#[inline(always)]
fn q8_0_weights(b: &[u8]) -> [i16; 32] {
    let q: &[u8; 32] = b[2..34].try_into().unwrap();
    let mut x = [0i16; 32];
    for i in 0..32 {
        x[i] = q[i] as i8 as i16;
    }
    x
}

/// Q8_0 × 4 tokens: each weight block widened once for the four activation rows.
pub fn dot_q8_0_x4(w: &[u8], a: [&[BlockQ8]; 4]) -> [f32; 4] {
    let nb = a.iter().map(|r| r.len()).min().unwrap_or(0);
    let mut sumf = [0f32; 4];
    for (i, b) in w.chunks_exact(34).take(nb).enumerate() {
        let x = q8_0_weights(b);
        let d = f16_le(b, 0);
        for r in 0..4 {
            let y = &a[r][i];
            let sumi = dot32(&x, &widen32(&y.qs));
            sumf[r] += sumi as f32 * (d * y.d);
        }
    }
    sumf
}

// ---------------------------------------------------------------------------------------------
// K-quants
// ---------------------------------------------------------------------------------------------

/// The 8 sub-block scales and the min correction `Σ_j mins[j]·(bsums[2j] + bsums[2j+1])` of a
/// Q4_K/Q5_K block (as `dot::k_min_sum`).
#[inline(always)]
fn k_scales(scales: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..8 {
        (sc[j], mn[j]) = get_scale_min_k4(j, scales);
    }
    (sc, mn)
}

#[inline(always)]
fn k_min_sum(mn: &[u8; 8], y: &BlockQ8K) -> i32 {
    let mut msum = 0i32;
    for j in 0..8 {
        msum += mn[j] as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32);
    }
    msum
}

/// The 64 quants of sub-blocks `2k` and `2k + 1` of a Q4_K block (`q`: its 32 bytes; `qh`: the
/// Q5_K high bits, bit `2k`/`2k + 1` of each byte, when `five`).
#[inline(always)]
fn k4_pair(q: &[u8], qh: &[u8], k: usize, five: bool) -> ([i16; 32], [i16; 32]) {
    let q: &[u8; 32] = q.try_into().unwrap();
    let mut lo = [0i16; 32];
    let mut hi = [0i16; 32];
    for l in 0..32 {
        let (h0, h1) = if five { (bit_to_0x10(qh[l] as u16, 1 << (2 * k)), bit_to_0x10(qh[l] as u16, 2 << (2 * k))) } else { (0, 0) };
        lo[l] = (q[l] & 0xF) as i16 | h0;
        hi[l] = (q[l] >> 4) as i16 | h1;
    }
    (lo, hi)
}

#[inline(always)]
fn k4_block(b: &[u8], y: &BlockQ8K, five: bool) -> f32 {
    let (sc, mn) = k_scales(&b[4..16]);
    let msum = k_min_sum(&mn, y);
    let (qh, qs) = if five { (&b[16..48], &b[48..176]) } else { (&b[0..32], &b[16..144]) };
    let mut isum = 0i32;
    for k in 0..4 {
        let (lo, hi) = k4_pair(&qs[32 * k..32 * k + 32], qh, k, five);
        let s0 = dot32(&lo, &widen32(&y.qs[64 * k..64 * k + 32]));
        let s1 = dot32(&hi, &widen32(&y.qs[64 * k + 32..64 * k + 64]));
        isum += sc[2 * k] as i32 * s0 + sc[2 * k + 1] as i32 * s1;
    }
    f16_le(b, 0) * y.d * isum as f32 - f16_le(b, 2) * y.d * msum as f32
}

/// Q4_K × Q8_K.
pub fn dot_q4_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (b, y) in w.chunks_exact(144).zip(a) {
        sumf += k4_block(b, y, false);
    }
    sumf
}

/// Q5_K × Q8_K.
pub fn dot_q5_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (b, y) in w.chunks_exact(176).zip(a) {
        sumf += k4_block(b, y, true);
    }
    sumf
}

/// Q4_K × 4 tokens: each sub-block pair decoded once for the four activation rows.
pub fn dot_q4_k_x4(w: &[u8], a: [&[BlockQ8K]; 4]) -> [f32; 4] {
    let nb = a.iter().map(|r| r.len()).min().unwrap_or(0);
    let mut sumf = [0f32; 4];
    for (i, b) in w.chunks_exact(144).take(nb).enumerate() {
        let (sc, mn) = k_scales(&b[4..16]);
        let ys = [&a[0][i], &a[1][i], &a[2][i], &a[3][i]];
        let mut isum = [0i32; 4];
        let qs = &b[16..144];
        for k in 0..4 {
            let (lo, hi) = k4_pair(&qs[32 * k..32 * k + 32], &[], k, false);
            for r in 0..4 {
                let s0 = dot32(&lo, &widen32(&ys[r].qs[64 * k..64 * k + 32]));
                let s1 = dot32(&hi, &widen32(&ys[r].qs[64 * k + 32..64 * k + 64]));
                isum[r] += sc[2 * k] as i32 * s0 + sc[2 * k + 1] as i32 * s1;
            }
        }
        let (d, dmin) = (f16_le(b, 0), f16_le(b, 2));
        for r in 0..4 {
            let msum = k_min_sum(&mn, ys[r]);
            sumf[r] += d * ys[r].d * isum[r] as f32 - dmin * ys[r].d * msum as f32;
        }
    }
    sumf
}

/// The 128 signed quants (`q − 32`) of half `n`-th of a Q6_K block, as four lane arrays in
/// element order (`[l]`, `[l + 32]`, `[l + 64]`, `[l + 96]`).
#[inline(always)]
fn q6_k_half(b: &[u8], n: usize) -> [[i16; 32]; 4] {
    let ql: &[u8; 64] = b[64 * n..64 * n + 64].try_into().unwrap();
    let qh: &[u8; 32] = b[128 + 32 * n..128 + 32 * n + 32].try_into().unwrap();
    let mut q = [[0i16; 32]; 4];
    for l in 0..32 {
        q[0][l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i16 - 32;
        q[1][l] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i16 - 32;
        q[2][l] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i16 - 32;
        q[3][l] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i16 - 32;
    }
    q
}

/// `Σ_g sc[g]·s[g]` of half `n` of a Q6_K block against `y`.
#[inline(always)]
fn q6_k_half_dot(q: &[[i16; 32]; 4], sc: &[u8], y: &BlockQ8K, n: usize) -> i32 {
    let yq = &y.qs[128 * n..128 * n + 128];
    let mut isum = 0i32;
    for p in 0..4 {
        let s = dot32_halves(&q[p], &widen32(&yq[32 * p..32 * p + 32]));
        isum += (sc[2 * p] as i8) as i32 * s[0] + (sc[2 * p + 1] as i8) as i32 * s[1];
    }
    isum
}

/// Q6_K × Q8_K.
pub fn dot_q6_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (b, y) in w.chunks_exact(210).zip(a) {
        let mut isum = 0i32;
        for n in 0..2 {
            let q = q6_k_half(b, n);
            isum += q6_k_half_dot(&q, &b[192 + 8 * n..192 + 8 * n + 8], y, n);
        }
        sumf += f16_le(b, 208) * y.d * isum as f32;
    }
    sumf
}

/// Q6_K × 4 tokens: each half block decoded once for the four activation rows.
pub fn dot_q6_k_x4(w: &[u8], a: [&[BlockQ8K]; 4]) -> [f32; 4] {
    let nb = a.iter().map(|r| r.len()).min().unwrap_or(0);
    let mut sumf = [0f32; 4];
    for (i, b) in w.chunks_exact(210).take(nb).enumerate() {
        let mut isum = [0i32; 4];
        for n in 0..2 {
            let q = q6_k_half(b, n);
            let sc = &b[192 + 8 * n..192 + 8 * n + 8];
            for r in 0..4 {
                isum[r] += q6_k_half_dot(&q, sc, &a[r][i], n);
            }
        }
        let d = f16_le(b, 208);
        for r in 0..4 {
            sumf[r] += d * a[r][i].d * isum[r] as f32;
        }
    }
    sumf
}

// ---------------------------------------------------------------------------------------------
// float formats
// ---------------------------------------------------------------------------------------------

/// F16 × f32: the scalar reference's 8 partial sums, with a conversion that vectorizes.
pub fn dot_f16(w: &[u8], x: &[f32]) -> f32 {
    dot_half(w, x, f16_to_f32)
}

/// BF16 × f32 (as [`dot_f16`]).
pub fn dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    dot_half(w, x, bf16_to_f32)
}

#[inline(always)]
fn dot_half(w: &[u8], x: &[f32], cvt: impl Fn(u16) -> f32) -> f32 {
    let mut acc = [0f32; 8];
    for (c, xs) in w.chunks_exact(16).zip(x.chunks_exact(8)) {
        let c: &[u8; 16] = c.try_into().unwrap();
        for i in 0..8 {
            acc[i] += cvt(u16::from_le_bytes([c[2 * i], c[2 * i + 1]])) * xs[i];
        }
    }
    let done = (x.len() / 8) * 8;
    let mut tail = 0f32;
    for i in done..x.len() {
        tail += cvt(u16::from_le_bytes([w[2 * i], w[2 * i + 1]])) * x[i];
    }
    acc.iter().sum::<f32>() + tail
}
