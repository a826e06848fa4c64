//! Kernel tests: block formats round-trip, matmul against an f32 reference of the dequantized
//! weights, SIMD against scalar, thread-count independence, weight validation. All data is
//! synthetic (seeded), so these run without a model file.
//!
//! Throughput check (prints GB/s): `cargo test -p ruvllm-core --test kernels --release -- --ignored --nocapture throughput`

#![allow(clippy::needless_range_loop)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ruvllm_core::backend::cpu::gemm;
use ruvllm_core::backend::cpu::matmul::{matmul_fused, matmul_scalar, WeightData};
use ruvllm_core::backend::cpu::quant::{
    dequantize, quantize, quantize_act_q8, quantize_act_q8_generic, quantize_act_q8k, quantize_act_q8k_generic, BlockQ8, BlockQ8K,
};
use ruvllm_core::backend::cpu::{dispatch, matmul, GgmlType, QWeight};
use ruvllm_core::runtime::ThreadPool;

/// xorshift64* with a Box-Muller normal.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }
    fn normal(&mut self) -> f32 {
        let (u1, u2) = (self.uniform(), self.uniform());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f32::consts::PI * u2).cos()
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() * scale).collect()
    }
}

const ALL: [GgmlType; 11] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Bound on RMS(dequant − orig) / RMS(orig) for Gaussian data.
fn rel_rms_bound(ty: GgmlType) -> f32 {
    match ty {
        GgmlType::F32 => 0.0,
        GgmlType::F16 => 5e-4,
        GgmlType::BF16 => 4e-3,
        GgmlType::Q4_0 => 0.12,
        GgmlType::Q4_1 => 0.10,
        GgmlType::Q5_0 => 0.06,
        GgmlType::Q5_1 => 0.05,
        GgmlType::Q8_0 => 0.006,
        GgmlType::Q4_K => 0.10,
        GgmlType::Q5_K => 0.05,
        GgmlType::Q6_K => 0.025,
        _ => unreachable!(),
    }
}

/// Formats without a reference quantizer here: their weights are random bytes with small
/// finite f16 scales (every quant, index or sub-block scale pattern is valid).
const RANDOM_BYTES: [GgmlType; 4] = [GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::Q3_K, GgmlType::Q2_K];

/// Where a [`RANDOM_BYTES`] block keeps its f16 scales.
fn f16_scales(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q3_K => &[108],
        GgmlType::Q2_K => &[80, 82],
        _ => &[0],
    }
}

fn weight(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> (QWeight, Vec<f32>) {
    let mut rng = Rng::new(seed);
    let bytes = if RANDOM_BYTES.contains(&ty) {
        let mut b: Vec<u8> = (0..rows * cols / ty.block_size() * ty.type_size()).map(|_| rng.next_u64() as u8).collect();
        for blk in b.chunks_exact_mut(ty.type_size()) {
            for &o in f16_scales(ty) {
                let d = half::f16::from_f32(rng.normal() * 4e-4);
                blk[o..o + 2].copy_from_slice(&d.to_le_bytes());
            }
        }
        b
    } else {
        quantize(ty, &rng.vec(rows * cols, 0.05))
    };
    let qw = QWeight::new(ty, rows, cols, WeightData::Owned(Arc::new(bytes))).expect("valid weight");
    let mut deq = vec![0f32; rows * cols];
    dequantize(ty, qw.bytes(), &mut deq);
    (qw, deq)
}

/// Activation block size of the dot product used for `ty` (1 for the float formats).
fn act_block(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::IQ4_XS => 256,
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
        _ => 32,
    }
}

#[test]
fn roundtrip_error_within_bounds() {
    for ty in ALL {
        let mut rng = Rng::new(7 + ty.id() as u64);
        let n = 256 * 16;
        let x = rng.vec(n, 1.0);
        let q = quantize(ty, &x);
        assert_eq!(q.len() as u64, ty.bytes_for(n as u64).unwrap(), "{}", ty.name());
        let mut y = vec![0f32; n];
        dequantize(ty, &q, &mut y);
        let err: f64 = x.iter().zip(&y).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
        let nrm: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
        let rel = (err / nrm).sqrt() as f32;
        assert!(rel <= rel_rms_bound(ty), "{}: relative RMS error {rel} > {}", ty.name(), rel_rms_bound(ty));
        // Re-quantizing the dequantized values of the 32-element formats must be a fixed
        // point of the value grid (same values again).
        let max_abs = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        let max_err = x.iter().zip(&y).fold(0f32, |a, (p, q)| a.max((p - q).abs()));
        assert!(max_err <= max_abs * 0.35, "{}: max error {max_err}", ty.name());
    }
}

#[test]
fn roundtrip_zero_and_constant_blocks() {
    for ty in ALL {
        let n = 512;
        let zeros = vec![0f32; n];
        let mut y = vec![1f32; n];
        dequantize(ty, &quantize(ty, &zeros), &mut y);
        assert!(y.iter().all(|v| *v == 0.0), "{}: zeros do not round-trip", ty.name());
        let c = vec![0.25f32; n];
        dequantize(ty, &quantize(ty, &c), &mut y);
        for v in &y {
            assert!((v - 0.25).abs() <= 0.25 * 0.07, "{}: constant 0.25 became {v}", ty.name());
        }
    }
}

#[test]
fn known_block_layouts() {
    // Q8_0: d = 1.0 as f16, qs = -16..16.
    let mut b = vec![0u8; 34];
    b[0..2].copy_from_slice(&half::f16::from_f32(0.5).to_bits().to_le_bytes());
    for j in 0..32 {
        b[2 + j] = (j as i8 - 16) as u8;
    }
    let mut y = [0f32; 32];
    dequantize(GgmlType::Q8_0, &b, &mut y);
    for j in 0..32 {
        assert_eq!(y[j], (j as f32 - 16.0) * 0.5);
    }
    // Q4_0: low nibbles are elements 0..16, high nibbles 16..32, offset 8.
    let mut b = vec![0u8; 18];
    b[0..2].copy_from_slice(&half::f16::from_f32(2.0).to_bits().to_le_bytes());
    for j in 0..16 {
        b[2 + j] = (j as u8) | ((15 - j as u8) << 4);
    }
    dequantize(GgmlType::Q4_0, &b, &mut y);
    for j in 0..16 {
        assert_eq!(y[j], (j as f32 - 8.0) * 2.0);
        assert_eq!(y[j + 16], (7.0 - j as f32) * 2.0);
    }
    // Q5_0: bit j of qh is the 5th bit of element j.
    let mut b = vec![0u8; 22];
    b[0..2].copy_from_slice(&half::f16::from_f32(1.0).to_bits().to_le_bytes());
    b[2..6].copy_from_slice(&0x8000_0001u32.to_le_bytes());
    dequantize(GgmlType::Q5_0, &b, &mut y);
    assert_eq!(y[0], 0.0); // 16 - 16
    assert_eq!(y[1], -16.0);
    assert_eq!(y[31], 0.0);
    // Q6_K: d is at the end of the block.
    let mut b = vec![0u8; 210];
    b[208..210].copy_from_slice(&half::f16::from_f32(1.0).to_bits().to_le_bytes());
    b[192..208].fill(1);
    b[0] = 0x21; // element 0: low nibble 1, element 64: 2
    let mut y = [0f32; 256];
    dequantize(GgmlType::Q6_K, &b, &mut y);
    assert_eq!(y[0], 1.0 - 32.0);
    assert_eq!(y[64], 2.0 - 32.0);
    assert_eq!(y[1], -32.0);
}

