//! A small BERT encoder forward pass, f32 arithmetic (what all-MiniLM-L6-v2 needs),
//! written for the router's case: one short sentence on one thread.
//!
//! Why not candle's `BertModel`: for a 10-token sentence it spends most of its time outside the
//! arithmetic (per-op tensor allocation, strided copies for the head split, a GEMM tuned for big
//! matrices); measured here at ~10-12 ms per sentence on one thread, against ~200 MFLOP of work.
//! This forward packs every linear layer once at load time into column panels of 24 outputs,
//! so a 4-token x 24-output tile of `x W^T` accumulates in 12 AVX2 registers while the panel
//! streams through once per tile; it processes only the real tokens (no padding: each text of a
//! batch runs its own forward), and fuses Q, K and V into one panel set.
//!
//! The panels are stored as bf16 by default where the CPU has AVX512-BF16 ([`WeightFormat`]):
//! each layer's input is rounded to bf16 too and `vdpbf16ps` multiplies two inputs per
//! instruction into f32 sums (~1.6x faster than f16 panels; embeddings within cosine 0.99998
//! of f32, < 1.2e-3 per coordinate on the test tasks). Elsewhere they are f16: a short sentence
//! streams 21 MB of weights instead of 42 MB, widened to f32 inside the tile kernels
//! (`vcvtph2ps`) and accumulated in f32; embeddings move by < 1e-4 per coordinate
//! (BENCHMARKS.md, routing).
//!
//! Numerics follow Hugging Face `BertModel` (absolute positions, token type 0, post-LN, exact
//! erf GELU, LayerNorm eps from the config); `tests/embedder.rs` checks the pooled output against
//! candle's `BertModel` on the same weights.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};

/// Outputs per packed panel for the AVX2 kernel (3 vectors); a 4 x 24 tile uses 12 of the 16
/// registers.
const NB: usize = 24;
/// Tokens per AVX2 register tile.
const MT: usize = 4;
/// Outputs per packed panel for the AVX-512 kernel (2 vectors); a 12 x 32 tile uses 24 of the
/// 32 registers, so up to 12 tokens read each panel once.
const NB512: usize = 32;
/// Tokens per AVX-512 register tile.
const MT512: usize = 12;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kernel {
    Generic,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

fn kernel() -> Kernel {
    #[cfg(target_arch = "x86_64")]
    {
        // The process-wide switches (`RUVLLM_NO_AVX512`, `RUVLLM_FORCE_SCALAR`, ...) apply
        // through `runtime::cpu`; `RUVLLM_EMBED_NO_AVX512` turns AVX-512 off for the embedder only.
        let cpu = ruvllm_core::runtime::cpu();
        if cpu.avx512f && std::env::var_os("RUVLLM_EMBED_NO_AVX512").is_none() {
            return Kernel::Avx512;
        }
        // The AVX2 tiles also convert f16 panels (F16C); every AVX2 CPU has F16C.
        if cpu.avx2_fma() && cpu.f16c {
            return Kernel::Avx2;
        }
    }
    Kernel::Generic
}

/// How [`Linear`] stores its packed weight panels. Accumulation is f32 either way.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum WeightFormat {
    /// The model's f32 weights as they are.
    F32,
    /// Weights rounded to IEEE half precision (round to nearest even) at load time and widened
    /// back to f32 inside the tile kernels (`vcvtph2ps`). Halves the bytes a forward streams
    /// (about 42 MB -> 21 MB for all-MiniLM-L6-v2). What [`WeightFormat::Bf16`] loads as on a
    /// CPU without AVX512-BF16.
    F16,
    /// Weights rounded to bfloat16 at load time, and each layer's input rounded to bfloat16
    /// too, multiplied in pairs by `vdpbf16ps` (AVX512-BF16) with f32 accumulation: half the
    /// instructions of the f16 tiles per product. Only the AVX-512 kernel on a CPU with
    /// AVX512-BF16 runs it; elsewhere this format loads as [`WeightFormat::F16`]. The default:
    /// about 1.6x faster than f16 panels per sentence (BENCHMARKS.md, routing), embeddings
    /// within cosine 0.99998 of the f32 ones.
    #[default]
    Bf16,
}

/// Packed panels `[out/nb][in][nb]` in one of the storage formats.
enum Panels {
    F32(Vec<f32>),
    /// IEEE half bit patterns.
    F16(Vec<u16>),
    /// bfloat16 bit patterns in pair rows `[out/nb][in/2][nb][2]` (input `2q` and `2q + 1` of
    /// an output next to each other, as `vdpbf16ps` multiplies them; an odd last input is
    /// paired with 0).
    Bf16(Vec<u16>),
}

/// Whether [`WeightFormat::Bf16`] (the default) runs as bf16 here rather than as f16: the
/// AVX-512 kernel is chosen and the CPU has AVX512-BF16.
pub fn bf16_tiles() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        kernel() == Kernel::Avx512 && has_bf16()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the CPU runs the bf16 tiles (`vdpbf16ps`).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn has_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `y = x W^T + b` with `W` packed into panels `[out/nb][in][nb]` (zero-padded columns).
pub(crate) struct Linear {
    pub(crate) inp: usize,
    pub(crate) out: usize,
    nb: usize,
    kernel: Kernel,
    packed: Panels,
    bias: Vec<f32>,
}

