//! Dot products of one weight row (raw ggml blocks) with one quantized activation row, as
//! ggml's `ggml_vec_dot_*`: scalar reference versions here, SIMD versions in `simd_avx2`,
//! chosen once at run time by [`kernels`].
//!
//! Every function takes the weight row as bytes (`nb × type_size` long) and the activation row
//! (`nb` blocks, or `cols` f32 for the float formats). Lengths are checked by the callers
//! (`matmul`), so the SIMD versions may rely on them.

// Loops are kept index-based to mirror ggml-quants.c line by line.
#![allow(clippy::needless_range_loop)]

use half::{bf16, f16};

use super::quant::{f16_at, get_scale_min_k4, iq4_xs_scale, q3_k_at, q3_k_scales, BlockQ8, BlockQ8K, KVALUES_IQ4NL, QK, QK_K};
use super::GgmlType;

/// Weight row × Q8 activation row (the 32-element formats).
pub type DotQ8Fn = unsafe fn(w: &[u8], a: &[BlockQ8]) -> f32;
/// Weight row × Q8_K activation row (the K-quants).
pub type DotQ8KFn = unsafe fn(w: &[u8], a: &[BlockQ8K]) -> f32;
/// One Q8_0 weight row × four Q8 activation rows; equal, bit for bit, to four `DotQ8Fn` calls
/// of the same kernel set.
pub type DotQ8x4Fn = unsafe fn(w: &[u8], a: [&[BlockQ8]; 4]) -> [f32; 4];
/// One K-quant weight row × four Q8_K activation rows; equal, bit for bit, to four `DotQ8KFn`
/// calls of the same kernel set.
pub type DotQ8Kx4Fn = unsafe fn(w: &[u8], a: [&[BlockQ8K]; 4]) -> [f32; 4];
/// Weight row × f32 activations (F32, F16, BF16).
pub type DotF32Fn = unsafe fn(w: &[u8], x: &[f32]) -> f32;

/// The dot product to use for one weight type.
#[derive(Clone, Copy)]
pub enum DotKernel {
    /// Activations quantized to [`BlockQ8`].
    Q8(DotQ8Fn),
    /// Activations quantized to [`BlockQ8K`].
    Q8K(DotQ8KFn),
    /// Activations kept as f32.
    F32(DotF32Fn),
}

/// One complete set of dot products.
#[derive(Clone, Copy)]
pub struct Kernels {
    pub q4_0: DotQ8Fn,
    pub q4_1: DotQ8Fn,
    pub q5_0: DotQ8Fn,
    pub q5_1: DotQ8Fn,
    pub q8_0: DotQ8Fn,
    /// Q8_0 × four tokens at once (prefill).
    pub q8_0_x4: DotQ8x4Fn,
    pub q4_k: DotQ8KFn,
    /// Q4_K × four tokens at once (prefill).
    pub q4_k_x4: DotQ8Kx4Fn,
    pub q5_k: DotQ8KFn,
    pub q6_k: DotQ8KFn,
    /// Q6_K × four tokens at once (prefill).
    pub q6_k_x4: DotQ8Kx4Fn,
    pub f32: DotF32Fn,
    pub f16: DotF32Fn,
    pub bf16: DotF32Fn,
    /// Prefill tile GEMM for Q4_0/Q5_0/Q8_0 (`gemm`), where the CPU has one.
    pub gemm: Option<super::gemm::GemmFn>,
    /// The same for Q4_K/Q6_K.
    pub gemm_k: Option<super::gemm::GemmKFn>,
    /// Name of the instruction set, for logs and benchmarks.
    pub isa: &'static str,
}

impl Kernels {
    /// The kernel for weights of type `ty`, `None` when unsupported.
    pub fn for_type(&self, ty: GgmlType) -> Option<DotKernel> {
        Some(match ty {
            GgmlType::Q4_0 => DotKernel::Q8(self.q4_0),
            GgmlType::Q4_1 => DotKernel::Q8(self.q4_1),
            GgmlType::Q5_0 => DotKernel::Q8(self.q5_0),
            GgmlType::Q5_1 => DotKernel::Q8(self.q5_1),
            GgmlType::Q8_0 => DotKernel::Q8(self.q8_0),
            GgmlType::Q4_K => DotKernel::Q8K(self.q4_k),
            GgmlType::Q5_K => DotKernel::Q8K(self.q5_k),
            GgmlType::Q6_K => DotKernel::Q8K(self.q6_k),
            // The less common formats have only the reference kernels, on every CPU.
            GgmlType::Q2_K => DotKernel::Q8K(dot_q2_k),
            GgmlType::Q3_K => DotKernel::Q8K(dot_q3_k),
            GgmlType::IQ4_NL => DotKernel::Q8(dot_iq4_nl),
            GgmlType::IQ4_XS => DotKernel::Q8K(dot_iq4_xs),
            GgmlType::F32 => DotKernel::F32(self.f32),
            GgmlType::F16 => DotKernel::F32(self.f16),
            GgmlType::BF16 => DotKernel::F32(self.bf16),
            _ => return None,
        })
    }
}

