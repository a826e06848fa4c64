//! Block formats of ggml (layouts as in ggml-common.h) and their scalar dequantization.
//!
//! Byte layouts (all little-endian, no padding), `QK = 32`, `QK_K = 256`:
//!
//! | type | block bytes | layout |
//! |---|---|---|
//! | Q4_0 | 18 | `d: f16, qs[16]` (low nibbles = elements 0..16, high = 16..32) |
//! | Q4_1 | 20 | `d: f16, m: f16, qs[16]` |
//! | Q5_0 | 22 | `d: f16, qh[4] (u32 of 5th bits), qs[16]` |
//! | Q5_1 | 24 | `d: f16, m: f16, qh[4], qs[16]` |
//! | Q8_0 | 34 | `d: f16, qs[32]: i8` |
//! | Q4_K | 144 | `d: f16, dmin: f16, scales[12] (8 × 6-bit scale + 8 × 6-bit min), qs[128]` |
//! | Q5_K | 176 | `d: f16, dmin: f16, scales[12], qh[32], qs[128]` |
//! | Q6_K | 210 | `ql[128], qh[64], scales[16]: i8, d: f16` |
//!
//! Besides the weight formats this module holds the activation formats used by the dot
//! products ([`BlockQ8`] for the 32-element formats, [`BlockQ8K`] for the K-quants) and their
//! quantizers, which follow ggml's x86 `quantize_row_q8_0`/`q8_1` and `quantize_row_q8_K_ref`.

// Loops are kept index-based to mirror ggml-quants.c line by line.
#![allow(clippy::needless_range_loop)]

use half::{bf16, f16};

use super::GgmlType;

/// Elements per block of the 32-element formats (Q4_0 … Q8_0).
pub const QK: usize = 32;
/// Elements per super-block of the K-quants.
pub const QK_K: usize = 256;

const GROUP_MAX_EPS: f32 = 1e-15;

// ---------------------------------------------------------------------------------------------
// small helpers
// ---------------------------------------------------------------------------------------------

/// Reads the f16 at `b[o..o + 2]` as f32.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], o: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[o], b[o + 1]])).to_f32()
}