#[cfg(target_arch = "x86_64")]
/// Writes a register tile's rows plus `bias` to `y`: row `r` at `y[at + r * ld..]`, as many
/// columns as `bias` has (the panel's real outputs).
fn store_tile<const W: usize>(tile: &[[f32; W]], y: &mut [f32], at: usize, ld: usize, bias: &[f32]) {
    for (r, row) in tile.iter().enumerate() {
        for ((d, v), b) in y[at + r * ld..at + r * ld + bias.len()].iter_mut().zip(row).zip(bias) {
            *d = v + b;
        }
    }
}

/// Runs `$call` with the const `$M` set to the tile height `$m` (1..=12, the AVX-512 tiles).
#[cfg(target_arch = "x86_64")]
macro_rules! with_rows {
    ($m:expr, $M:ident, $call:expr) => {
        match $m {
            12 => {
                const $M: usize = 12;
                $call
            }
            11 => {
                const $M: usize = 11;
                $call
            }
            10 => {
                const $M: usize = 10;
                $call
            }
            9 => {
                const $M: usize = 9;
                $call
            }
            8 => {
                const $M: usize = 8;
                $call
            }
            7 => {
                const $M: usize = 7;
                $call
            }
            6 => {
                const $M: usize = 6;
                $call
            }
            5 => {
                const $M: usize = 5;
                $call
            }
            4 => {
                const $M: usize = 4;
                $call
            }
            3 => {
                const $M: usize = 3;
                $call
            }
            2 => {
                const $M: usize = 2;
                $call
            }
            _ => {
                const $M: usize = 1;
                $call
            }
        }
    };
}

/// Rows of the next register tile when `rest` tokens remain and a tile holds at most `mt`:
/// the tokens are split into equal tiles (13 tokens at `mt` 12 -> 7 + 6, not 12 + 1), since a
/// tile of one or two rows leaves too few independent FMA chains to hide their latency.
fn tile_rows(rest: usize, mt: usize) -> usize {
    rest.div_ceil(rest.div_ceil(mt))
}

impl Linear {
    /// From row-major weights `w[out][in]` (PyTorch layout) and bias `b[out]`.
    pub(crate) fn new(w: &[f32], b: &[f32], out: usize, inp: usize, format: WeightFormat) -> Linear {
        Self::with_kernel(w, b, out, inp, format, kernel())
    }

    fn with_kernel(w: &[f32], b: &[f32], out: usize, inp: usize, format: WeightFormat, kernel: Kernel) -> Linear {
        assert_eq!(w.len(), out * inp);
        assert_eq!(b.len(), out);
        #[cfg(target_arch = "x86_64")]
        let nb = if kernel == Kernel::Avx512 { NB512 } else { NB };
        #[cfg(not(target_arch = "x86_64"))]
        let nb = NB;
        let panels = out.div_ceil(nb);
        #[cfg(target_arch = "x86_64")]
        let bf16_ok = kernel == Kernel::Avx512 && has_bf16();
        #[cfg(not(target_arch = "x86_64"))]
        let bf16_ok = false;
        let format = if format == WeightFormat::Bf16 && !bf16_ok { WeightFormat::F16 } else { format };
        if format == WeightFormat::Bf16 {
            let pairs = inp.div_ceil(2);
            let mut packed = vec![0u16; panels * pairs * nb * 2];
            for o in 0..out {
                let (p, j) = (o / nb, o % nb);
                for i in 0..inp {
                    packed[((p * pairs + i / 2) * nb + j) * 2 + i % 2] = half::bf16::from_f32(w[o * inp + i]).to_bits();
                }
            }
            return Linear { inp, out, nb, kernel, packed: Panels::Bf16(packed), bias: b.to_vec() };
        }
        let mut packed = vec![0.0f32; panels * inp * nb];
        for o in 0..out {
            let (p, j) = (o / nb, o % nb);
            for i in 0..inp {
                packed[(p * inp + i) * nb + j] = w[o * inp + i];
            }
        }
        let packed = match format {
            WeightFormat::F32 => Panels::F32(packed),
            WeightFormat::F16 | WeightFormat::Bf16 => Panels::F16(packed.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect()),
        };
        Linear { inp, out, nb, kernel, packed, bias: b.to_vec() }
    }

    /// `y[t][..out] = x[t][..inp] W^T + b` for `t < n` (`x` is `n x inp`, `y` is `n x out`).
    pub(crate) fn forward(&self, x: &[f32], n: usize, y: &mut [f32]) {
        assert!(x.len() >= n * self.inp && y.len() >= n * self.out);
        #[cfg(target_arch = "x86_64")]
        let (base, half) = match &self.packed {
            Panels::F32(p) => (p.as_ptr() as *const u8, false),
            Panels::F16(p) => (p.as_ptr() as *const u8, true),
            Panels::Bf16(p) => {
                // SAFETY: bf16 panels exist only with the AVX-512 kernel on a CPU with
                // AVX512-BF16 (checked in `with_kernel`); the assert above bounds `x` and `y`.
                unsafe { self.forward_bf16(p, x, n, y) };
                return;
            }
        };
        match self.kernel {
            // SAFETY (all four): the CPU has the features (checked when the kernel was chosen);
            // the asserts above bound all accesses to `x` and `y`, panels are `inp x nb`
            // elements of the type `half` names, by construction.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 if half => unsafe { self.forward_avx512::<true>(base, x, n, y) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => unsafe { self.forward_avx512::<false>(base, x, n, y) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 if half => unsafe { self.forward_avx2::<true>(base, x, n, y) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { self.forward_avx2::<false>(base, x, n, y) },
            Kernel::Generic => self.forward_generic(x, n, y),
        }
    }