/// The portable scalar kernels (reference implementations).
pub static SCALAR: Kernels = Kernels {
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
    isa: "scalar",
};

// ---------------------------------------------------------------------------------------------
// scalar reference dot products (ggml_vec_dot_*_generic)
// ---------------------------------------------------------------------------------------------

/// Q2_K × Q8_K (ggml's `ggml_vec_dot_q2_K_q8_K_generic`; the integer sums are exact, so the
/// grouping of the additions does not matter).
pub fn dot_q2_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (b, y) in w.chunks_exact(84).zip(a) {
        let sc = &b[..16];
        let summs: i32 = (0..16).map(|j| y.bsums[j] as i32 * (sc[j] >> 4) as i32).sum();
        let mut isum = 0i32;
        for half in 0..2 {
            for shift in 0..4 {
                for g in 0..2 {
                    let q = &b[16 + half * 32 + g * 16..][..16];
                    let q8 = &y.qs[half * 128 + shift * 32 + g * 16..][..16];
                    let s: i32 = (0..16).map(|l| q8[l] as i32 * ((q[l] >> (2 * shift)) & 3) as i32).sum();
                    isum += (sc[half * 8 + shift * 2 + g] & 0xF) as i32 * s;
                }
            }
        }
        sumf += y.d * f16_at(b, 80) * isum as f32 - y.d * f16_at(b, 82) * summs as f32;
    }
    sumf
}

/// Q3_K × Q8_K (ggml's `ggml_vec_dot_q3_K_q8_K_generic`).
pub fn dot_q3_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (b, y) in w.chunks_exact(110).zip(a) {
        let sc = q3_k_scales(b);
        let mut isum = 0i32;
        for g in 0..16 {
            let s: i32 = (g * 16..g * 16 + 16).map(|e| y.qs[e] as i32 * q3_k_at(b, e) as i32).sum();
            isum += (sc[g] as i32 - 32) * s;
        }
        sumf += f16_at(b, 108) * y.d * isum as f32;
    }
    sumf
}

/// IQ4_NL × Q8_0 (ggml's `ggml_vec_dot_iq4_nl_q8_0`).
pub fn dot_iq4_nl(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut sumf = 0f32;
    for (b, y) in w.chunks_exact(18).zip(a) {
        sumf += f16_at(b, 0) * y.d * iq4_sum(&b[2..18], &y.qs) as f32;
    }
    sumf
}

/// The integer dot product of 32 IQ4 quants (16 bytes: element `j` in the low nibble of byte
/// `j`, element `j + 16` in its high nibble) with 32 activation quants.
fn iq4_sum(qs: &[u8], q8: &[i8]) -> i32 {
    (0..16).map(|j| KVALUES_IQ4NL[(qs[j] & 0xF) as usize] as i32 * q8[j] as i32 + KVALUES_IQ4NL[(qs[j] >> 4) as usize] as i32 * q8[j + 16] as i32).sum()
}

/// IQ4_XS × Q8_K (ggml's `ggml_vec_dot_iq4_xs_q8_K`).
pub fn dot_iq4_xs(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (b, y) in w.chunks_exact(136).zip(a) {
        let mut isum = 0i32;
        for ib in 0..8 {
            isum += (iq4_xs_scale(b, ib) - 32) * iq4_sum(&b[8 + 16 * ib..][..16], &y.qs[32 * ib..][..32]);
        }
        sumf += f16_at(b, 0) * y.d * isum as f32;
    }
    sumf
}

/// Q4_0 × Q8_0.
pub fn dot_q4_0(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut sumf = 0f32;
    for (b, y) in w.chunks_exact(18).zip(a) {
        let qs = &b[2..18];
        let mut sumi = 0i32;
        for j in 0..16 {
            let v0 = (qs[j] & 0x0F) as i32 - 8;
            let v1 = (qs[j] >> 4) as i32 - 8;
            sumi += v0 * y.qs[j] as i32 + v1 * y.qs[j + 16] as i32;
        }
        sumf += sumi as f32 * (f16_at(b, 0) * y.d);
    }
    sumf
}