/// Checks `y` against the f64 product of the dequantized weights, with a per-output bound
/// derived from the 8-bit activation quantization (half a step per element, doubled).
fn check_against_reference(ty: GgmlType, deq: &[f32], rows: usize, cols: usize, x: &[f32], n: usize, y: &[f32]) {
    let ab = act_block(ty);
    let mut l2_err = 0f64;
    let mut l2_ref = 0f64;
    for t in 0..n {
        let xt = &x[t * cols..(t + 1) * cols];
        // per-element activation step
        let step: Vec<f32> = if ab == 1 {
            xt.iter().map(|v| v.abs() * 1e-5).collect()
        } else {
            let mut s = vec![0f32; cols];
            for (blk, sb) in xt.chunks(ab).zip(s.chunks_mut(ab)) {
                let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
                sb.fill(amax / 127.0);
            }
            s
        };
        for r in 0..rows {
            let wr = &deq[r * cols..(r + 1) * cols];
            let exact: f64 = wr.iter().zip(xt).map(|(a, b)| *a as f64 * *b as f64).sum();
            let abs_sum: f64 = wr.iter().zip(xt).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
            let bound: f64 = wr.iter().zip(&step).map(|(a, s)| (*a as f64).abs() * *s as f64).sum::<f64>() + abs_sum * 2e-3 + 1e-6;
            let got = y[t * rows + r] as f64;
            assert!((got - exact).abs() <= bound, "{} {rows}x{cols} n={n} t={t} r={r}: got {got}, expected {exact} (bound {bound})", ty.name());
            l2_err += (got - exact).powi(2);
            l2_ref += exact.powi(2);
        }
    }
    // Over a whole output vector (a single output can sit near a cancellation).
    let rel = (l2_err / l2_ref.max(1e-30)).sqrt();
    let lim = if ab == 1 { 1e-5 } else { 1e-2 };
    assert!(rows * n < 16 || rel <= lim, "{} {rows}x{cols} n={n}: relative L2 error {rel}", ty.name());
}

fn shapes(ty: GgmlType) -> Vec<(usize, usize)> {
    let mut s = vec![(1, 256), (7, 512), (33, 256), (130, 1024)];
    match ty.block_size() {
        1 => s.extend([(5, 37), (9, 8), (3, 1)]),
        32 => s.extend([(5, 96), (65, 32)]),
        _ => {}
    }
    s
}

#[test]
fn matmul_matches_f32_reference() {
    let pool = ThreadPool::new(2);
    for ty in ALL {
        for (si, &(rows, cols)) in shapes(ty).iter().enumerate() {
            let (qw, deq) = weight(ty, rows, cols, 100 + si as u64 + 17 * ty.id() as u64);
            for n in [1usize, 5] {
                let mut rng = Rng::new(5 + n as u64 + si as u64);
                let x = rng.vec(n * cols, 1.0);
                let mut y = vec![f32::NAN; n * rows];
                matmul(&pool, &qw, &x, n, &mut y);
                check_against_reference(ty, &deq, rows, cols, &x, n, &y);
                let mut ys = vec![f32::NAN; n * rows];
                matmul_scalar(&pool, &qw, &x, n, &mut ys);
                check_against_reference(ty, &deq, rows, cols, &x, n, &ys);
            }
        }
    }
}

#[test]
fn simd_equals_scalar() {
    println!("matmul ISA: {}", ruvllm_core::backend::cpu::matmul::isa());
    let pool = ThreadPool::new(2);
    for ty in ALL {
        for (si, &(rows, cols)) in shapes(ty).iter().enumerate() {
            let (qw, deq) = weight(ty, rows, cols, 900 + si as u64 + ty.id() as u64);
            for n in [1usize, 5, 17] {
                let mut rng = Rng::new(77 + n as u64);
                let x = rng.vec(n * cols, 2.0);
                let mut a = vec![0f32; n * rows];
                let mut b = vec![0f32; n * rows];
                matmul(&pool, &qw, &x, n, &mut a);
                matmul_scalar(&pool, &qw, &x, n, &mut b);
                for t in 0..n {
                    for r in 0..rows {
                        let wr = &deq[r * cols..(r + 1) * cols];
                        let xt = &x[t * cols..(t + 1) * cols];
                        let abs_sum: f32 = wr.iter().zip(xt).map(|(p, q)| (p * q).abs()).sum();
                        let (va, vb) = (a[t * rows + r], b[t * rows + r]);
                        assert!((va - vb).abs() <= 1e-5 * abs_sum + 1e-7, "{} {rows}x{cols} n={n} t={t} r={r}: simd {va} scalar {vb}", ty.name());
                    }
                }
            }
        }
    }
}

#[test]
fn dot_kernels_simd_equal_scalar_on_extreme_values() {
    // Saturating inputs: all weights and activations at the ends of their ranges.
    let pool = ThreadPool::new(1);
    for ty in ALL {
        let (rows, cols) = (4, 512);
        let mut w = vec![0f32; rows * cols];
        for (i, v) in w.iter_mut().enumerate() {
            *v = if i % 3 == 0 {
                -1.0
            } else if i % 3 == 1 {
                1.0
            } else {
                0.999
            };
        }
        let bytes = quantize(ty, &w);
        let qw = QWeight::new(ty, rows, cols, WeightData::Owned(Arc::new(bytes))).unwrap();
        let x: Vec<f32> = (0..cols).map(|i| if i % 2 == 0 { 100.0 } else { -100.0 }).collect();
        let mut a = vec![0f32; rows];
        let mut b = vec![0f32; rows];
        matmul(&pool, &qw, &x, 1, &mut a);
        matmul_scalar(&pool, &qw, &x, 1, &mut b);
        for r in 0..rows {
            assert!((a[r] - b[r]).abs() <= 1e-5 * 100.0 * cols as f32, "{}: {} vs {}", ty.name(), a[r], b[r]);
        }
    }
}