    fn forward_generic(&self, x: &[f32], n: usize, y: &mut [f32]) {
        let (inp, out, nb) = (self.inp, self.out, self.nb);
        let mut acc = vec![0.0f32; nb];
        let mut wide = Vec::new();
        for p in 0..out.div_ceil(nb) {
            let range = p * inp * nb..(p + 1) * inp * nb;
            let panel: &[f32] = match &self.packed {
                Panels::F32(w) => &w[range],
                Panels::F16(w) => {
                    wide.clear();
                    wide.extend(w[range].iter().map(|&b| half::f16::from_bits(b).to_f32()));
                    &wide
                }
                Panels::Bf16(w) => {
                    // Pair rows back to `[in][nb]` (only reached if a test builds bf16 panels
                    // for this kernel; `with_kernel` does not).
                    let pairs = inp.div_ceil(2);
                    wide.clear();
                    wide.resize(inp * nb, 0.0);
                    for i in 0..inp {
                        for j in 0..nb {
                            wide[i * nb + j] = half::bf16::from_bits(w[((p * pairs + i / 2) * nb + j) * 2 + i % 2]).to_f32();
                        }
                    }
                    &wide
                }
            };
            let cols = nb.min(out - p * nb);
            for t in 0..n {
                acc.iter_mut().for_each(|a| *a = 0.0);
                let xr = &x[t * inp..(t + 1) * inp];
                for (i, &xv) in xr.iter().enumerate() {
                    let w = &panel[i * nb..(i + 1) * nb];
                    for j in 0..nb {
                        acc[j] += xv * w[j];
                    }
                }
                for j in 0..cols {
                    y[t * out + p * nb + j] = acc[j] + self.bias[p * nb + j];
                }
            }
        }
    }

    /// `base` points at the panels: f16 bit patterns when `H`, else f32.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn forward_avx512<const H: bool>(&self, base: *const u8, x: &[f32], n: usize, y: &mut [f32]) {
        let (inp, elem) = (self.inp, if H { 2 } else { 4 });
        self.for_each_tile::<NB512, MT512>(n, y, |p, t, m, tile| {
            let panel = base.add(p * inp * NB512 * elem);
            let xp = x.as_ptr().add(t * inp);
            with_rows!(m, M, tile_avx512::<M, H>(xp, inp, panel, tile));
        });
    }

    /// `base` points at the panels: f16 bit patterns when `H`, else f32.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn forward_avx2<const H: bool>(&self, base: *const u8, x: &[f32], n: usize, y: &mut [f32]) {
        let (inp, elem) = (self.inp, if H { 2 } else { 4 });
        self.for_each_tile::<NB, MT>(n, y, |p, t, m, tile| {
            let panel = base.add(p * inp * NB * elem);
            let xp = x.as_ptr().add(t * inp);
            match m {
                4 => tile_avx2::<4, H>(xp, inp, panel, tile),
                3 => tile_avx2::<3, H>(xp, inp, panel, tile),
                2 => tile_avx2::<2, H>(xp, inp, panel, tile),
                _ => tile_avx2::<1, H>(xp, inp, panel, tile),
            }
        });
    }

    /// The panel / register-tile walk of every SIMD forward: for each `W`-wide output panel `p`
    /// and each run of `m` tokens from `t` (at most `R`, balanced by `tile_rows`), `tile(p, t,
    /// m, buf)` fills `buf[..m]`; then the bias is added and the rows stored into `y` (`n x
    /// out`).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn for_each_tile<const W: usize, const R: usize>(&self, n: usize, y: &mut [f32], mut tile: impl FnMut(usize, usize, usize, &mut [[f32; W]; R])) {
        let out = self.out;
        let mut buf = [[0.0f32; W]; R];
        for p in 0..out.div_ceil(W) {
            let bias = &self.bias[p * W..p * W + W.min(out - p * W)];
            let mut t = 0;
            while t < n {
                let m = tile_rows(n - t, R);
                tile(p, t, m, &mut buf);
                store_tile(&buf[..m], y, t * out + p * W, out, bias);
                t += m;
            }
        }
    }
}

impl Linear {
    /// The bf16 path: `x` rounded to bf16 (round to nearest even) into pair rows, then
    /// `tile_bf16` over each panel.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn forward_bf16(&self, packed: &[u16], x: &[f32], n: usize, y: &mut [f32]) {
        use std::arch::x86_64::*;
        let (inp, out) = (self.inp, self.out);
        let pairs = inp.div_ceil(2);
        let ldx = 2 * pairs;
        let mut xb = vec![0u16; n * ldx];
        for t in 0..n {
            let src = &x[t * inp..(t + 1) * inp];
            let dst = &mut xb[t * ldx..t * ldx + inp];
            let mut i = 0;
            while i + 16 <= inp {
                let v: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(_mm512_loadu_ps(src.as_ptr().add(i))));
                _mm256_storeu_si256(dst.as_mut_ptr().add(i) as *mut __m256i, v);
                i += 16;
            }
            for k in i..inp {
                dst[k] = half::bf16::from_f32(src[k]).to_bits();
            }
        }
        debug_assert_eq!(packed.len(), out.div_ceil(NB512) * pairs * NB512 * 2);
        self.for_each_tile::<NB512, MT512>(n, y, |p, t, m, tile| {
            let panel = packed.as_ptr().add(p * pairs * NB512 * 2);
            let xp = xb.as_ptr().add(t * ldx);
            with_rows!(m, M, tile_bf16::<M>(xp, ldx, pairs, panel, tile));
        });
    }
}