/// Q4_1 × Q8_1.
pub fn dot_q4_1(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut sumf = 0f32;
    for (b, y) in w.chunks_exact(20).zip(a) {
        let qs = &b[4..20];
        let mut sumi = 0i32;
        for j in 0..16 {
            sumi += (qs[j] & 0x0F) as i32 * y.qs[j] as i32 + (qs[j] >> 4) as i32 * y.qs[j + 16] as i32;
        }
        sumf += sumi as f32 * (f16_at(b, 0) * y.d) + f16_at(b, 2) * y.s;
    }
    sumf
}

/// Q5_0 × Q8_0.
pub fn dot_q5_0(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut sumf = 0f32;
    for (b, y) in w.chunks_exact(22).zip(a) {
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let qs = &b[6..22];
        let mut sumi = 0i32;
        for j in 0..16 {
            let xh0 = (((qh >> j) << 4) & 0x10) as u8;
            let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
            let x0 = ((qs[j] & 0x0F) | xh0) as i32 - 16;
            let x1 = ((qs[j] >> 4) | xh1) as i32 - 16;
            sumi += x0 * y.qs[j] as i32 + x1 * y.qs[j + 16] as i32;
        }
        sumf += sumi as f32 * (f16_at(b, 0) * y.d);
    }
    sumf
}

/// Q5_1 × Q8_1.
pub fn dot_q5_1(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut sumf = 0f32;
    for (b, y) in w.chunks_exact(24).zip(a) {
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let qs = &b[8..24];
        let mut sumi = 0i32;
        for j in 0..16 {
            let xh0 = (((qh >> j) << 4) & 0x10) as u8;
            let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
            let x0 = ((qs[j] & 0x0F) | xh0) as i32;
            let x1 = ((qs[j] >> 4) | xh1) as i32;
            sumi += x0 * y.qs[j] as i32 + x1 * y.qs[j + 16] as i32;
        }
        sumf += sumi as f32 * (f16_at(b, 0) * y.d) + f16_at(b, 2) * y.s;
    }
    sumf
}

/// Q8_0 × Q8_0.
pub fn dot_q8_0(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut sumf = 0f32;
    for (b, y) in w.chunks_exact(34).zip(a) {
        let mut sumi = 0i32;
        for j in 0..QK {
            sumi += (b[2 + j] as i8) as i32 * y.qs[j] as i32;
        }
        sumf += sumi as f32 * (f16_at(b, 0) * y.d);
    }
    sumf
}

/// Q4_K × 4 tokens.
pub fn dot_q4_k_x4(w: &[u8], a: [&[BlockQ8K]; 4]) -> [f32; 4] {
    a.map(|a| dot_q4_k(w, a))
}

/// Q6_K × 4 tokens.
pub fn dot_q6_k_x4(w: &[u8], a: [&[BlockQ8K]; 4]) -> [f32; 4] {
    a.map(|a| dot_q6_k(w, a))
}

/// Q8_0 × 4 tokens.
pub fn dot_q8_0_x4(w: &[u8], a: [&[BlockQ8]; 4]) -> [f32; 4] {
    a.map(|a| dot_q8_0(w, a))
}

/// The min correction `Σ_j mins[j]·(bsums[2j] + bsums[2j+1])` of a Q4_K/Q5_K block.
#[inline(always)]
fn k_min_sum(scales: &[u8], y: &BlockQ8K) -> (i32, [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut msum = 0i32;
    for j in 0..8 {
        let (s, m) = get_scale_min_k4(j, scales);
        sc[j] = s;
        msum += m as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32);
    }
    (msum, sc)
}

/// Q4_K × Q8_K.
pub fn dot_q4_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (b, y) in w.chunks_exact(144).zip(a) {
        let (msum, sc) = k_min_sum(&b[4..16], y);
        let qs = &b[16..144];
        let mut isum = 0i32;
        for k in 0..4 {
            let q = &qs[32 * k..32 * k + 32];
            let y0 = &y.qs[64 * k..64 * k + 32];
            let y1 = &y.qs[64 * k + 32..64 * k + 64];
            let (mut s0, mut s1) = (0i32, 0i32);
            for l in 0..32 {
                s0 += (q[l] & 0xF) as i32 * y0[l] as i32;
                s1 += (q[l] >> 4) as i32 * y1[l] as i32;
            }
            isum += sc[2 * k] as i32 * s0 + sc[2 * k + 1] as i32 * s1;
        }
        sumf += f16_at(b, 0) * y.d * isum as f32 - f16_at(b, 2) * y.d * msum as f32;
    }
    sumf
}

