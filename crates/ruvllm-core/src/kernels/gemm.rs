//! Prefill GEMM for the 32-element weight formats (Q4_0, Q5_0, Q8_0) on weights packed once
//! into VNNI row tiles. OWNER: kernels helper.
//!
//! A tile holds [`TILE_ROWS`] weight rows. For each 32-element block it stores the 16 row scales
//! (f32) and the quants of the 16 rows interleaved four at a time: group `g` (elements
//! `4g..4g+4`) of all 16 rows forms one 64-byte vector, so one `vpdpbusd` with the four
//! activation bytes of that group broadcast computes the group for all 16 rows, each row in its
//! own 32-bit lane. Eight of them give the block's integer dot product for 16 rows; one
//! conversion and one fused multiply-add (row scale × activation scale) add it to the outputs.
//! The per-row dot kernels need about ten instructions per block and token; this needs under
//! one, and the unpacked weights stay in registers for four tokens.
//!
//! `vpdpbusd` multiplies unsigned by signed bytes, so the quants are stored as `u = q + zp`
//! (`zp` = 128, 16 or 8 for Q8_0, Q5_0, Q4_0) and the accumulator starts at `−zp · Σa` (the
//! activation block's exact sum, `BlockQ8::qsum`), which makes the integer sum exactly `Σ q·a`.
//! Q4_0 and Q5_0 keep 4-bit quants (two groups per 64-byte vector, low and high nibbles), Q5_0
//! adds its fifth bits as one 64-bit mask per group: packed Q5_0 takes 24 bytes per block and
//! row (22 in the file), Q4_0 20 (18), Q8_0 36 (34).
//!
//! The float operations differ in order from the per-row dot kernels (one rounding per block
//! instead of one per group of four), so results agree with them to float rounding, not bit for
//! bit; [`gemm_ref`] is the scalar model of the SIMD kernel, equal to it bit for bit.

use super::matmul::ThreadPool;
use super::quant::{self, BlockQ8, QK};
use super::GgmlType;

/// Rows per tile (one 512-bit vector of 32-bit lanes).
pub const TILE_ROWS: usize = 16;
/// Weights with more rows than this are not packed: the LM head over a large vocabulary is
/// only ever used for a few tokens at a time, and a packed copy would double its memory.
pub const PACK_MAX_ROWS: usize = 1 << 16;

/// Packed tile formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackKind {
    Q8,
    Q5,
    Q4,
}

impl PackKind {
    pub fn for_type(ty: GgmlType) -> Option<Self> {
        match ty {
            GgmlType::Q8_0 => Some(Self::Q8),
            GgmlType::Q5_0 => Some(Self::Q5),
            GgmlType::Q4_0 => Some(Self::Q4),
            _ => None,
        }
    }

    /// Bytes of one block of one tile: 16 f32 scales, then the quants.
    pub const fn block_bytes(self) -> usize {
        64 + match self {
            Self::Q8 => 512,
            Self::Q5 => 256 + 64,
            Self::Q4 => 256,
        }
    }

    /// The offset added to the signed quants to make them unsigned.
    pub const fn zp(self) -> i32 {
        match self {
            Self::Q8 => 128,
            Self::Q5 => 16,
            Self::Q4 => 8,
        }
    }
}

/// 64-byte aligned storage unit.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

/// A weight packed into tiles (tile `i` holds rows `16i..16i+16`, the last one zero-padded).
pub struct Packed {
    pub kind: PackKind,
    pub rows: usize,
    /// 32-element blocks per row.
    pub nb: usize,
    lines: Vec<Line>,
}

impl Packed {
    pub fn tiles(&self) -> usize {
        self.rows.div_ceil(TILE_ROWS)
    }

    pub fn tile_bytes(&self) -> usize {
        self.nb * self.kind.block_bytes()
    }