/// One `M x 32` register tile from bf16 pair rows: `tile[r][j] = sum_q x[r][2q] w[2q][j] +
/// x[r][2q+1] w[2q+1][j]`, two inputs per `vdpbf16ps` (f32 accumulators).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
#[inline]
unsafe fn tile_bf16<const M: usize>(x: *const u16, ldx: usize, pairs: usize, panel: *const u16, tile: &mut [[f32; NB512]; MT512]) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); 2]; M];
    for q in 0..pairs {
        let w = panel.add(q * NB512 * 2);
        let w0: __m512bh = std::mem::transmute(_mm512_loadu_si512(w as *const _));
        let w1: __m512bh = std::mem::transmute(_mm512_loadu_si512(w.add(32) as *const _));
        // One pair row is 128 bytes, as two f16 rows: the same distance ahead.
        let ahead = (w as *const u8).wrapping_add(PREFETCH_BYTES);
        _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64) as *const i8);
        for (r, a) in acc.iter_mut().enumerate() {
            let xv: __m512bh = std::mem::transmute(_mm512_set1_epi32((x.add(r * ldx + 2 * q) as *const i32).read_unaligned()));
            a[0] = _mm512_dpbf16_ps(a[0], xv, w0);
            a[1] = _mm512_dpbf16_ps(a[1], xv, w1);
        }
    }
    for (r, a) in acc.iter().enumerate() {
        _mm512_storeu_ps(tile[r].as_mut_ptr(), a[0]);
        _mm512_storeu_ps(tile[r].as_mut_ptr().add(16), a[1]);
    }
}

/// How far ahead of the row being multiplied the tile kernels prefetch panel bytes. The
/// hardware prefetcher alone left ~35 % of the tile loop waiting on the weight loads (perf,
/// f16 panels); 2 KiB ahead (32 f16 rows of the AVX-512 panel, ~0.5 us of FMAs) hides most of it
/// (A/B on the 104 test tasks: 1 KiB and 512 B ahead gained less). Running past a panel's end
/// prefetches the next panel, which follows in memory.
#[cfg(target_arch = "x86_64")]
const PREFETCH_BYTES: usize = 2048;

/// Prefetches row `i`'s bytes `PREFETCH_BYTES` ahead (rows of `nb` f16 when `H`, else f32).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn prefetch_row<const H: bool>(panel: *const u8, i: usize, nb: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let row = nb * if H { 2 } else { 4 };
    // `wrapping_add`: the address may lie past the allocation; a prefetch never faults.
    let ahead = panel.wrapping_add(i * row + PREFETCH_BYTES);
    _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
    if row > 64 {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64) as *const i8);
    }
}

/// One `M x 24` register tile: `tile[r][j] = sum_i x[r][i] * panel[i][j]`; the panel holds f16
/// bit patterns when `H` (widened with F16C), else f32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn tile_avx2<const M: usize, const H: bool>(x: *const f32, ldx: usize, panel: *const u8, tile: &mut [[f32; NB]; MT]) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); 3]; M];
    for i in 0..ldx {
        let (w0, w1, w2) = if H {
            let w = (panel as *const u16).add(i * NB);
            (
                _mm256_cvtph_ps(_mm_loadu_si128(w as *const __m128i)),
                _mm256_cvtph_ps(_mm_loadu_si128(w.add(8) as *const __m128i)),
                _mm256_cvtph_ps(_mm_loadu_si128(w.add(16) as *const __m128i)),
            )
        } else {
            let w = (panel as *const f32).add(i * NB);
            (_mm256_loadu_ps(w), _mm256_loadu_ps(w.add(8)), _mm256_loadu_ps(w.add(16)))
        };
        prefetch_row::<H>(panel, i, NB);
        for (r, a) in acc.iter_mut().enumerate() {
            let xb = _mm256_broadcast_ss(&*x.add(r * ldx + i));
            a[0] = _mm256_fmadd_ps(xb, w0, a[0]);
            a[1] = _mm256_fmadd_ps(xb, w1, a[1]);
            a[2] = _mm256_fmadd_ps(xb, w2, a[2]);
        }
    }
    for (r, a) in acc.iter().enumerate() {
        _mm256_storeu_ps(tile[r].as_mut_ptr(), a[0]);
        _mm256_storeu_ps(tile[r].as_mut_ptr().add(8), a[1]);
        _mm256_storeu_ps(tile[r].as_mut_ptr().add(16), a[2]);
    }
}

/// One `M x 32` register tile: `tile[r][j] = sum_i x[r][i] * panel[i][j]`; the panel holds f16
/// bit patterns when `H` (widened with `vcvtph2ps`), else f32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn tile_avx512<const M: usize, const H: bool>(x: *const f32, ldx: usize, panel: *const u8, tile: &mut [[f32; NB512]; MT512]) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); 2]; M];
    for i in 0..ldx {
        let (w0, w1) = if H {
            let w = (panel as *const u16).add(i * NB512);
            (_mm512_cvtph_ps(_mm256_loadu_si256(w as *const __m256i)), _mm512_cvtph_ps(_mm256_loadu_si256(w.add(16) as *const __m256i)))
        } else {
            let w = (panel as *const f32).add(i * NB512);
            (_mm512_loadu_ps(w), _mm512_loadu_ps(w.add(16)))
        };
        prefetch_row::<H>(panel, i, NB512);
        for (r, a) in acc.iter_mut().enumerate() {
            let xb = _mm512_set1_ps(*x.add(r * ldx + i));
            a[0] = _mm512_fmadd_ps(xb, w0, a[0]);
            a[1] = _mm512_fmadd_ps(xb, w1, a[1]);
        }
    }
    for (r, a) in acc.iter().enumerate() {
        _mm512_storeu_ps(tile[r].as_mut_ptr(), a[0]);
        _mm512_storeu_ps(tile[r].as_mut_ptr().add(16), a[1]);
    }
}