/// Every kernel of the portable vector set (`arch::portable`, what aarch64 runs by default)
/// against the scalar reference, called directly (whatever this CPU dispatches to), on random
/// and saturating blocks: bit for bit, since both sum the same exact integers and do the same
/// float operations per block. The ×4 kernels also equal four single-token calls.
#[test]
fn portable_kernels_equal_scalar_bit_for_bit() {
    use ruvllm_core::backend::cpu::arch::portable::KERNELS as P;
    use ruvllm_core::backend::cpu::dot::{DotKernel, SCALAR as S};
    assert_eq!(P.isa, "portable");
    for ty in ALL {
        for (case, nb) in [1usize, 2, 3, 9].into_iter().enumerate() {
            let cols = nb * if act_block(ty) == 1 { 37 } else { act_block(ty) };
            let mut rng = Rng::new(4242 + 31 * case as u64 + ty.id() as u64);
            let extreme = case == 3;
            let w: Vec<f32> = if extreme { (0..cols).map(|i| [-1.0, 1.0, 0.999, -0.5][i % 4]).collect() } else { rng.vec(cols, 0.05) };
            let bytes = quantize(ty, &w);
            let xs: Vec<Vec<f32>> =
                (0..4).map(|t| if extreme { (0..cols).map(|i| if (i + t) % 2 == 0 { 100.0 } else { -100.0 }).collect() } else { rng.vec(cols, 2.0) }).collect();
            let (pk, sk) = (P.for_type(ty).unwrap(), S.for_type(ty).unwrap());
            let same = |p: f32, s: f32, what: &str| assert_eq!(p.to_bits(), s.to_bits(), "{} nb={nb} {what}: portable {p} scalar {s}", ty.name());
            // SAFETY: `bytes` holds `nb` blocks of `ty` and each activation row `nb` blocks.
            unsafe {
                match (pk, sk) {
                    (DotKernel::Q8(p), DotKernel::Q8(s)) => {
                        let acts: Vec<Vec<BlockQ8>> = xs
                            .iter()
                            .map(|x| {
                                let mut a = vec![BlockQ8::default(); nb];
                                quantize_act_q8(x, &mut a);
                                a
                            })
                            .collect();
                        for a in &acts {
                            same(p(&bytes, a), s(&bytes, a), "dot");
                        }
                        if ty == GgmlType::Q8_0 {
                            let rows = [&acts[0][..], &acts[1][..], &acts[2][..], &acts[3][..]];
                            let (p4, s4) = ((P.q8_0_x4)(&bytes, rows), (S.q8_0_x4)(&bytes, rows));
                            for t in 0..4 {
                                same(p4[t], s4[t], "x4");
                                same(p4[t], p(&bytes, rows[t]), "x4 vs x1");
                            }
                        }
                    }
                    (DotKernel::Q8K(p), DotKernel::Q8K(s)) => {
                        let acts: Vec<Vec<BlockQ8K>> = xs
                            .iter()
                            .map(|x| {
                                let mut a = vec![BlockQ8K::default(); nb];
                                quantize_act_q8k(x, &mut a);
                                a
                            })
                            .collect();
                        for a in &acts {
                            same(p(&bytes, a), s(&bytes, a), "dot");
                        }
                        let x4 = match ty {
                            GgmlType::Q4_K => Some((P.q4_k_x4, S.q4_k_x4)),
                            GgmlType::Q6_K => Some((P.q6_k_x4, S.q6_k_x4)),
                            _ => None,
                        };
                        if let Some((p4f, s4f)) = x4 {
                            let rows = [&acts[0][..], &acts[1][..], &acts[2][..], &acts[3][..]];
                            let (p4, s4) = (p4f(&bytes, rows), s4f(&bytes, rows));
                            for t in 0..4 {
                                same(p4[t], s4[t], "x4");
                                same(p4[t], p(&bytes, rows[t]), "x4 vs x1");
                            }
                        }
                    }
                    (DotKernel::F32(p), DotKernel::F32(s)) => {
                        for x in &xs {
                            same(p(&bytes, x), s(&bytes, x), "dot");
                            // A tail shorter than the 8 lanes.
                            let c = cols - 3;
                            same(p(&bytes, &x[..c]), s(&bytes, &x[..c]), "tail");
                        }
                    }
                    _ => panic!("{}: kernel kinds differ", ty.name()),
                }
            }
        }
    }
    // F16/BF16 conversion of every bit pattern (subnormals, infinities, NaNs) as `half` does.
    let bits: Vec<u16> = (0..=u16::MAX).collect();
    let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    for (ty, f) in [(GgmlType::F16, P.f16), (GgmlType::BF16, P.bf16)] {
        for (i, c) in bytes.chunks_exact(2).enumerate() {
            let mut x = [0f32; 8];
            x[0] = 1.0;
            let mut w = [0u8; 16];
            w[..2].copy_from_slice(c);
            let mut deq = [0f32; 8];
            dequantize(ty, &w, &mut deq);
            // SAFETY: 8 elements of `ty` and 8 activations.
            let got = unsafe { f(&w, &x) };
            let want = deq[0] * 1.0 + 0.0;
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{} bits {i:#06x}: {got} vs {want}", ty.name());
        }
    }
}

#[test]
fn batched_equals_per_token() {
    // Prefill paths (row tiles, Q4_0/Q5_0 repacked to Q8_0, the packed tile GEMM, which also
    // runs single tokens) give exactly the decode results.
    let pool = ThreadPool::new(2);
    for ty in ALL.into_iter().chain(RANDOM_BYTES) {
        let (rows, cols) = (37, 512);
        let (qw, _) = weight(ty, rows, cols, 5 + ty.id() as u64);
        let n = 9;
        let mut rng = Rng::new(8);
        let x = rng.vec(n * cols, 1.0);
        for scalar in [false, true] {
            let mm = if scalar { matmul_scalar } else { matmul };
            let mut yb = vec![0f32; n * rows];
            mm(&pool, &qw, &x, n, &mut yb);
            for t in 0..n {
                let mut y1 = vec![0f32; rows];
                mm(&pool, &qw, &x[t * cols..(t + 1) * cols], 1, &mut y1);
                assert_eq!(&yb[t * rows..(t + 1) * rows], &y1[..], "{} scalar={scalar} t={t}", ty.name());
            }
        }
    }
}

#[test]
fn fused_equals_separate() {
    // One job over several weights' tiles (packed, mixed formats and activation kinds, odd row
    // counts) gives exactly the separate matmuls, for decode and prefill token counts.
    let cols = 512;
    let sets: [&[(GgmlType, usize)]; 4] = [
        &[(GgmlType::Q5_0, 67), (GgmlType::Q5_0, 16), (GgmlType::Q8_0, 33), (GgmlType::Q5_1, 18), (GgmlType::IQ4_NL, 20)],
        &[(GgmlType::Q4_K, 40), (GgmlType::Q6_K, 17), (GgmlType::Q5_K, 21), (GgmlType::IQ4_XS, 9), (GgmlType::Q3_K, 24), (GgmlType::Q2_K, 7)],
        &[(GgmlType::Q4_0, 48), (GgmlType::Q6_K, 5), (GgmlType::Q8_0, 21), (GgmlType::Q4_1, 19)],
        // F16 has no packed copy: the call falls back to separate products.
        &[(GgmlType::Q5_0, 32), (GgmlType::F16, 9)],
    ];
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads);
        for (si, set) in sets.iter().enumerate() {
            let ws: Vec<QWeight> = set.iter().enumerate().map(|(i, &(ty, rows))| weight(ty, rows, cols, 40 + i as u64).0).collect();
            for w in &ws {
                w.prepare(&pool);
            }
            for n in [1, 3, 6] {
                let x = Rng::new(90 + n as u64).vec(n * cols, 1.0);
                let mut fused: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; n * w.rows]).collect();
                let wr: Vec<&QWeight> = ws.iter().collect();
                let mut outs: Vec<&mut [f32]> = fused.iter_mut().map(|v| &mut v[..]).collect();
                matmul_fused(&pool, &wr, &x, n, &mut outs);
                for (w, yf) in ws.iter().zip(&fused) {
                    let mut y = vec![0f32; n * w.rows];
                    matmul(&pool, w, &x, n, &mut y);
                    assert_eq!(yf, &y, "set {si} {} threads={threads} n={n}", w.ty.name());
                }
            }
        }
    }
}