    /// The bytes of tile `i`.
    pub fn tile(&self, i: usize) -> &[u8] {
        let tb = self.tile_bytes();
        &self.bytes()[i * tb..(i + 1) * tb]
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `Line` is 64 plain bytes.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const u8, self.lines.len() * 64) }
    }

    /// Packs `rows × nb` blocks of `ty` (`data`, ggml rows) on `pool`. `None` for types
    /// without a packed format.
    pub fn new(pool: &ThreadPool, ty: GgmlType, data: &[u8], rows: usize, nb: usize) -> Option<Self> {
        let kind = PackKind::for_type(ty)?;
        let rs = nb * ty.type_size();
        assert!(data.len() >= rows * rs, "Packed::new: {} bytes for {rows} rows of {rs}", data.len());
        let tiles = rows.div_ceil(TILE_ROWS);
        let tb = nb * kind.block_bytes();
        let mut lines = vec![Line([0; 64]); tiles * tb / 64];
        let base = SendPtr(lines.as_mut_ptr() as *mut u8);
        let tasks = (pool.threads() * 4).min(tiles);
        pool.for_each(tasks, &|i| {
            for t in (i * tiles / tasks)..((i + 1) * tiles / tasks) {
                let (r0, r1) = (t * TILE_ROWS, ((t + 1) * TILE_ROWS).min(rows));
                // SAFETY: tile `t` is written by exactly one task.
                let out = unsafe { std::slice::from_raw_parts_mut(base.get().add(t * tb), tb) };
                pack_tile(kind, ty, &data[r0 * rs..r1 * rs], r1 - r0, nb, out);
            }
        });
        Some(Self { kind, rows, nb, lines })
    }
}

#[derive(Clone, Copy)]
struct SendPtr(*mut u8);
unsafe impl Sync for SendPtr {}
unsafe impl Send for SendPtr {}
impl SendPtr {
    fn get(self) -> *mut u8 {
        self.0
    }
}

/// Writes `nrows ≤ 16` rows (`src`, `nb` blocks of `ty` each) as one tile into `out`
/// (`nb × kind.block_bytes()` bytes); missing rows get zero scales.
pub fn pack_tile(kind: PackKind, ty: GgmlType, src: &[u8], nrows: usize, nb: usize, out: &mut [u8]) {
    let (ts, bb) = (ty.type_size(), kind.block_bytes());
    assert!(nrows <= TILE_ROWS && out.len() >= nb * bb && src.len() >= nrows * nb * ts);
    assert_eq!(PackKind::for_type(ty), Some(kind));
    let rd = |p: &[u8], o: usize| u32::from_le_bytes([p[o], p[o + 1], p[o + 2], p[o + 3]]);
    for b in 0..nb {
        let ob = &mut out[b * bb..(b + 1) * bb];
        let (scales, payload) = ob.split_at_mut(64);
        payload.fill(0);
        scales.fill(0);
        for j in 0..nrows {
            let blk = &src[(j * nb + b) * ts..(j * nb + b + 1) * ts];
            scales[4 * j..4 * j + 4].copy_from_slice(&quant::f16_at(blk, 0).to_le_bytes());
            let lane = 4 * j;
            match kind {
                PackKind::Q8 => {
                    for g in 0..QK / 4 {
                        let w = rd(blk, 2 + 4 * g) ^ 0x8080_8080;
                        payload[g * 64 + lane..g * 64 + lane + 4].copy_from_slice(&w.to_le_bytes());
                    }
                }
                PackKind::Q5 | PackKind::Q4 => {
                    // The file's nibbles are already `q + zp`: element e < 16 is the low nibble
                    // of byte e, element e ≥ 16 the high nibble of byte e − 16. Vector h holds
                    // elements 8h..8h+4 in its low nibbles and 8h+4..8h+8 in its high ones.
                    let qs = &blk[ts - 16..];
                    for h in 0..4 {
                        let x = u64::from_le_bytes(qs[8 * (h % 2)..8 * (h % 2) + 8].try_into().unwrap());
                        let n = (x >> (4 * (h / 2))) & 0x0F0F_0F0F_0F0F_0F0F;
                        let w = (n as u32) | ((n >> 32) as u32) << 4;
                        payload[h * 64 + lane..h * 64 + lane + 4].copy_from_slice(&w.to_le_bytes());
                    }
                    if kind == PackKind::Q5 {
                        // Fifth bits: bit e of qh; group g's four bits go to lanes 4j..4j+4.
                        let qh = rd(blk, 2);
                        for g in 0..QK / 4 {
                            let bits = ((qh >> (4 * g)) & 0xF) as u8;
                            payload[256 + 8 * g + lane / 8] |= bits << (lane % 8);
                        }
                    }
                }
            }
        }
    }
}