/// Q5_K × Q8_K.
pub fn dot_q5_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (b, y) in w.chunks_exact(176).zip(a) {
        let (msum, sc) = k_min_sum(&b[4..16], y);
        let qh = &b[16..48];
        let qs = &b[48..176];
        let mut isum = 0i32;
        for k in 0..4 {
            let q = &qs[32 * k..32 * k + 32];
            let y0 = &y.qs[64 * k..64 * k + 32];
            let y1 = &y.qs[64 * k + 32..64 * k + 64];
            let (mut s0, mut s1) = (0i32, 0i32);
            for l in 0..32 {
                let h0 = ((qh[l] >> (2 * k)) & 1) << 4;
                let h1 = ((qh[l] >> (2 * k + 1)) & 1) << 4;
                s0 += ((q[l] & 0xF) | h0) as i32 * y0[l] as i32;
                s1 += ((q[l] >> 4) | h1) as i32 * y1[l] as i32;
            }
            isum += sc[2 * k] as i32 * s0 + sc[2 * k + 1] as i32 * s1;
        }
        sumf += f16_at(b, 0) * y.d * isum as f32 - f16_at(b, 2) * y.d * msum as f32;
    }
    sumf
}

/// Q6_K × Q8_K.
pub fn dot_q6_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (b, y) in w.chunks_exact(210).zip(a) {
        let mut isum = 0i32;
        for n in 0..2 {
            let ql = &b[64 * n..64 * n + 64];
            let qh = &b[128 + 32 * n..128 + 32 * n + 32];
            let sc = &b[192 + 8 * n..192 + 8 * n + 8];
            let yq = &y.qs[128 * n..128 * n + 128];
            let mut s = [0i32; 8];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                s[is] += q1 * yq[l] as i32;
                s[is + 2] += q2 * yq[l + 32] as i32;
                s[is + 4] += q3 * yq[l + 64] as i32;
                s[is + 6] += q4 * yq[l + 96] as i32;
            }
            for g in 0..8 {
                isum += (sc[g] as i8) as i32 * s[g];
            }
        }
        sumf += f16_at(b, 208) * y.d * isum as f32;
    }
    sumf
}

/// F32 × f32.
pub fn dot_f32(w: &[u8], x: &[f32]) -> f32 {
    // 8 partial sums so that the compiler can vectorize (SSE2) and the rounding is stable.
    let mut acc = [0f32; 8];
    for (c, xs) in w.chunks_exact(32).zip(x.chunks_exact(8)) {
        for i in 0..8 {
            let v = f32::from_le_bytes([c[4 * i], c[4 * i + 1], c[4 * i + 2], c[4 * i + 3]]);
            acc[i] += v * xs[i];
        }
    }
    let done = (x.len() / 8) * 8;
    let mut tail = 0f32;
    for i in done..x.len() {
        let o = 4 * i;
        tail += f32::from_le_bytes([w[o], w[o + 1], w[o + 2], w[o + 3]]) * x[i];
    }
    acc.iter().sum::<f32>() + tail
}

/// F16 × f32.
pub fn dot_f16(w: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for (c, xs) in w.chunks_exact(16).zip(x.chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += f16::from_bits(u16::from_le_bytes([c[2 * i], c[2 * i + 1]])).to_f32() * xs[i];
        }
    }
    let done = (x.len() / 8) * 8;
    let mut tail = 0f32;
    for i in done..x.len() {
        tail += f16::from_bits(u16::from_le_bytes([w[2 * i], w[2 * i + 1]])).to_f32() * x[i];
    }
    acc.iter().sum::<f32>() + tail
}

/// BF16 × f32.
pub fn dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for (c, xs) in w.chunks_exact(16).zip(x.chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += bf16::from_bits(u16::from_le_bytes([c[2 * i], c[2 * i + 1]])).to_f32() * xs[i];
        }
    }
    let done = (x.len() / 8) * 8;
    let mut tail = 0f32;
    for i in done..x.len() {
        tail += bf16::from_bits(u16::from_le_bytes([w[2 * i], w[2 * i + 1]])).to_f32() * x[i];
    }
    acc.iter().sum::<f32>() + tail
}

#[allow(dead_code)]
const _: () = assert!(QK_K == 256);