/// A tile GEMM as `gemm::GemmFn` / `gemm::GemmKFn` over activations `A`.
type TileFn<A> = unsafe fn(gemm::PackKind, &[u8], usize, &[A], usize, *mut f32, usize, usize);

/// Packs `ty` weights of each shape (into the compact tile format if `compact`), runs the SIMD
/// tile GEMM and its scalar model over every tile for each token count, and checks them bit for
/// bit against each other and against the standard format's results, and, to float rounding,
/// against the per-row scalar dot product.
fn check_tile_gemm<A: Default + Clone>(
    ty: GgmlType,
    compact: bool,
    shapes: &[(usize, usize)],
    block: usize,
    quantize_act: fn(&[f32], &mut [A]),
    simd: TileFn<A>,
    model: TileFn<A>,
) {
    let pool = ThreadPool::new(1);
    for &(rows, cols) in shapes {
        let (qw, _) = weight(ty, rows, cols, 11 + rows as u64 + ty.id() as u64);
        let nb = cols / block;
        let p = gemm::Packed::new(&pool, ty, qw.bytes(), rows, nb).unwrap();
        assert_eq!(p.tiles(), rows.div_ceil(16));
        let pc = compact.then(|| gemm::Packed::new_as(&pool, p.kind.compact(), ty, qw.bytes(), rows, nb, &|_, _| {}).unwrap());
        if let Some(pc) = &pc {
            assert!(pc.kind.is_compact(), "{} has no compact format", ty.name());
            // The file's bytes per block and row (scales and quants), plus a 64-byte header per
            // two blocks of a tile when a row has an odd block count.
            assert_eq!(pc.tile_bytes(), 16 * nb * ty.type_size() + if nb % 2 == 1 { 32 } else { 0 });
        }
        for n in [1usize, 4, 6, 7, 8, 13] {
            let mut rng = Rng::new(n as u64 + 100);
            let x = rng.vec(n * cols, 1.0);
            let mut act = vec![A::default(); n * nb];
            for t in 0..n {
                quantize_act(&x[t * cols..(t + 1) * cols], &mut act[t * nb..(t + 1) * nb]);
            }
            let mut ys = vec![0f32; n * rows];
            let mut yr = vec![0f32; n * rows];
            for ti in 0..p.tiles() {
                let r0 = ti * 16;
                let nrows = (rows - r0).min(16);
                // SAFETY: `simd` is this CPU's tile kernel (checked by the caller); `ys` holds
                // `n × rows` floats and the tile `nrows` rows.
                unsafe {
                    simd(p.kind, p.tile(ti), nb, &act, n, ys.as_mut_ptr().add(r0), rows, nrows);
                    model(p.kind, p.tile(ti), nb, &act, n, yr.as_mut_ptr().add(r0), rows, nrows);
                }
            }
            assert_eq!(ys, yr, "{} {rows}x{cols} n={n}", ty.name());
            if let Some(pc) = &pc {
                // The compact tiles: the same bits as the standard ones, SIMD and model.
                let (mut yc, mut ycr) = (vec![0f32; n * rows], vec![0f32; n * rows]);
                for ti in 0..pc.tiles() {
                    let (r0, nrows) = (ti * 16, (rows - ti * 16).min(16));
                    // SAFETY: as above.
                    unsafe {
                        simd(pc.kind, pc.tile(ti), nb, &act, n, yc.as_mut_ptr().add(r0), rows, nrows);
                        model(pc.kind, pc.tile(ti), nb, &act, n, ycr.as_mut_ptr().add(r0), rows, nrows);
                    }
                }
                assert_eq!(yc, ys, "compact {} {rows}x{cols} n={n}", ty.name());
                assert_eq!(ycr, ys, "compact model {} {rows}x{cols} n={n}", ty.name());
            }
            for t in 0..n {
                let mut y1 = vec![0f32; rows];
                matmul_scalar(&pool, &qw, &x[t * cols..(t + 1) * cols], 1, &mut y1);
                let scale = y1.iter().fold(0f32, |m, v| m.max(v.abs()));
                for r in 0..rows {
                    let v = yr[t * rows + r];
                    assert!((v - y1[r]).abs() <= 2e-6 * scale, "{} t={t} r={r}: {v} vs {}", ty.name(), y1[r]);
                }
            }
        }
    }
}

#[test]
fn gemm_kernel_equals_scalar_model() {
    // Q8_0/Q5_0/Q4_0/Q4_1/Q5_1/IQ4_NL tiles: full and partial tiles, the 4-token and 1-token paths.
    let Some(g) = dispatch::gemm_kernel() else {
        eprintln!("no tile GEMM on this CPU; skipped");
        return;
    };
    for ty in [GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_1, GgmlType::IQ4_NL] {
        check_tile_gemm::<BlockQ8>(ty, ty == GgmlType::Q8_0, &[(16, 64), (37, 512), (5, 96)], 32, quantize_act_q8, g, gemm::gemm_ref);
    }
}