/// The unsigned quant of row `j`, element `e` of block `b` of a tile (the packed layout's
/// definition, used by the scalar model).
fn tile_u(kind: PackKind, tile: &[u8], b: usize, j: usize, e: usize) -> i32 {
    let p = &tile[b * kind.block_bytes() + 64..];
    let (g, k) = (e / 4, e % 4);
    let lane = j * 4 + k;
    match kind {
        PackKind::Q8 => p[g * 64 + lane] as i32,
        PackKind::Q5 | PackKind::Q4 => {
            let lo = (p[(g / 2) * 64 + lane] >> (4 * (g % 2))) & 0x0F;
            let hi = if kind == PackKind::Q5 { (p[256 + 8 * g + lane / 8] >> (lane % 8)) & 1 } else { 0 };
            (lo | hi << 4) as i32
        }
    }
}

/// A tile GEMM: for tokens `0..ntok` (activation rows of `nb` blocks, consecutive in `act`)
/// writes the first `nrows` outputs of each token to `y[t·ystride ..]`.
pub type GemmFn = unsafe fn(kind: PackKind, tile: &[u8], nb: usize, act: &[BlockQ8], ntok: usize, y: *mut f32, ystride: usize, nrows: usize);

/// Scalar model of the SIMD tile GEMM (same operations in the same order).
///
/// # Safety
/// `y` must be valid for writes of `y[t·ystride + j]`, `t < ntok`, `j < nrows`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_ref(kind: PackKind, tile: &[u8], nb: usize, act: &[BlockQ8], ntok: usize, y: *mut f32, ystride: usize, nrows: usize) {
    let bb = kind.block_bytes();
    assert!(tile.len() >= nb * bb && act.len() >= ntok * nb && nrows <= TILE_ROWS);
    for t in 0..ntok {
        let mut acc = [0f32; TILE_ROWS];
        for (b, ab) in act[t * nb..(t + 1) * nb].iter().enumerate() {
            for (j, acc) in acc.iter_mut().enumerate() {
                let mut s = -kind.zp() * ab.qsum;
                for (e, &q) in ab.qs.iter().enumerate() {
                    s += tile_u(kind, tile, b, j, e) * q as i32;
                }
                let o = b * bb + 4 * j;
                let d = f32::from_le_bytes([tile[o], tile[o + 1], tile[o + 2], tile[o + 3]]);
                *acc = (d * ab.d).mul_add(s as f32, *acc);
            }
        }
        for (j, v) in acc.iter().take(nrows).enumerate() {
            *y.add(t * ystride + j) = *v;
        }
    }
}

/// The SIMD tile GEMM for this CPU, if there is one (AVX-512 F/BW with VNNI). `RUVLLM_NO_GEMM`
/// turns it off (the per-row kernels are used instead).
pub fn kernel() -> Option<GemmFn> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::env::var_os("RUVLLM_FORCE_SCALAR").is_none()
            && std::env::var_os("RUVLLM_NO_GEMM").is_none()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("fma")
        {
            return Some(super::simd_avx512::gemm);
        }
    }
    None
}