/// `a · b` for one attention head (`dh` = 32 here): eight lanes of partial sums, then a pairwise
/// reduction. `simd::dot_generic` keeps 16 lanes and sums them one after another, which for 32
/// entries costs more than the products (profile: the attention took ~7 % of a forward).
#[inline(always)]
fn dot_head(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let q = [acc[0] + acc[4], acc[1] + acc[5], acc[2] + acc[6], acc[3] + acc[7]];
    (q[0] + q[2]) + (q[1] + q[3]) + tail
}

/// `exp(x)` in f32, branch-free (Cephes `expf` polynomial), so loops over it vectorise.
#[inline(always)]
fn exp_f32(x: f32) -> f32 {
    let x = x.clamp(-87.3, 88.3);
    let n = (x * std::f32::consts::LOG2_E + 0.5).floor();
    // Plain multiply-adds (not `mul_add`): outside an FMA-enabled function `mul_add` becomes a
    // libm call per element.
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 5e-1;
    let y = p * r * r + r + 1.0;
    y * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

/// Exact-erf GELU, `0.5 x (1 + erf(x / sqrt 2))`; erf by Abramowitz & Stegun 7.1.26
/// (absolute error < 1.5e-7).
#[inline(always)]
fn gelu(x: f32) -> f32 {
    let z = x * std::f32::consts::FRAC_1_SQRT_2;
    let a = z.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = t * (0.254_829_6 + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152_1 + t * 1.061_405_4))));
    let e = 1.0 - poly * exp_f32(-a * a);
    let erf = if z < 0.0 { -e } else { e };
    0.5 * x * (1.0 + erf)
}

fn gelu_slice(v: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            #[target_feature(enable = "avx512f")]
            unsafe fn go512(v: &mut [f32]) {
                v.iter_mut().for_each(|x| *x = gelu(*x));
            }
            // SAFETY: AVX-512F is present (checked): 16 lanes per step instead of 8.
            unsafe { go512(v) };
            return;
        }
        if crate::simd::has_avx2() {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn go(v: &mut [f32]) {
                v.iter_mut().for_each(|x| *x = gelu(*x));
            }
            // SAFETY: AVX2 and FMA are present (checked).
            unsafe { go(v) };
            return;
        }
    }
    v.iter_mut().for_each(|x| *x = gelu(*x));
}

fn layer_norm(x: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32) {
    let d = gamma.len();
    for row in x.chunks_exact_mut(d) {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for ((v, g), b) in row.iter_mut().zip(gamma).zip(beta) {
            *v = ((*v as f64 - mean) * inv) as f32 * g + b;
        }
    }
}

struct Layer {
    qkv: Linear,
    attn_out: Linear,
    ln1: (Vec<f32>, Vec<f32>),
    inter: Linear,
    out: Linear,
    ln2: (Vec<f32>, Vec<f32>),
}

/// The encoder: embeddings + `L` post-LN transformer layers. Output: mean-pooled hidden state.
pub(crate) struct Bert {
    hidden: usize,
    heads: usize,
    eps: f32,
    word: Vec<f32>,
    pos: Vec<f32>,
    max_pos: usize,
    type0: Vec<f32>,
    emb_ln: (Vec<f32>, Vec<f32>),
    layers: Vec<Layer>,
}

/// The config fields the forward needs (Hugging Face `config.json` names).
#[derive(serde::Deserialize)]
pub(crate) struct BertConfig {
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    pub num_hidden_layers: usize,
    pub intermediate_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default)]
    pub hidden_act: Option<String>,
    #[serde(default)]
    pub position_embedding_type: Option<String>,
}

fn default_eps() -> f64 {
    1e-12
}

/// A tensor's values as a flat f32 vector (any float dtype).
fn f32_values(t: &Tensor) -> candle_core::Result<Vec<f32>> {
    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
}