#[inline(always)]
fn put_f16(out: &mut [u8], o: usize, v: f32) {
    out[o..o + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
}

/// Rounds an f32 to the nearest f16 and back (what storing a scale as `ggml_fp16_t` does).
#[inline(always)]
pub(crate) fn round_f16(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// ggml's `nearest_int`: round to nearest, ties to even, via the 1.5·2^23 trick.
/// Valid for |x| <= 4194303 (as in ggml).
#[inline(always)]
pub(crate) fn nearest_int(x: f32) -> i32 {
    let v = x + 12582912.0f32;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// `get_scale_min_k4` of ggml: the 6-bit scale and min of sub-block `j` (0..8) of a Q4_K/Q5_K
/// super-block from its packed 12 scale bytes.
#[inline(always)]
pub(crate) fn get_scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// The 256 unsigned 6-bit quants (`q + 32`) of a Q6_K block, in element order (element `e`
/// has scale `scales[e / 16]`), as ggml's `dequantize_row_q6_K` walks them.
pub(crate) fn q6_k_quants(b: &[u8]) -> [u8; QK_K] {
    let mut u = [0u8; QK_K];
    for n in 0..2 {
        let ql = &b[64 * n..64 * n + 64];
        let qh = &b[128 + 32 * n..128 + 32 * n + 32];
        let y = &mut u[128 * n..128 * n + 128];
        for l in 0..32 {
            y[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
            y[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
            y[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            y[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    u
}

// ---------------------------------------------------------------------------------------------
// dequantization (ggml's dequantize_row_*)
// ---------------------------------------------------------------------------------------------

/// Dequantizes `dst.len()` elements (a multiple of the block size) from `src`.
/// Supports F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K.
///
/// Panics if `dst.len()` is not a whole number of blocks, if `src` is shorter than those
/// blocks, or if `ty` is not one of the supported types.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    let bs = ty.block_size();
    let ts = ty.type_size();
    assert!(dst.len().is_multiple_of(bs), "dequantize {}: {} elements is not a whole number of blocks", ty.name(), dst.len());
    let nb = dst.len() / bs;
    assert!(src.len() >= nb * ts, "dequantize {}: {} bytes, need {}", ty.name(), src.len(), nb * ts);
    let src = &src[..nb * ts];
    match ty {
        GgmlType::F32 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        GgmlType::Q4_0 => {
            for (b, y) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(QK)) {
                let d = f16_at(b, 0);
                let qs = &b[2..18];
                for j in 0..16 {
                    y[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
                    y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        GgmlType::Q4_1 => {
            for (b, y) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(QK)) {
                let d = f16_at(b, 0);
                let m = f16_at(b, 2);
                let qs = &b[4..20];
                for j in 0..16 {
                    y[j] = (qs[j] & 0x0F) as f32 * d + m;
                    y[j + 16] = (qs[j] >> 4) as f32 * d + m;
                }
            }
        }
        GgmlType::Q5_0 => {
            for (b, y) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(QK)) {
                let d = f16_at(b, 0);
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                let qs = &b[6..22];
                for j in 0..16 {
                    let xh0 = (((qh >> j) << 4) & 0x10) as u8;
                    let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
                    y[j] = (((qs[j] & 0x0F) | xh0) as i32 - 16) as f32 * d;
                    y[j + 16] = (((qs[j] >> 4) | xh1) as i32 - 16) as f32 * d;
                }
            }
        }
        GgmlType::Q5_1 => {
            for (b, y) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(QK)) {
                let d = f16_at(b, 0);
                let m = f16_at(b, 2);
                let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                let qs = &b[8..24];
                for j in 0..16 {
                    let xh0 = (((qh >> j) << 4) & 0x10) as u8;
                    let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
                    y[j] = ((qs[j] & 0x0F) | xh0) as f32 * d + m;
                    y[j + 16] = ((qs[j] >> 4) | xh1) as f32 * d + m;
                }
            }
        }
        GgmlType::Q8_0 => {
            for (b, y) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(QK)) {
                let d = f16_at(b, 0);
                for j in 0..QK {
                    y[j] = (b[2 + j] as i8) as f32 * d;
                }
            }
        }
        GgmlType::Q4_K => {
            for (b, y) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(QK_K)) {
                let d = f16_at(b, 0);
                let min = f16_at(b, 2);
                let scales = &b[4..16];
                let qs = &b[16..144];
                for k in 0..4 {
                    let (sc, m) = get_scale_min_k4(2 * k, scales);
                    let (d1, m1) = (d * sc as f32, min * m as f32);
                    let (sc, m) = get_scale_min_k4(2 * k + 1, scales);
                    let (d2, m2) = (d * sc as f32, min * m as f32);
                    let q = &qs[32 * k..32 * k + 32];
                    let yy = &mut y[64 * k..64 * k + 64];
                    for l in 0..32 {
                        yy[l] = d1 * (q[l] & 0xF) as f32 - m1;
                        yy[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
                    }
                }
            }
        }
        GgmlType::Q5_K => {
            for (b, y) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(QK_K)) {
                let d = f16_at(b, 0);
                let min = f16_at(b, 2);
                let scales = &b[4..16];
                let qh = &b[16..48];
                let qs = &b[48..176];
                for k in 0..4 {
                    let (sc, m) = get_scale_min_k4(2 * k, scales);
                    let (d1, m1) = (d * sc as f32, min * m as f32);
                    let (sc, m) = get_scale_min_k4(2 * k + 1, scales);
                    let (d2, m2) = (d * sc as f32, min * m as f32);
                    let u1 = 1u8 << (2 * k);
                    let u2 = 2u8 << (2 * k);
                    let q = &qs[32 * k..32 * k + 32];
                    let yy = &mut y[64 * k..64 * k + 64];
                    for l in 0..32 {
                        let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                        let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                        yy[l] = d1 * ((q[l] & 0xF) + h1) as f32 - m1;
                        yy[l + 32] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
                    }
                }
            }
        }
        GgmlType::Q6_K => {
            for (b, y) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(QK_K)) {
                let d = f16_at(b, 208);
                let u = q6_k_quants(b);
                for (e, y) in y.iter_mut().enumerate() {
                    *y = d * (b[192 + e / 16] as i8) as f32 * (u[e] as i32 - 32) as f32;
                }
            }
        }
        GgmlType::Q2_K => {
            for (b, y) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(QK_K)) {
                let (d, min) = (f16_at(b, 80), f16_at(b, 82));
                for (e, y) in y.iter_mut().enumerate() {
                    let (q, sc) = q2_k_at(b, e);
                    *y = d * (sc & 0xF) as f32 * q as f32 - min * (sc >> 4) as f32;
                }
            }
        }
        GgmlType::Q3_K => {
            for (b, y) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(QK_K)) {
                let d = f16_at(b, 108);
                let sc = q3_k_scales(b);
                for (e, y) in y.iter_mut().enumerate() {
                    *y = d * (sc[e / 16] as i32 - 32) as f32 * q3_k_at(b, e) as f32;
                }
            }
        }
        GgmlType::IQ4_NL => {
            for (b, y) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(QK)) {
                iq4_dequantize(&b[2..18], f16_at(b, 0), y);
            }
        }
        GgmlType::IQ4_XS => {
            for (b, y) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(QK_K)) {
                let d = f16_at(b, 0);
                for (ib, y) in y.chunks_exact_mut(QK).enumerate() {
                    iq4_dequantize(&b[8 + 16 * ib..][..16], d * (iq4_xs_scale(b, ib) - 32) as f32, y);
                }
            }
        }
        other => panic!("dequantize: unsupported type {}", other.name()),
    }
}

/// The non-linear 4-bit grid of IQ4_NL and IQ4_XS (ggml's `kvalues_iq4nl`).
pub const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// 32 IQ4 quants (element `j` in the low nibble of byte `j`, `j + 16` in its high nibble) times
/// the scale `d`.
fn iq4_dequantize(qs: &[u8], d: f32, y: &mut [f32]) {
    for j in 0..16 {
        y[j] = d * KVALUES_IQ4NL[(qs[j] & 0xF) as usize] as f32;
        y[j + 16] = d * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
    }
}

/// Element `e` of a Q2_K block (`scales[16]`, `qs[64]`, `d`, `dmin`): its 2-bit quant and the
/// byte holding its 16-element group's 4-bit scale (low nibble) and min (high nibble).
/// Element order as ggml's `dequantize_row_q2_K`: per 128-element half, four shifts of 32 quants.
#[inline]
pub fn q2_k_at(b: &[u8], e: usize) -> (u8, u8) {
    let (half, r) = (e / 128, e % 128);
    let (shift, l) = (r / 32, r % 32);
    ((b[16 + half * 32 + l] >> (2 * shift)) & 3, b[e / 16])
}

/// The sixteen 6-bit scales of a Q3_K block (`hmask[32]`, `qs[64]`, `scales[12]`, `d`), as
/// ggml unpacks them (kmask1/kmask2), before the −32 offset.
pub fn q3_k_scales(b: &[u8]) -> [u8; 16] {
    let s = &b[96..108];
    let mut out = [0u8; 16];
    for j in 0..16 {
        let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = low | (high << 4);
    }
    out
}

/// Element `e` of a Q3_K block: its signed 3-bit quant (`-4..=3`), the low two bits from `qs`,
/// the high bit (set: no −4) from `hmask`, in ggml's `dequantize_row_q3_K` order.
#[inline]
pub fn q3_k_at(b: &[u8], e: usize) -> i8 {
    let (half, r) = (e / 128, e % 128);
    let (shift, l) = (r / 32, r % 32);
    let low = ((b[32 + half * 32 + l] >> (2 * shift)) & 3) as i8;
    let m = 1u8 << (half * 4 + shift);
    low - if b[l] & m != 0 { 0 } else { 4 }
}

/// The 6-bit scale of 32-element group `ib` of an IQ4_XS block (`d`, `scales_h: u16`,
/// `scales_l[4]`, `qs[128]`), before the −32 offset.
#[inline]
pub fn iq4_xs_scale(b: &[u8], ib: usize) -> i32 {
    let h = u16::from_le_bytes([b[2], b[3]]);
    (((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) as i32) | ((((h >> (2 * ib)) & 3) as i32) << 4)
}

// ---------------------------------------------------------------------------------------------
// reference quantizers (ggml's quantize_row_*_ref)
// ---------------------------------------------------------------------------------------------

/// Quantizes f32 data into `ty` (reference quantizers, as ggml's `quantize_row_*_ref`), used by
/// tests to build synthetic weights. Supports the same types as `dequantize`.
///
/// Panics if `src.len()` is not a whole number of blocks or `ty` is unsupported.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Vec<u8> {
    let bs = ty.block_size();
    let ts = ty.type_size();
    assert!(src.len().is_multiple_of(bs), "quantize {}: {} elements is not a whole number of blocks", ty.name(), src.len());
    let nb = src.len() / bs;
    let mut out = vec![0u8; nb * ts];
    match ty {
        GgmlType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(src) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(src) {
                o.copy_from_slice(&f16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(src) {
                o.copy_from_slice(&bf16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        GgmlType::Q4_0 => {
            for (x, y) in src.chunks_exact(QK).zip(out.chunks_exact_mut(ts)) {
                let (mut amax, mut max) = (0f32, 0f32);
                for &v in x {
                    if amax < v.abs() {
                        amax = v.abs();
                        max = v;
                    }
                }
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                put_f16(y, 0, d);
                for j in 0..16 {
                    let xi0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
                    let xi1 = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
                    y[2 + j] = xi0 | (xi1 << 4);
                }
            }
        }
        GgmlType::Q4_1 => {
            for (x, y) in src.chunks_exact(QK).zip(out.chunks_exact_mut(ts)) {
                let (mut min, mut max) = (f32::MAX, -f32::MAX);
                for &v in x {
                    if v < min {
                        min = v;
                    }
                    if v > max {
                        max = v;
                    }
                }
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                put_f16(y, 0, d);
                put_f16(y, 2, min);
                for j in 0..16 {
                    let xi0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
                    let xi1 = (((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
                    y[4 + j] = xi0 | (xi1 << 4);
                }
            }
        }
        GgmlType::Q5_0 => {
            for (x, y) in src.chunks_exact(QK).zip(out.chunks_exact_mut(ts)) {
                let (mut amax, mut max) = (0f32, 0f32);
                for &v in x {
                    if amax < v.abs() {
                        amax = v.abs();
                        max = v;
                    }
                }
                let d = max / -16.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                put_f16(y, 0, d);
                let mut qh = 0u32;
                for j in 0..16 {
                    let xi0 = ((x[j] * id + 16.5) as i8).min(31) as u8;
                    let xi1 = ((x[j + 16] * id + 16.5) as i8).min(31) as u8;
                    y[6 + j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
                    qh |= (((xi0 & 0x10) >> 4) as u32) << j;
                    qh |= (((xi1 & 0x10) >> 4) as u32) << (j + 16);
                }
                y[2..6].copy_from_slice(&qh.to_le_bytes());
            }
        }
        GgmlType::Q5_1 => {
            for (x, y) in src.chunks_exact(QK).zip(out.chunks_exact_mut(ts)) {
                let (mut min, mut max) = (f32::MAX, -f32::MAX);
                for &v in x {
                    if v < min {
                        min = v;
                    }
                    if v > max {
                        max = v;
                    }
                }
                let d = (max - min) / 31.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                put_f16(y, 0, d);
                put_f16(y, 2, min);
                let mut qh = 0u32;
                for j in 0..16 {
                    let xi0 = ((x[j] - min) * id + 0.5) as u8;
                    let xi1 = ((x[j + 16] - min) * id + 0.5) as u8;
                    y[8 + j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
                    qh |= (((xi0 & 0x10) >> 4) as u32) << j;
                    qh |= (((xi1 & 0x10) >> 4) as u32) << (j + 16);
                }
                y[4..8].copy_from_slice(&qh.to_le_bytes());
            }
        }
        GgmlType::Q8_0 => {
            for (x, y) in src.chunks_exact(QK).zip(out.chunks_exact_mut(ts)) {
                let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                put_f16(y, 0, d);
                for j in 0..QK {
                    y[2 + j] = (x[j] * id).round() as i8 as u8;
                }
            }
        }
        GgmlType::Q4_K => {
            for (x, y) in src.chunks_exact(QK_K).zip(out.chunks_exact_mut(ts)) {
                quantize_block_qkx(x, y, 15);
            }
        }
        GgmlType::Q5_K => {
            for (x, y) in src.chunks_exact(QK_K).zip(out.chunks_exact_mut(ts)) {
                quantize_block_qkx(x, y, 31);
            }
        }
        GgmlType::Q6_K => {
            for (x, y) in src.chunks_exact(QK_K).zip(out.chunks_exact_mut(ts)) {
                quantize_block_q6_k(x, y);
            }
        }
        other => panic!("quantize: unsupported type {}", other.name()),
    }
    out
}

/// ggml's `make_qkx2_quants`: fits `x ≈ scale·L − the_min` with L in 0..=nmax, weighted.
/// Returns `(scale, the_min)`.
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    l_aux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min));
        l_out[i] = l.clamp(0, nmax) as u8;
        let mut diff = scale * l_out[i] as f32 + min - x[i];
        diff = if use_mad { diff.abs() } else { diff * diff };
        best_error += weights[i] * diff;
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            l_aux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let dd = sum_w * sum_l2 - sum_l * sum_l;
        if dd > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / dd;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / dd;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                let mut diff = this_scale * l_aux[i] as f32 + this_min - x[i];
                diff = if use_mad { diff.abs() } else { diff * diff };
                cur_error += weights[i] * diff;
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&l_aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// `quantize_row_q4_K_ref` (nmax = 15) / `quantize_row_q5_K_ref` (nmax = 31) for one block.
fn quantize_block_qkx(x: &[f32], y: &mut [u8], nmax: i32) {
    let mut l = [0u8; QK_K];
    let mut l_aux = [0u8; 32];
    let mut weights = [0f32; 32];
    let mut mins = [0f32; 8];
    let mut scales = [0f32; 8];
    let (rmin, rdelta, nstep) = if nmax == 15 { (-1.0, 0.1, 20) } else { (-0.5, 0.1, 15) };
    let mut max_scale = 0f32;
    let mut max_min = 0f32;
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2: f32 = xs.iter().fold(0f32, |a, v| a + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        for i in 0..32 {
            weights[i] = av_x + xs[i].abs();
        }
        let (s, m) = make_qkx2_quants(nmax, xs, &weights, &mut l[32 * j..32 * j + 32], &mut l_aux, rmin, rdelta, nstep, false);
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let sc = &mut y[4..16];
    sc.fill(0);
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    put_f16(y, 0, max_scale / 63.0);
    put_f16(y, 2, max_min / 63.0);
    let d_all = f16_at(y, 0);
    let dmin_all = f16_at(y, 2);
    for j in 0..8 {
        let (s, m) = get_scale_min_k4(j, &y[4..16]);
        let d = d_all * s as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * m as f32;
        for ii in 0..32 {
            let q = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, nmax);
            l[32 * j + ii] = q as u8;
        }
    }
    if nmax == 15 {
        let qs = &mut y[16..144];
        for k in 0..4 {
            for i in 0..32 {
                qs[32 * k + i] = l[64 * k + i] | (l[64 * k + i + 32] << 4);
            }
        }
    } else {
        let (head, ql) = y.split_at_mut(48);
        let qh = &mut head[16..48];
        qh.fill(0);
        let (mut m1, mut m2) = (1u8, 2u8);
        for k in 0..4 {
            for j in 0..32 {
                let mut l1 = l[64 * k + j];
                if l1 > 15 {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                let mut l2 = l[64 * k + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[32 * k + j] = l1 | (l2 << 4);
            }
            m1 <<= 2;
            m2 <<= 2;
        }
    }
}

/// ggml's `make_qx_quants` with `qw = NULL`. Writes `L[i] = l + nmax` (0..2·nmax) and returns the
/// scale.
fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [i8], mut rmse_type: i32) -> f32 {
    let n = x.len();
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let mut iscale = -(nmax as f32) / max;
    if rmse_type == 0 {
        for i in 0..n {
            let l = nearest_int(iscale * x[i]);
            l_out[i] = (nmax + l.clamp(-nmax, nmax - 1)) as i8;
        }
        return 1.0 / iscale;
    }
    let mut return_early = false;
    if rmse_type < 0 {
        rmse_type = -rmse_type;
        return_early = true;
    }
    let weight = |v: f32| -> f32 {
        match rmse_type {
            1 => v * v,
            2 => 1.0,
            3 => v.abs(),
            _ => v.abs().sqrt(),
        }
    };
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l_out[i] = (l + nmax) as i8;
        let w = weight(x[i]);
        let lf = l as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 { 0.5 * (scale + 1.0 / iscale) } else { 1.0 / iscale };
    }
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for i in 0..n {
            let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
            let w = weight(x[i]);
            let lf = l as f32;
            sumlx += w * x[i] * lf;
            suml2 += w * lf * lf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                let l = nearest_int(iscale * x[i]);
                l_out[i] = (nmax + l.clamp(-nmax, nmax - 1)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `quantize_row_q6_K_ref` for one block.
fn quantize_block_q6_k(x: &[f32], y: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for ib in 0..16 {
        let s = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16], 1);
        scales[ib] = s;
        if s.abs() > max_abs_scale {
            max_abs_scale = s.abs();
            max_scale = s;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        y.fill(0);
        return;
    }
    let iscale = -128.0 / max_scale;
    put_f16(y, 208, 1.0 / iscale);
    for ib in 0..16 {
        y[192 + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
    }
    let d_all = f16_at(y, 208);
    for j in 0..16 {
        let d = d_all * (y[192 + j] as i8) as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let q = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
            l[16 * j + ii] = (q + 32) as i8;
        }
    }
    let l = l.map(|v| v as u8);
    for n in 0..2 {
        let (j, qlo, qho) = (128 * n, 64 * n, 128 + 32 * n);
        for i in 0..32 {
            let q1 = l[j + i] & 0xF;
            let q2 = l[j + i + 32] & 0xF;
            let q3 = l[j + i + 64] & 0xF;
            let q4 = l[j + i + 96] & 0xF;
            y[qlo + i] = q1 | (q3 << 4);
            y[qlo + i + 32] = q2 | (q4 << 4);
            y[qho + i] = (l[j + i] >> 4) | ((l[j + i + 32] >> 4) << 2) | ((l[j + i + 64] >> 4) << 4) | ((l[j + i + 96] >> 4) << 6);
        }
    }
}

/// Rewrites Q4_0 or Q5_0 blocks as Q8_0 blocks with the same scale and integer values, so a
/// row tile can be unpacked once and reused for many tokens (exact: the integer dot products
/// and scales are unchanged). `dst` holds `src.len() / type_size` Q8_0 blocks.
pub fn repack_to_q8_0(ty: GgmlType, src: &[u8], dst: &mut [u8]) {
    let ts = ty.type_size();
    debug_assert_eq!(dst.len(), src.len() / ts * 34);
    match ty {
        GgmlType::Q4_0 => {
            for (b, o) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(34)) {
                o[0] = b[0];
                o[1] = b[1];
                let (lo, hi) = o[2..34].split_at_mut(16);
                for j in 0..16 {
                    lo[j] = (b[2 + j] & 0x0F).wrapping_sub(8);
                    hi[j] = (b[2 + j] >> 4).wrapping_sub(8);
                }
            }
        }
        GgmlType::Q5_0 => {
            for (b, o) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(34)) {
                o[0] = b[0];
                o[1] = b[1];
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                let (lo, hi) = o[2..34].split_at_mut(16);
                for j in 0..16 {
                    let h0 = (((qh >> j) << 4) & 0x10) as u8;
                    let h1 = ((qh >> (j + 12)) & 0x10) as u8;
                    lo[j] = ((b[6 + j] & 0x0F) | h0).wrapping_sub(16);
                    hi[j] = ((b[6 + j] >> 4) | h1).wrapping_sub(16);
                }
            }
        }
        other => panic!("repack_to_q8_0: unsupported type {}", other.name()),
    }
}

// ---------------------------------------------------------------------------------------------
// activation formats
// ---------------------------------------------------------------------------------------------

/// An activation block of 32 elements quantized to 8 bits: ggml's `block_q8_0` / `block_q8_1`
/// combined, with the scales kept as f32 values (already rounded through f16 as ggml stores
/// them). `s = d·Σqs` is only used with Q4_1/Q5_1 weights.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8 {
    /// Scale (f16-rounded).
    pub d: f32,
    /// `d · Σ qs` (f16-rounded, with the un-rounded `d`), as ggml's `block_q8_1.s`.
    pub s: f32,
    /// Quants.
    pub qs: [i8; QK],
    /// `Σ qs` (exact), for the prefill GEMM's unsigned-weight correction.
    pub qsum: i32,
}

impl Default for BlockQ8 {
    fn default() -> Self {
        Self { d: 0.0, s: 0.0, qs: [0; QK], qsum: 0 }
    }
}

/// An activation super-block of 256 elements: ggml's `block_q8_K`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8K {
    /// Scale (f32).
    pub d: f32,
    /// Quants.
    pub qs: [i8; QK_K],
    /// Sums of the quants in groups of 16.
    pub bsums: [i16; QK_K / 16],
}

impl Default for BlockQ8K {
    fn default() -> Self {
        Self { d: 0.0, qs: [0; QK_K], bsums: [0; QK_K / 16] }
    }
}

/// Quantizes `x` (a multiple of 32 long) into `out` (`x.len() / 32` blocks) as ggml's x86
/// `quantize_row_q8_0`/`quantize_row_q8_1` do: `d = amax/127`, `q = round_half_even(x·127/amax)`.
pub fn quantize_act_q8(x: &[f32], out: &mut [BlockQ8]) {
    assert_eq!(x.len(), out.len() * QK, "quantize_act_q8: {} values for {} blocks", x.len(), out.len());
    #[cfg(target_arch = "x86_64")]
    if super::arch::x86::vec::avx2() {
        // SAFETY: AVX2/FMA/F16C were detected; the lengths match (asserted).
        return unsafe { super::arch::x86::vec::quantize_act_q8(x, out) };
    }
    quantize_act_q8_generic(x, out)
}

/// [`quantize_act_q8`] in plain Rust: the definition the SIMD version reproduces bit for bit.
#[doc(hidden)]
pub fn quantize_act_q8_generic(x: &[f32], out: &mut [BlockQ8]) {
    debug_assert_eq!(x.len(), out.len() * QK);
    for (xb, yb) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let mut amax = 0f32;
        for &v in xb {
            amax = amax.max(v.abs());
        }
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            let i = nearest_int(v * id);
            *q = i as i8;
            sum += i;
        }
        yb.d = round_f16(d);
        yb.s = round_f16(d * sum as f32);
        yb.qsum = sum;
    }
}

/// Quantizes `x` (a multiple of 256 long) into `out` as ggml's `quantize_row_q8_K_ref`.
pub fn quantize_act_q8k(x: &[f32], out: &mut [BlockQ8K]) {
    assert_eq!(x.len(), out.len() * QK_K, "quantize_act_q8k: {} values for {} blocks", x.len(), out.len());
    #[cfg(target_arch = "x86_64")]
    if super::arch::x86::vec::avx2() {
        // SAFETY: AVX2/FMA/F16C were detected; the lengths match (asserted).
        return unsafe { super::arch::x86::vec::quantize_act_q8k(x, out) };
    }
    quantize_act_q8k_generic(x, out)
}

/// [`quantize_act_q8k`] in plain Rust: the definition the SIMD version reproduces bit for bit.
#[doc(hidden)]
pub fn quantize_act_q8k_generic(x: &[f32], out: &mut [BlockQ8K]) {
    debug_assert_eq!(x.len(), out.len() * QK_K);
    for (xb, yb) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let (mut max, mut amax) = (0f32, 0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            yb.d = 0.0;
            yb.qs = [0; QK_K];
            yb.bsums = [0; QK_K / 16];
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (j, s) in yb.bsums.iter_mut().enumerate() {
            *s = yb.qs[16 * j..16 * j + 16].iter().map(|&q| q as i16).sum();
        }
        yb.d = 1.0 / iscale;
    }
}