#[test]
fn gemm_k_kernel_equals_scalar_model() {
    // The same for the K-quant tiles (Q4_K, Q6_K).
    let Some(g) = dispatch::gemm_kernel_k() else {
        eprintln!("no tile GEMM on this CPU; skipped");
        return;
    };
    for ty in [GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS] {
        check_tile_gemm::<BlockQ8K>(ty, false, &[(16, 256), (37, 512), (5, 768)], 256, quantize_act_q8k, g, gemm::gemm_k_ref);
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_gemm_kernels_equal_scalar_model() {
    // The AVX2 tile GEMMs directly (whatever `dispatch` picks on this CPU): `vpdpbusd` emulated
    // where the CPU has AVX2 and FMA, and with AVX-VNNI where it has that.
    use ruvllm_core::backend::cpu::arch::x86::avx2_gemm::{emulated, vnni};
    let cpu = ruvllm_core::runtime::cpu();
    if !(cpu.avx2_fma() && cpu.f16c) {
        eprintln!("no AVX2/FMA/F16C on this CPU; skipped");
        return;
    }
    let mut sets: Vec<(&str, TileFn<BlockQ8>, TileFn<BlockQ8K>)> = vec![("emulated", emulated::gemm, emulated::gemm_k)];
    if cpu.avxvnni {
        sets.push(("avxvnni", vnni::gemm, vnni::gemm_k));
    } else {
        eprintln!("no AVX-VNNI on this CPU: its kernel is not tested");
    }
    for (name, g, gk) in sets {
        eprintln!("testing the {name} AVX2 tile GEMM");
        for ty in [GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_1, GgmlType::IQ4_NL] {
            check_tile_gemm::<BlockQ8>(ty, ty == GgmlType::Q8_0, &[(16, 64), (37, 512), (5, 96), (12, 160)], 32, quantize_act_q8, g, gemm::gemm_ref);
        }
        for ty in [GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS] {
            check_tile_gemm::<BlockQ8K>(ty, false, &[(16, 256), (37, 512), (5, 768), (12, 256)], 256, quantize_act_q8k, gk, gemm::gemm_k_ref);
        }
        // Q8_0 at the edge of `vpmaddubsw`'s i16 range: quants −128 and ±127 with activations
        // of ±127 of the same sign (pairs of 2·128·127).
        let (rows, cols, nb) = (16, 256, 8);
        let mut rng = Rng::new(77);
        let mut bytes = Vec::new();
        let mut signs = Vec::new();
        for _ in 0..rows * nb {
            bytes.extend_from_slice(&0x3C00u16.to_le_bytes());
            for _ in 0..32 {
                let q: i8 = [-128, -127, 127][(rng.next_u64() % 3) as usize];
                bytes.push(q as u8);
                signs.push(q.signum() as f32);
            }
        }
        let pool = ThreadPool::new(1);
        let p = gemm::Packed::new(&pool, GgmlType::Q8_0, &bytes, rows, nb).unwrap();
        for n in [1usize, 5, 8] {
            // Every token follows row 0's signs (all rows for n = 1 would need one sign pattern).
            let x: Vec<f32> = (0..n * cols).map(|i| signs[i % cols] * if i % 7 == 0 { 0.5 } else { 1.0 }).collect();
            let mut act = vec![BlockQ8::default(); n * nb];
            for t in 0..n {
                quantize_act_q8(&x[t * cols..(t + 1) * cols], &mut act[t * nb..(t + 1) * nb]);
            }
            let (mut ys, mut yr) = (vec![0f32; n * rows], vec![0f32; n * rows]);
            // SAFETY: `g` needs AVX2/FMA (checked above, AVX-VNNI for its set); `ys`/`yr` hold
            // `n × rows` floats.
            unsafe {
                g(p.kind, p.tile(0), nb, &act, n, ys.as_mut_ptr(), rows, rows);
                gemm::gemm_ref(p.kind, p.tile(0), nb, &act, n, yr.as_mut_ptr(), rows, rows);
            }
            assert_eq!(ys, yr, "{name} extreme Q8_0 n={n}");
        }
    }
}

#[test]
fn head_tiles_give_identical_results() {
    // An LM head packed compact (`prepare_head`: Q8_0 with f16 scales) gives the same bits as
    // the standard tiles and as the weight packed on first use, for decode's one token and more.
    if dispatch::gemm_kernel().is_none() {
        eprintln!("no tile GEMM on this CPU; skipped");
        return;
    }
    let pool = ThreadPool::new(2);
    for (rows, cols) in [(300usize, 640usize), (33, 96)] {
        let (head, _) = weight(GgmlType::Q8_0, rows, cols, 5 + rows as u64);
        let (std, _) = weight(GgmlType::Q8_0, rows, cols, 5 + rows as u64);
        head.prepare_head(&pool);
        std.prepare(&pool);
        assert_eq!(head.packed(&pool).unwrap().kind, gemm::PackKind::Q8H);
        assert_eq!(std.packed(&pool).unwrap().kind, gemm::PackKind::Q8);
        for n in [1usize, 5, 9] {
            let x = Rng::new(n as u64 + 7).vec(n * cols, 1.0);
            let (mut yh, mut ys) = (vec![f32::NAN; n * rows], vec![f32::NAN; n * rows]);
            matmul(&pool, &head, &x, n, &mut yh);
            matmul(&pool, &std, &x, n, &mut ys);
            assert_eq!(yh, ys, "{rows}x{cols} n={n}");
        }
    }
    // A quant of −128 (valid Q8_0, though ggml's quantizer never writes it) does not fit the
    // compact tiles, whose AVX2 kernel negates quants: the head falls back to the standard ones.
    let (rows, cols) = (40, 64);
    let (w, _) = weight(GgmlType::Q8_0, rows, cols, 3);
    let mut bytes = w.bytes().to_vec();
    bytes[34 * 37 + 2 + 5] = 0x80;
    assert!(gemm::Packed::new_as(&pool, gemm::PackKind::Q8H, GgmlType::Q8_0, &bytes, rows, cols / 32, &|_, _| {}).is_none());
    let head = QWeight::new(GgmlType::Q8_0, rows, cols, WeightData::Owned(Arc::new(bytes.clone()))).unwrap();
    let std = QWeight::new(GgmlType::Q8_0, rows, cols, WeightData::Owned(Arc::new(bytes))).unwrap();
    head.prepare_head(&pool);
    assert_eq!(head.packed(&pool).unwrap().kind, gemm::PackKind::Q8);
    let x = Rng::new(1).vec(3 * cols, 1.0);
    let (mut yh, mut ys) = (vec![0f32; 3 * rows], vec![0f32; 3 * rows]);
    matmul(&pool, &head, &x, 3, &mut yh);
    matmul_scalar(&pool, &std, &x, 3, &mut ys);
    for (a, b) in yh.iter().zip(&ys) {
        assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "{a} vs {b}");
    }
}

#[test]
fn thread_counts_give_identical_results() {
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    assert_eq!(pools[2].threads(), 3);
    for ty in [GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::F32, GgmlType::F16] {
        for &(rows, cols) in &[(1usize, 256usize), (67, 512), (641, 256), (5, 1024)] {
            let (qw, _) = weight(ty, rows, cols, rows as u64 * 31 + ty.id() as u64);
            for n in [1usize, 5, 40] {
                let mut rng = Rng::new(n as u64);
                let x = rng.vec(n * cols, 1.0);
                let mut outs = Vec::new();
                for p in &pools {
                    let mut y = vec![0f32; n * rows];
                    matmul(p, &qw, &x, n, &mut y);
                    outs.push(y);
                }
                assert_eq!(outs[0], outs[1], "{} {rows}x{cols} n={n}: 1 vs 2 threads", ty.name());
                assert_eq!(outs[0], outs[2], "{} {rows}x{cols} n={n}: 1 vs 3 threads", ty.name());
            }
        }
    }
}

#[test]
fn thread_pool_runs_every_task_once() {
    for threads in [1, 2, 3, 5] {
        let pool = ThreadPool::new(threads);
        for n_tasks in [0usize, 1, 2, 3, 7, 100] {
            for _ in 0..50 {
                let counts: Vec<AtomicUsize> = (0..n_tasks).map(|_| AtomicUsize::new(0)).collect();
                pool.for_each(n_tasks, &|i| {
                    counts[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
            }
        }
    }
}

#[test]
fn thread_pool_create_and_drop_quickly() {
    // Workers that start after the pool is already shutting down must still exit.
    for i in 0..200 {
        let p = ThreadPool::new(1 + i % 4);
        if i % 2 == 0 {
            p.for_each(3, &|_| {});
        }
    }
}

#[test]
fn thread_pool_nested_and_concurrent_calls() {
    let pool = Arc::new(ThreadPool::new(2));
    let total = AtomicUsize::new(0);
    pool.for_each(4, &|_| {
        // Nested use runs inline instead of deadlocking.
        pool.for_each(3, &|_| {
            total.fetch_add(1, Ordering::Relaxed);
        });
    });
    assert_eq!(total.load(Ordering::Relaxed), 12);
    let handles: Vec<_> = (0..3)
        .map(|_| {
            let p = pool.clone();
            std::thread::spawn(move || {
                let c = AtomicUsize::new(0);
                for _ in 0..200 {
                    p.for_each(5, &|_| {
                        c.fetch_add(1, Ordering::Relaxed);
                    });
                }
                c.load(Ordering::Relaxed)
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 1000);
    }
}

#[test]
fn thread_pool_propagates_panics_and_survives() {
    let pool = ThreadPool::new(2);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pool.for_each(8, &|i| {
            if i == 5 {
                panic!("task 5 fails");
            }
        })
    }));
    assert!(r.is_err());
    let c = AtomicUsize::new(0);
    pool.for_each(8, &|_| {
        c.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(c.load(Ordering::Relaxed), 8);
}

#[test]
fn qweight_validation() {
    let ok = |ty: GgmlType, rows: usize, cols: usize, len: usize| QWeight::new(ty, rows, cols, WeightData::Owned(Arc::new(vec![0u8; len])));
    assert!(ok(GgmlType::Q8_0, 2, 64, 2 * 2 * 34).is_ok());
    assert!(ok(GgmlType::Q8_0, 2, 64, 2 * 2 * 34 - 1).is_err());
    assert!(ok(GgmlType::Q8_0, 2, 64, 2 * 2 * 34 + 1).is_err());
    assert!(ok(GgmlType::Q8_0, 2, 48, 2 * 34 + 17).is_err()); // cols not a multiple of 32
    assert!(ok(GgmlType::Q4_K, 3, 256, 3 * 144).is_ok());
    assert!(ok(GgmlType::Q4_K, 3, 128, 3 * 72).is_err());
    assert!(ok(GgmlType::Q6_K, 1, 512, 419).is_err());
    assert!(ok(GgmlType::F32, 3, 5, 60).is_ok());
    assert!(ok(GgmlType::F16, 3, 5, 60).is_err());
    assert!(ok(GgmlType::Q2_K, 1, 256, 84).is_ok());
    assert!(ok(GgmlType::IQ4_XS, 2, 256, 2 * 136).is_ok());
    assert!(ok(GgmlType::IQ4_NL, 1, 64, 2 * 18 + 1).is_err());
    assert!(ok(GgmlType::Q8_1, 1, 32, 36).is_err()); // activation-only format
    assert!(ok(GgmlType::Q8_K, 1, 256, 292).is_err()); // activation-only format
    assert!(ok(GgmlType::F32, usize::MAX, 2, 0).is_err()); // overflow
                                                           // Mapped ranges must lie inside the storage.
    let storage = Arc::new(ruvllm_core::gguf::Storage::Owned(vec![0u8; 100]));
    let mapped = |offset, len| WeightData::Mapped { storage: storage.clone(), offset, len };
    assert!(QWeight::new(GgmlType::Q8_0, 1, 32, mapped(10, 34)).is_ok());
    assert!(QWeight::new(GgmlType::Q8_0, 1, 32, mapped(80, 34)).is_err());
    assert!(QWeight::new(GgmlType::Q8_0, 1, 32, mapped(usize::MAX, 34)).is_err());
}

#[test]
fn mapped_weight_rows_and_gather() {
    let (rows, cols) = (6, 64);
    let mut rng = Rng::new(3);
    let w = rng.vec(rows * cols, 1.0);
    let bytes = quantize(GgmlType::Q8_0, &w);
    let mut file = vec![0xAAu8; 7];
    file.extend_from_slice(&bytes);
    file.extend_from_slice(&[0x55; 9]);
    let storage = Arc::new(ruvllm_core::gguf::Storage::Owned(file));
    let qw = QWeight::new(GgmlType::Q8_0, rows, cols, WeightData::Mapped { storage, offset: 7, len: bytes.len() }).unwrap();
    assert_eq!(qw.bytes(), &bytes[..]);
    assert_eq!(qw.row_bytes(2), &bytes[2 * 68..3 * 68]);
    let mut all = vec![0f32; rows * cols];
    dequantize(GgmlType::Q8_0, &bytes, &mut all);
    let mut row = vec![0f32; cols];
    for r in 0..rows {
        qw.dequantize_row(r, &mut row);
        assert_eq!(&row[..], &all[r * cols..(r + 1) * cols]);
    }
}

#[test]
fn matmul_zero_tokens_and_long_buffers() {
    let pool = ThreadPool::new(2);
    let (qw, deq) = weight(GgmlType::Q4_0, 3, 64, 1);
    let mut y = vec![7f32; 3];
    matmul(&pool, &qw, &[], 0, &mut y);
    assert_eq!(y, vec![7f32; 3]);
    // Longer x / y than needed: only the first n rows are touched.
    let x = vec![0.5f32; 64 * 2];
    let mut y = vec![9f32; 3 * 2];
    matmul(&pool, &qw, &x, 1, &mut y);
    assert_eq!(&y[3..], &[9.0, 9.0, 9.0]);
    check_against_reference(GgmlType::Q4_0, &deq, 3, 64, &x[..64], 1, &y[..3]);
}

/// Quantizer fixed points: quantizing already-quantized values reproduces the same bytes for
/// the formats whose reference quantizer is deterministic in that sense (Q8_0, Q4_0, Q5_0).
#[test]
fn requantize_is_stable() {
    for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::F16, GgmlType::BF16] {
        let mut rng = Rng::new(11);
        let x = rng.vec(1024, 1.0);
        let q1 = quantize(ty, &x);
        let mut y = vec![0f32; 1024];
        dequantize(ty, &q1, &mut y);
        let q2 = quantize(ty, &y);
        let mut z = vec![0f32; 1024];
        dequantize(ty, &q2, &mut z);
        assert_eq!(y, z, "{}", ty.name());
    }
}

/// Dev cross-check against python's `gguf` package: compares files dumped by a small Python
/// script into `RUVLLM_XCHECK_DIR` (raw tensor bytes + numpy-dequantized f32, and python-quantized
/// random data). Not run by default and skipped when the variable is unset.
#[test]
#[ignore]
fn xcheck_python_dumps() {
    let Some(dir) = std::env::var_os("RUVLLM_XCHECK_DIR") else {
        eprintln!("RUVLLM_XCHECK_DIR not set; skipping");
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let index = std::fs::read_to_string(dir.join("index.txt")).expect("index.txt");
    let mut checked = 0;
    for line in index.lines() {
        // kind type_id n name
        let f: Vec<&str> = line.split_whitespace().collect();
        let (kind, id, n, name) = (f[0], f[1].parse::<u32>().unwrap(), f[2].parse::<usize>().unwrap(), f[3]);
        let ty = GgmlType::from_id(id).unwrap();
        let raw = std::fs::read(dir.join(format!("{name}.raw"))).unwrap();
        let f32s: Vec<f32> =
            std::fs::read(dir.join(format!("{name}.f32"))).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        match kind {
            "deq" => {
                let mut y = vec![0f32; n];
                dequantize(ty, &raw, &mut y);
                let bad = y.iter().zip(&f32s).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                assert_eq!(bad, 0, "{name} ({}): {bad} of {n} values differ", ty.name());
            }
            "quant" => {
                let q = quantize(ty, &f32s);
                let bad = q.iter().zip(&raw).filter(|(a, b)| a != b).count();
                assert_eq!(q.len(), raw.len());
                assert_eq!(bad, 0, "{name} ({}): {bad} of {} bytes differ", ty.name(), raw.len());
            }
            _ => panic!("bad kind {kind}"),
        }
        checked += 1;
        eprintln!("ok {kind} {name} {}", ty.name());
    }
    assert!(checked > 0);
}

fn bench_one(ty: GgmlType, rows: usize, cols: usize, threads: usize, n: usize) -> (f64, f64) {
    let mut rng = Rng::new(1);
    let w = rng.vec(rows * cols, 0.05);
    let bytes = quantize(ty, &w);
    let gb = bytes.len() as f64 / 1e9;
    let qw = QWeight::new(ty, rows, cols, WeightData::Owned(Arc::new(bytes))).unwrap();
    let pool = ThreadPool::new(threads);
    let x = rng.vec(cols * n, 1.0);
    let mut y = vec![0f32; rows * n];
    matmul(&pool, &qw, &x, n, &mut y);
    let iters = ((2.0 / gb) as usize).clamp(3, 2000);
    let t = std::time::Instant::now();
    for _ in 0..iters {
        matmul(&pool, &qw, &x, n, &mut y);
    }
    let dt = t.elapsed().as_secs_f64() / iters as f64;
    (gb / dt, dt * 1e6)
}

/// Weights with the shapes of Gemma 3 270M Q4_K_M (18 layers + tied Q8_0 embedding as the
/// output head), distinct memory per layer so that they stream from DRAM as in real decode.
/// Returns the matmuls of one token in order.
fn decode_like_weights() -> Vec<QWeight> {
    let mut rng = Rng::new(42);
    let mut make = |ty: GgmlType, rows: usize, cols: usize| {
        let w = rng.vec(rows.min(4096) * cols, 0.05);
        let block = quantize(ty, &w);
        let mut bytes = Vec::with_capacity(block.len() * rows.div_ceil(4096));
        while bytes.len() < ty.bytes_for((rows * cols) as u64).unwrap() as usize {
            bytes.extend_from_slice(&block);
        }
        bytes.truncate(ty.bytes_for((rows * cols) as u64).unwrap() as usize);
        QWeight::new(ty, rows, cols, WeightData::Owned(Arc::new(bytes))).unwrap()
    };
    let mut ws = Vec::new();
    for l in 0..18 {
        ws.push(make(GgmlType::Q5_0, 1024, 640)); // attn_q
        ws.push(make(GgmlType::Q5_0, 256, 640)); // attn_k
        ws.push(make(if l % 2 == 0 { GgmlType::Q8_0 } else { GgmlType::Q5_0 }, 256, 640)); // attn_v
        ws.push(make(GgmlType::Q4_K, 640, 1024)); // attn_output
        ws.push(make(GgmlType::Q5_0, 2048, 640)); // ffn_gate
        ws.push(make(GgmlType::Q5_0, 2048, 640)); // ffn_up
        ws.push(make(if l % 2 == 0 { GgmlType::Q6_K } else { GgmlType::Q4_K }, 640, 2048));
        // ffn_down
    }
    ws.push(make(GgmlType::Q8_0, 262144, 640)); // output (tied embedding)
    ws
}

#[test]
#[ignore]
fn throughput() {
    println!("ISA: {}", ruvllm_core::backend::cpu::matmul::isa());
    let cases = [
        (GgmlType::Q5_0, 2048, 640),
        (GgmlType::Q8_0, 262144, 640),
        (GgmlType::Q4_K, 640, 2048),
        (GgmlType::Q6_K, 640, 2048),
        (GgmlType::Q8_0, 640, 256),
        (GgmlType::F32, 1024, 640),
    ];
    for (ty, rows, cols) in cases {
        for threads in [1, 2] {
            let (gbs, us) = bench_one(ty, rows, cols, threads, 1);
            println!("{:5} {rows:>6}x{cols:<5} n=1 threads={threads}: {gbs:6.2} GB/s  {us:9.1} us/call", ty.name());
        }
    }
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads);
        let iters = 200_000;
        let t = std::time::Instant::now();
        for _ in 0..iters {
            pool.for_each(threads * 4, &|_| {});
        }
        println!("empty for_each threads={threads}: {:.2} us/call", t.elapsed().as_secs_f64() * 1e6 / iters as f64);
    }
    let ws = decode_like_weights();
    let total: usize = ws.iter().map(|w| w.bytes().len()).sum();
    let mut rng = Rng::new(9);
    let x = rng.vec(2048, 1.0);
    let mut y = vec![0f32; 262144];
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads);
        let mut best = f64::MAX;
        for _ in 0..8 {
            let t = std::time::Instant::now();
            for w in &ws {
                matmul(&pool, w, &x[..w.cols], 1, &mut y[..w.rows]);
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        let body = &ws[..ws.len() - 1];
        let t = std::time::Instant::now();
        for _ in 0..8 {
            for w in body {
                matmul(&pool, w, &x[..w.cols], 1, &mut y[..w.rows]);
            }
        }
        let body_s = t.elapsed().as_secs_f64() / 8.0;
        let body_bytes: usize = body.iter().map(|w| w.bytes().len()).sum();
        println!(
            "decode-like token ({} matmuls, {:.1} MB) threads={threads}: {:.2} ms/token, {:.2} GB/s; layers only ({:.1} MB): {:.2} ms, {:.2} GB/s",
            ws.len(),
            total as f64 / 1e6,
            best * 1e3,
            total as f64 / best / 1e9,
            body_bytes as f64 / 1e6,
            body_s * 1e3,
            body_bytes as f64 / body_s / 1e9
        );
    }
    for (ty, rows, cols) in [(GgmlType::Q5_0, 2048, 640), (GgmlType::Q8_0, 2048, 640), (GgmlType::Q4_K, 640, 2048), (GgmlType::Q6_K, 640, 2048)] {
        let n = 64;
        let (_, us) = bench_one(ty, rows, cols, 2, n);
        let gflops = 2.0 * (rows * cols * n) as f64 / (us * 1e3);
        println!("{:5} {rows:>6}x{cols:<5} n={n} threads=2: {gflops:6.1} GFLOP/s  {us:9.1} us/call", ty.name());
    }
}

#[test]
fn activation_quantizers_equal_the_scalar_definition() {
    // The dispatched (AVX2 where present) quantizers against the plain-Rust definitions, bit for
    // bit: random rows, exact ties (x.5 after scaling, equal magnitudes of both signs), all-zero
    // blocks, tiny and huge magnitudes, NaN and infinities.
    let mut rng = Rng::new(77);
    let mut rows: Vec<Vec<f32>> = (0..20).map(|i| rng.vec(1024, [1e-3, 1.0, 40.0, 3e4][i % 4])).collect();
    let mut ties = vec![0f32; 1024];
    for (i, v) in ties.iter_mut().enumerate() {
        // amax 127 in every block: the scaled values are the values, with many x.5 ties.
        *v = [127.0, -127.0, 0.5, 1.5, -2.5, 3.5, 0.0, -0.0][i % 8] + (i / 8 % 5) as f32;
    }
    rows.push(ties);
    rows.push(vec![0.0; 1024]);
    let mut odd = rng.vec(1024, 1.0);
    odd[3] = f32::NAN;
    odd[300] = f32::INFINITY;
    odd[600] = f32::NEG_INFINITY;
    odd[900] = f32::NAN;
    for v in &mut odd[512..768] {
        *v *= 1e-38; // subnormal-range block
    }
    rows.push(odd);
    for (ri, x) in rows.iter().enumerate() {
        let (mut a, mut b) = (vec![BlockQ8::default(); 32], vec![BlockQ8::default(); 32]);
        quantize_act_q8(x, &mut a);
        quantize_act_q8_generic(x, &mut b);
        for (i, (p, q)) in a.iter().zip(&b).enumerate() {
            assert!(
                p.qs == q.qs && p.qsum == q.qsum && p.d.to_bits() == q.d.to_bits() && p.s.to_bits() == q.s.to_bits(),
                "q8 row {ri} block {i}: {p:?} vs {q:?}"
            );
        }
        let (mut a, mut b) = (vec![BlockQ8K::default(); 4], vec![BlockQ8K::default(); 4]);
        quantize_act_q8k(x, &mut a);
        quantize_act_q8k_generic(x, &mut b);
        for (i, (p, q)) in a.iter().zip(&b).enumerate() {
            assert!(p.qs == q.qs && p.bsums == q.bsums && p.d.to_bits() == q.d.to_bits(), "q8k row {ri} block {i}: {p:?} vs {q:?}");
        }
    }
}

#[test]
fn greedy_screening_picks_the_full_heads_argmax() {
    // `matmul::head_argmax` (the LM head scored from its top five bits, candidates exactly)
    // picks what `sampling::argmax` picks from the full product, and every row's exact product
    // lies inside its screening bounds: Gaussian rows; rows equal to another (ties: the lower
    // id wins); rows that differ from the best only in the low three bits of one quant (inside
    // one screening interval); negative block scales; a last tile of fewer than 16 rows.
    if dispatch::screen_kernel().is_none() {
        eprintln!("no screening kernel on this path; skipped");
        return;
    }
    let pool = ThreadPool::new(2);
    for (rows, cols, seed) in [(1000usize, 640usize, 1u64), (333, 256, 2), (4099, 128, 3)] {
        let (w, _) = weight(GgmlType::Q8_0, rows, cols, seed);
        let mut bytes = w.bytes().to_vec();
        let rs = cols / 32 * 34;
        let mut rng = Rng::new(seed + 100);
        for k in 0..rows / 10 {
            let (a, b) = ((rng.next_u64() as usize) % rows, (rng.next_u64() as usize) % rows);
            match k % 3 {
                // A copy of another row.
                0 => bytes.copy_within(a * rs..(a + 1) * rs, b * rs),
                // A copy with one quant's low bits changed.
                1 => {
                    bytes.copy_within(a * rs..(a + 1) * rs, b * rs);
                    let at = b * rs + 2 + (rng.next_u64() as usize % 32);
                    let q = bytes[at] as i8;
                    bytes[at] = (if q < 120 { q + 1 } else { q - 1 }) as u8;
                }
                // A block's scale and quants negated (the same products).
                _ => {
                    let blk = b * rs + 34 * (rng.next_u64() as usize % (cols / 32));
                    bytes[blk + 1] ^= 0x80;
                    for q in &mut bytes[blk + 2..blk + 34] {
                        *q = (*q as i8).wrapping_neg() as u8;
                    }
                }
            }
        }
        // Every other aligned token's row also at a lower id: an exact tie for the best.
        for t in (0..40usize).step_by(4) {
            let r = (t * 37) % rows;
            bytes.copy_within(r * rs..(r + 1) * rs, r / 2 * rs);
        }
        let head = QWeight::new(GgmlType::Q8_0, rows, cols, WeightData::Owned(Arc::new(bytes))).unwrap();
        head.prepare_head(&pool);
        let (mut scored, mut ties) = (0u64, 0usize);
        for t in 0..40u64 {
            let mut x = Rng::new(t * 7 + seed).vec(cols, 1.0);
            // Half the tokens: the input aligned with one row, so one product stands out (as
            // a confident model's logits do); the other half leaves many close.
            if t % 2 == 0 {
                let mut row = vec![0f32; cols];
                head.dequantize_row((t as usize * 37) % rows, &mut row);
                for (x, r) in x.iter_mut().zip(&row) {
                    *x = 0.2 * *x + 20.0 * r;
                }
            }
            let mut y = vec![0f32; rows];
            matmul(&pool, &head, &x, 1, &mut y);
            let want = ruvllm_core::sampling::argmax(&y);
            ties += (y.iter().filter(|&&v| v == y[want as usize]).count() > 1) as usize;
            let got = matmul::head_argmax(&pool, &head, &x).expect("the head is screened on this path");
            scored += matmul::SCREENED_ROWS.load(Ordering::Relaxed);
            assert_eq!(got, want, "{rows}x{cols} token {t}: screening picked {got} ({}), the full head {want} ({})", y[got as usize], y[want as usize]);
            let (lo, hi) = matmul::head_bounds(&pool, &head, &x).unwrap();
            for (r, &v) in y.iter().enumerate() {
                assert!(lo[r] <= v && v <= hi[r], "{rows}x{cols} token {t} row {r}: {v} outside [{}, {}]", lo[r], hi[r]);
            }
        }
        eprintln!("{rows}x{cols}: {:.1} rows scored exactly per token, {ties} tied best", scored as f64 / 40.0);
        assert!(ties >= 5, "{rows}x{cols}: only {ties} tokens with a tied best");
    }
    // Non-finite input: no screening (the caller computes the logits).
    let (w, _) = weight(GgmlType::Q8_0, 64, 64, 9);
    w.prepare_head(&pool);
    let mut x = vec![0.5f32; 64];
    x[3] = f32::NAN;
    assert!(matmul::head_argmax(&pool, &w, &x).is_none());
    // A standard (not compact) head, or another type: not screened.
    let (w, _) = weight(GgmlType::Q8_0, 64, 64, 9);
    w.prepare(&pool);
    assert!(matmul::head_argmax(&pool, &w, &[0.5; 64]).is_none());
    let (w, _) = weight(GgmlType::Q6_K, 64, 256, 9);
    w.prepare_head(&pool);
    assert!(matmul::head_argmax(&pool, &w, &[0.5; 256]).is_none());
}