impl Bert {
    /// Loads the weights from a safetensors file (with or without the `bert.` prefix). With an
    /// `adapter` (tensors `<weight>.lora_a`, r x in, and `<weight>.lora_b`, out x r, scale
    /// already applied), each adapted weight becomes `W + B A` before packing; an adapter tensor
    /// that names no weight of the model, or whose shape does not fit, is an error.
    pub(crate) fn load(path: &std::path::Path, cfg: &BertConfig, format: WeightFormat, adapter: Option<&HashMap<String, Tensor>>) -> Result<Bert> {
        let bad = |r: String| Error::EmbedderLoad { path: path.to_path_buf(), reason: r };
        if let Some(act) = cfg.hidden_act.as_deref() {
            if act != "gelu" {
                return Err(bad(format!("hidden_act '{act}' is not supported (only exact gelu)")));
            }
        }
        if let Some(p) = cfg.position_embedding_type.as_deref() {
            if p != "absolute" {
                return Err(bad(format!("position_embedding_type '{p}' is not supported")));
            }
        }
        if cfg.num_attention_heads == 0 || !cfg.hidden_size.is_multiple_of(cfg.num_attention_heads) {
            return Err(bad("hidden_size is not a multiple of num_attention_heads".into()));
        }
        let map: HashMap<String, Tensor> = candle_core::safetensors::load(path, &Device::Cpu).map_err(|e| bad(e.to_string()))?;
        let get = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
            let t = map.get(name).or_else(|| map.get(&format!("bert.{name}"))).ok_or_else(|| bad(format!("tensor '{name}' missing")))?;
            if t.dims() != shape {
                return Err(bad(format!("tensor '{name}' has shape {:?}, expected {shape:?}", t.dims())));
            }
            f32_values(t).map_err(|e| bad(format!("tensor '{name}': {e}")))
        };
        let used = std::cell::Cell::new(0usize);
        // A weight matrix with the adapter's low-rank delta added, when the adapter has one.
        let get_w = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
            let mut w = get(name, shape)?;
            let Some(ad) = adapter else { return Ok(w) };
            let (Some(a), Some(b)) = (ad.get(&format!("{name}.lora_a")), ad.get(&format!("{name}.lora_b"))) else {
                return Ok(w);
            };
            let (out, inp) = (shape[0], shape[1]);
            let r = a.dims().first().copied().unwrap_or(0);
            if a.dims() != [r, inp] || b.dims() != [out, r] || r == 0 {
                return Err(bad(format!("adapter for '{name}': lora_a {:?} / lora_b {:?} do not fit {shape:?}", a.dims(), b.dims())));
            }
            let values = |t: &Tensor, part: &str| f32_values(t).map_err(|e| bad(format!("adapter tensor '{name}.{part}': {e}")));
            let (a, b) = (values(a, "lora_a")?, values(b, "lora_b")?);
            for (o, row) in w.chunks_exact_mut(inp).enumerate() {
                for (k, &bk) in b[o * r..(o + 1) * r].iter().enumerate() {
                    for (x, &ak) in row.iter_mut().zip(&a[k * inp..(k + 1) * inp]) {
                        *x += bk * ak;
                    }
                }
            }
            used.set(used.get() + 2);
            Ok(w)
        };
        let (h, ff) = (cfg.hidden_size, cfg.intermediate_size);
        let word = map
            .get("embeddings.word_embeddings.weight")
            .or_else(|| map.get("bert.embeddings.word_embeddings.weight"))
            .ok_or_else(|| bad("tensor 'embeddings.word_embeddings.weight' missing".into()))?
            .dims()
            .to_vec();
        if word.len() != 2 || word[1] != h {
            return Err(bad(format!("word embeddings have shape {word:?}")));
        }
        let pos_shape = map
            .get("embeddings.position_embeddings.weight")
            .or_else(|| map.get("bert.embeddings.position_embeddings.weight"))
            .map(|t| t.dims().to_vec())
            .unwrap_or_default();
        let max_pos = pos_shape.first().copied().unwrap_or(0);
        let types = get("embeddings.token_type_embeddings.weight", &[2, h]).or_else(|_| get("embeddings.token_type_embeddings.weight", &[1, h]))?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let p = |s: &str| format!("encoder.layer.{l}.{s}");
            let mut wqkv = get_w(&p("attention.self.query.weight"), &[h, h])?;
            wqkv.extend(get_w(&p("attention.self.key.weight"), &[h, h])?);
            wqkv.extend(get_w(&p("attention.self.value.weight"), &[h, h])?);
            let mut bqkv = get(&p("attention.self.query.bias"), &[h])?;
            bqkv.extend(get(&p("attention.self.key.bias"), &[h])?);
            bqkv.extend(get(&p("attention.self.value.bias"), &[h])?);
            layers.push(Layer {
                qkv: Linear::new(&wqkv, &bqkv, 3 * h, h, format),
                attn_out: Linear::new(&get_w(&p("attention.output.dense.weight"), &[h, h])?, &get(&p("attention.output.dense.bias"), &[h])?, h, h, format),
                ln1: (get(&p("attention.output.LayerNorm.weight"), &[h])?, get(&p("attention.output.LayerNorm.bias"), &[h])?),
                inter: Linear::new(&get_w(&p("intermediate.dense.weight"), &[ff, h])?, &get(&p("intermediate.dense.bias"), &[ff])?, ff, h, format),
                out: Linear::new(&get_w(&p("output.dense.weight"), &[h, ff])?, &get(&p("output.dense.bias"), &[h])?, h, ff, format),
                ln2: (get(&p("output.LayerNorm.weight"), &[h])?, get(&p("output.LayerNorm.bias"), &[h])?),
            });
        }
        if let Some(ad) = adapter {
            if used.get() != ad.len() {
                let mut names: Vec<&String> = ad.keys().collect();
                names.sort();
                return Err(bad(format!(
                    "adapter has {} tensors but only {} fit this model's weights (names: {:?}...)",
                    ad.len(),
                    used.get(),
                    &names[..names.len().min(3)]
                )));
            }
        }
        Ok(Bert {
            hidden: h,
            heads: cfg.num_attention_heads,
            eps: cfg.layer_norm_eps as f32,
            word: get("embeddings.word_embeddings.weight", &word)?,
            pos: get("embeddings.position_embeddings.weight", &pos_shape)?,
            max_pos,
            type0: types[..h].to_vec(),
            emb_ln: (get("embeddings.LayerNorm.weight", &[h])?, get("embeddings.LayerNorm.bias", &[h])?),
            layers,
        })
    }

    pub(crate) fn hidden(&self) -> usize {
        self.hidden
    }

    /// Longest input the position table allows.
    pub(crate) fn max_positions(&self) -> usize {
        self.max_pos
    }

    /// Mean over all tokens of the last hidden states of one sequence (no padding).
    pub(crate) fn forward_mean(&self, ids: &[u32]) -> Result<Vec<f32>> {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::simd::has_avx2() {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn go(m: &Bert, ids: &[u32]) -> Result<Vec<f32>> {
                    m.forward_impl(ids)
                }
                // SAFETY: AVX2 and FMA are present (checked); `go` only lets the compiler use them
                // for the attention and element-wise loops.
                return unsafe { go(self, ids) };
            }
        }
        self.forward_impl(ids)
    }

    #[inline(always)]
    fn forward_impl(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let h = self.hidden;
        let n = ids.len();
        if n == 0 {
            return Ok(vec![0.0; h]);
        }
        if n > self.max_pos {
            return Err(Error::Embed(format!("{n} tokens exceed the model's {} positions", self.max_pos)));
        }
        let vocab = self.word.len() / h;
        let mut x = vec![0.0f32; n * h];
        for (t, &id) in ids.iter().enumerate() {
            let id = id as usize;
            if id >= vocab {
                return Err(Error::Embed(format!("token id {id} out of range")));
            }
            let row = &mut x[t * h..(t + 1) * h];
            let (w, p) = (&self.word[id * h..(id + 1) * h], &self.pos[t * h..(t + 1) * h]);
            for j in 0..h {
                row[j] = w[j] + p[j] + self.type0[j];
            }
        }
        layer_norm(&mut x, &self.emb_ln.0, &self.emb_ln.1, self.eps);
        let ff = self.layers.first().map_or(0, |l| l.inter.out);
        let mut qkv = vec![0.0f32; n * 3 * h];
        let mut ctx = vec![0.0f32; n * h];
        let mut tmp = vec![0.0f32; n * h];
        let mut mid = vec![0.0f32; n * ff];
        let mut scores = vec![0.0f32; n];
        let dh = h / self.heads;
        let scale = 1.0 / (dh as f32).sqrt();
        for l in &self.layers {
            l.qkv.forward(&x, n, &mut qkv);
            for hd in 0..self.heads {
                let off = hd * dh;
                for i in 0..n {
                    let q = &qkv[i * 3 * h + off..i * 3 * h + off + dh];
                    let mut m = f32::NEG_INFINITY;
                    for j in 0..n {
                        let k = &qkv[j * 3 * h + h + off..j * 3 * h + h + off + dh];
                        let s = dot_head(q, k) * scale;
                        scores[j] = s;
                        m = m.max(s);
                    }
                    let mut sum = 0.0;
                    for s in scores.iter_mut() {
                        *s = exp_f32(*s - m);
                        sum += *s;
                    }
                    let c = &mut ctx[i * h + off..i * h + off + dh];
                    c.iter_mut().for_each(|v| *v = 0.0);
                    for (j, &s) in scores.iter().enumerate() {
                        let p = s / sum;
                        let v = &qkv[j * 3 * h + 2 * h + off..j * 3 * h + 2 * h + off + dh];
                        for d in 0..dh {
                            c[d] += p * v[d];
                        }
                    }
                }
            }
            l.attn_out.forward(&ctx, n, &mut tmp);
            for (a, b) in tmp.iter_mut().zip(&x) {
                *a += b;
            }
            layer_norm(&mut tmp, &l.ln1.0, &l.ln1.1, self.eps);
            std::mem::swap(&mut x, &mut tmp);
            l.inter.forward(&x, n, &mut mid);
            gelu_slice(&mut mid);
            l.out.forward(&mid, n, &mut tmp);
            for (a, b) in tmp.iter_mut().zip(&x) {
                *a += b;
            }
            layer_norm(&mut tmp, &l.ln2.0, &l.ln2.1, self.eps);
            std::mem::swap(&mut x, &mut tmp);
        }
        let mut mean = vec![0.0f32; h];
        for row in x.chunks_exact(h) {
            for (m, v) in mean.iter_mut().zip(row) {
                *m += v;
            }
        }
        mean.iter_mut().for_each(|m| *m /= n as f32);
        Ok(mean)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel the CPU has (the generic one always).
    fn kernels() -> Vec<Kernel> {
        #[allow(unused_mut)]
        let mut kernels = vec![Kernel::Generic];
        #[cfg(target_arch = "x86_64")]
        {
            if crate::simd::has_avx2() && is_x86_feature_detected!("f16c") {
                kernels.push(Kernel::Avx2);
            }
            if is_x86_feature_detected!("avx512f") {
                kernels.push(Kernel::Avx512);
            }
        }
        kernels
    }

    /// One test product: `n x inp` inputs, `out x inp` weights (also rounded to f16), bias.
    struct Case {
        out: usize,
        inp: usize,
        n: usize,
        w: Vec<f32>,
        w16: Vec<f32>,
        b: Vec<f32>,
        x: Vec<f32>,
    }

    impl Case {
        /// `x w^T + b` at token `t`, output `o`, in f64, from the weights `w` given.
        fn naive(&self, w: &[f32], t: usize, o: usize) -> f64 {
            let inp = self.inp;
            (0..inp).map(|i| self.x[t * inp + i] as f64 * w[o * inp + i] as f64).sum::<f64>() + self.b[o] as f64
        }
    }

    /// Shapes that exercise full and partial panels and every tile height (up to 25 tokens).
    fn cases() -> impl Iterator<Item = Case> {
        [(24, 8, 1), (50, 13, 7), (48, 32, 4), (30, 5, 9), (64, 20, 13), (70, 9, 25), (96, 40, 14), (33, 17, 2)].into_iter().map(|(out, inp, n)| {
            let w: Vec<f32> = (0..out * inp).map(|i| ((i * 7919) % 113) as f32 / 113.0 - 0.5).collect();
            let w16 = w.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
            let b = (0..out).map(|i| i as f32 * 0.01).collect();
            let x = (0..n * inp).map(|i| ((i * 104729) % 97) as f32 / 97.0 - 0.5).collect();
            Case { out, inp, n, w, w16, b, x }
        })
    }

    /// Runs every kernel with `format` panels on every case; `check(case, t, o, y)` describes
    /// an output that is out of bounds.
    fn check_all(format: WeightFormat, check: impl Fn(&Case, usize, usize, f64) -> Option<String>) {
        for c in cases() {
            for k in kernels() {
                let lin = Linear::with_kernel(&c.w, &c.b, c.out, c.inp, format, k);
                let mut y = vec![0.0; c.n * c.out];
                lin.forward(&c.x, c.n, &mut y);
                for t in 0..c.n {
                    for o in 0..c.out {
                        if let Some(e) = check(&c, t, o, y[t * c.out + o] as f64) {
                            panic!("{format:?} {k:?} {}x{} n={} t={t} o={o}: {e}", c.out, c.inp, c.n);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn linear_matches_naive() {
        check_all(WeightFormat::F32, |c, t, o, got| {
            let want = c.naive(&c.w, t, o);
            ((got - want).abs() >= 1e-4).then(|| format!("{got} vs {want}"))
        });
    }

    /// The f16 tiles against a naive product over the f16-rounded weights (so the only
    /// difference left is f32 summation order: within 1e-5 here), and against the f32 weights
    /// within the rounding of half precision (2^-11 relative per weight, |x| <= 0.5, so at most
    /// inp * 0.5 * 0.5 * 2^-11 ~ 5e-3 at inp 40; the bound used, 2e-3, holds for these inputs
    /// and fails if a kernel read the panels as f32 or misplaced a column).
    #[test]
    fn linear_f16_matches_naive() {
        assert!(cases().all(|c| c.w16 != c.w), "the test weights must not all be exact in f16");
        check_all(WeightFormat::F16, |c, t, o, got| {
            let (want16, want32) = (c.naive(&c.w16, t, o), c.naive(&c.w, t, o));
            ((got - want16).abs() >= 1e-5 || (got - want32).abs() >= 2e-3).then(|| format!("{got} vs {want16} (f16 weights), {want32} (f32)"))
        });
    }

    /// The bf16 tiles (where the CPU has them) against a naive product over bf16-rounded inputs
    /// and weights: the kernel rounds both, so what is left is f32 summation order (1e-5 here);
    /// a swapped pair or a misplaced column is off by ~0.1. Where bf16 panels are not possible
    /// the format must fall back to f16 panels, checked as in `linear_f16_matches_naive`.
    #[test]
    fn linear_bf16_matches_naive() {
        let bf = |v: f32| half::bf16::from_f32(v).to_f32() as f64;
        let mut ran_bf16 = false;
        for c in cases() {
            for k in kernels() {
                let lin = Linear::with_kernel(&c.w, &c.b, c.out, c.inp, WeightFormat::Bf16, k);
                let is_bf16 = matches!(lin.packed, Panels::Bf16(_));
                #[cfg(target_arch = "x86_64")]
                assert_eq!(is_bf16, k == Kernel::Avx512 && has_bf16(), "{k:?}");
                ran_bf16 |= is_bf16;
                let mut y = vec![0.0; c.n * c.out];
                lin.forward(&c.x, c.n, &mut y);
                for t in 0..c.n {
                    for o in 0..c.out {
                        let got = y[t * c.out + o] as f64;
                        let want = if is_bf16 {
                            (0..c.inp).map(|i| bf(c.x[t * c.inp + i]) * bf(c.w[o * c.inp + i])).sum::<f64>() + c.b[o] as f64
                        } else {
                            c.naive(&c.w16, t, o)
                        };
                        assert!((got - want).abs() < 1e-5, "{k:?} bf16={is_bf16} {}x{} n={} t={t} o={o}: {got} vs {want}", c.out, c.inp, c.n);
                    }
                }
            }
        }
        if has_bf16() {
            assert!(ran_bf16);
        }
    }

    #[test]
    fn tiles_are_balanced() {
        let split = |n: usize, mt: usize| {
            let (mut t, mut v) = (0, Vec::new());
            while t < n {
                let m = tile_rows(n - t, mt);
                v.push(m);
                t += m;
            }
            v
        };
        assert_eq!(split(13, 12), [7, 6]);
        assert_eq!(split(12, 12), [12]);
        assert_eq!(split(25, 12), [9, 8, 8]);
        assert_eq!(split(5, 4), [3, 2]);
        assert_eq!(split(1, 12), [1]);
    }

    #[test]
    fn exp_and_gelu_are_accurate() {
        for i in -2000..2000 {
            let x = i as f32 / 100.0;
            let e = exp_f32(x);
            let r = (x as f64).exp();
            assert!(((e as f64 - r) / r).abs() < 3e-7, "exp({x})");
        }
        // erf reference values
        for (x, erf) in [(0.5f64, 0.520_499_877_813_046_5), (1.0, 0.842_700_792_949_714_9), (-2.0, -0.995_322_265_018_952_7)] {
            let xs = (x * std::f64::consts::SQRT_2) as f32;
            let g = gelu(xs) as f64;
            let want = 0.5 * xs as f64 * (1.0 + erf);
            assert!((g - want).abs() < 1e-6, "gelu({xs}): {g} vs {want}");
        }
    }
}
