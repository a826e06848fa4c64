//! Prefill GEMM for the 32-element weight formats (Q4_0, Q5_0, Q8_0) on weights packed once
//! into VNNI row tiles.
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
//! adds its fifth bits as one byte per lane, bit `g` for group `g` (a shift and a mask put a
//! group's bits at 0x10 in every byte, for AVX2 as for AVX-512): packed Q5_0 takes 24 bytes per
//! block and row (22 in the file), Q4_0 20 (18), Q8_0 36 (34).
//!
//! Q4_1 and Q5_1 ([`PackKind::Q41`], [`PackKind::Q51`], `w = d·q + m`, quants 0..=15 or
//! 0..=31) keep the Q4_0 and Q5_0 quant layouts with no offset and a 64-byte header of f16
//! values (the 16 rows' `d`, then their `m`, exactly as in the file): 20 and 24 bytes per
//! block and row, the file's sizes, for decode's sake (one `vcvtph2ps`
//! per header and block, shared by all tokens of a pass, is little next to the block's eight
//! `vpdpbusd` per token). The min term is `m · s` with the activation block's `s = d_a·Σa`
//! (ggml's `block_q8_1.s`), one more fused multiply-add per block and token.
//!
//! IQ4_NL ([`PackKind::I4`]) keeps Q4_0's layout of its 4-bit indices; the kernels look the
//! values up (`vpshufb` on the nibbles) in the table `KVALUES_IQ4NL + 128`, so `u = v + 128`
//! with the `−128·Σa` start of Q8_0. The AVX2 kernel without VNNI looks up the signed values
//! and multiplies them as it does Q8_0's. IQ4_XS ([`PackKind::X4`]) is its 256-element
//! super-block form with a signed 6-bit scale per 32 elements (see [`pack_tile`]).
//!
//! The LM head, which decode streams whole for one token per pass (for Gemma 3, 72 % of a
//! token's bytes), is packed compact instead ([`PackKind::Q8H`], by `QWeight::prepare_head`):
//! the scales stay f16 as in the file (widened exactly by
//! `vcvtph2ps`, so the results are the same bits), two blocks' scales in one 64-byte header
//! before the two blocks' quants, which keeps every quant vector 64-byte aligned: 34 bytes per
//! block and row, what the file takes. The layer weights keep f32 scales: widening them in the
//! prefill's compute-bound inner loop cost ~5 % of AVX-512 prefill speed when every tile was
//! compact. Q8H keeps the quants signed, as the file has them, and only takes weights without
//! the quant −128 (ggml's quantizer writes −127..=127): the AVX2 kernel without VNNI then
//! computes `|a| · sign(q, a)` with one `vpsignb` per vector and no `vpabsb`/`vpxor` (−q never
//! wraps), the VNNI kernels flip the sign bit on load to get `q + 128`.
//!
//! On CPUs without AVX-512 the AVX2 kernel (`arch::x86::avx2_gemm`) runs the same tiles as two
//! 8-row halves (one 256-bit vector each), with AVX-VNNI's `vpdpbusd` or an exact emulation of it
//! (`vpmaddubsw` and `vpmaddwd`, the Q8_0 quants used signed), and equals [`gemm_ref`] too.
//!
//! The float operations differ in order from the per-row dot kernels (one rounding per block
//! instead of one per group of four), so results agree with them to float rounding, not bit for
//! bit; [`gemm_ref`] is the scalar model of the SIMD kernel, equal to it bit for bit.

use super::quant::{self, BlockQ8, BlockQ8K, QK, QK_K};
use super::GgmlType;
use crate::runtime::mem::HugeBuf;
use crate::runtime::{SharedMut, ThreadPool};

/// Rows per tile (one 512-bit vector of 32-bit lanes).
pub const TILE_ROWS: usize = 16;
/// Weights with more rows than this are not packed on first use (a packed copy next to the
/// file's pages would double the memory of a large LM head); `QWeight::prepare` packs any size
/// and releases the file's pages, which is how the model loader packs its LM head.
pub const PACK_MAX_ROWS: usize = 1 << 16;

/// Packed tile formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackKind {
    Q8,
    Q5,
    Q4,
    /// Q4_1: Q4's quants after a header of f16 scales and mins (see the module notes).
    Q41,
    /// Q5_1: Q5's quants after a header of f16 scales and mins.
    Q51,
    /// Q4_K (see [`pack_tile`] for the K-quant layouts).
    K4,
    /// Q5_K.
    K5,
    /// Q6_K.
    K6,
    /// Q2_K: the file's scale/min bytes and a 2-bit plane per sub-block (see [`pack_tile`]).
    K2,
    /// Q3_K: 2-bit planes and a high-bit plane (see [`pack_tile`]).
    K3,
    /// IQ4_NL: Q4's layout of the 4-bit indices, looked up in [`quant::KVALUES_IQ4NL`].
    I4,
    /// IQ4_XS.
    X4,
    /// Q8_0 with f16 scales in pair headers (see [`PackKind::tile_bytes`]) and signed quants
    /// (never −128): the compact layout of an LM head.
    Q8H,
}

impl PackKind {
    pub fn for_type(ty: GgmlType) -> Option<Self> {
        match ty {
            GgmlType::Q8_0 => Some(Self::Q8),
            GgmlType::Q5_0 => Some(Self::Q5),
            GgmlType::Q4_0 => Some(Self::Q4),
            GgmlType::Q4_1 => Some(Self::Q41),
            GgmlType::Q5_1 => Some(Self::Q51),
            GgmlType::Q2_K => Some(Self::K2),
            GgmlType::Q3_K => Some(Self::K3),
            GgmlType::Q4_K => Some(Self::K4),
            GgmlType::Q5_K => Some(Self::K5),
            GgmlType::Q6_K => Some(Self::K6),
            GgmlType::IQ4_NL => Some(Self::I4),
            GgmlType::IQ4_XS => Some(Self::X4),
            _ => None,
        }
    }

    /// The compact layout of this kind where it has one (Q8_0: [`Self::Q8H`]), else itself.
    pub const fn compact(self) -> Self {
        match self {
            Self::Q8 => Self::Q8H,
            k => k,
        }
    }

    /// Whether the scales are f16 in pair headers (see [`Self::tile_bytes`]).
    pub const fn is_compact(self) -> bool {
        matches!(self, Self::Q8H)
    }

    /// Bytes of one block (32 elements, or a 256-element super-block for the K-quants) of
    /// one tile; for the compact kinds, of its quants only (the scales are in the pair's
    /// header).
    pub const fn block_bytes(self) -> usize {
        match self {
            Self::Q8 => 64 + 512,
            Self::Q8H => 512,
            Self::Q5 | Self::Q51 => 64 + 256 + 64,
            Self::Q4 | Self::Q41 | Self::I4 => 64 + 256,
            Self::K4 => K4_QS + 8 * 256,
            Self::K5 => K4_QS + 8 * 320,
            Self::K6 => K6_QS + 16 * 256,
            Self::X4 => X4_QS + 8 * 256,
            Self::K3 => K3_HI + 8 * 64,
            Self::K2 => K2_QS + 16 * 64,
        }
    }

    /// Bytes of a tile of `nb` blocks. The compact kinds store blocks in pairs: a 64-byte
    /// header (the 16 rows' f16 scales of block `2p`, then those of block `2p + 1`) and the two
    /// blocks' quants; an odd last block has a header of its own.
    pub const fn tile_bytes(self, nb: usize) -> usize {
        if self.is_compact() {
            64 * nb.div_ceil(2) + nb * self.block_bytes()
        } else {
            nb * self.block_bytes()
        }
    }

    /// Offset in a tile of block `b`'s 16 row scales (f32, or f16 for the compact kinds); for
    /// the K-quants, of its super-block.
    #[inline(always)]
    pub const fn scales_at(self, b: usize) -> usize {
        if self.is_compact() {
            (b / 2) * (64 + 2 * self.block_bytes()) + 32 * (b % 2)
        } else {
            b * self.block_bytes()
        }
    }

    /// Offset in a tile of block `b`'s quants (64-byte aligned); for the K-quants, of its
    /// super-block.
    #[inline(always)]
    pub const fn payload_at(self, b: usize) -> usize {
        if self.is_compact() {
            (b / 2) * (64 + 2 * self.block_bytes()) + 64 + (b % 2) * self.block_bytes()
        } else if self.is_k() {
            b * self.block_bytes()
        } else {
            b * self.block_bytes() + 64
        }
    }

    /// Row `j`'s scale of block `b` in `tile` (32-block kinds).
    fn scale(self, tile: &[u8], b: usize, j: usize) -> f32 {
        let o = self.scales_at(b);
        if self.is_compact() || self.has_min() {
            quant::f16_at(tile, o + 2 * j)
        } else {
            f32_at(tile, o + 4 * j)
        }
    }

    /// Row `j`'s min of block `b` in a [`Self::Q41`] or [`Self::Q51`] tile.
    fn min(self, tile: &[u8], b: usize, j: usize) -> f32 {
        debug_assert!(self.has_min());
        quant::f16_at(tile, self.scales_at(b) + 32 + 2 * j)
    }

    /// The offset added to the signed quants to make them unsigned.
    pub const fn zp(self) -> i32 {
        match self {
            Self::Q8 | Self::Q8H => 128,
            Self::Q5 => 16,
            Self::Q4 => 8,
            Self::Q41 | Self::Q51 | Self::K2 | Self::K4 | Self::K5 => 0,
            Self::K6 => 32,
            Self::I4 | Self::X4 => 128,
            Self::K3 => 4,
        }
    }

    /// Whether activations are `BlockQ8K` (K-quants) rather than `BlockQ8`.
    pub const fn is_k(self) -> bool {
        matches!(self, Self::K2 | Self::K3 | Self::K4 | Self::K5 | Self::K6 | Self::X4)
    }

    /// Whether a 32-element kind has per-block mins (`w = d·q + m`: Q4_1, Q5_1), stored with
    /// its f16 scales in the block's 64-byte header.
    pub const fn has_min(self) -> bool {
        matches!(self, Self::Q41 | Self::Q51)
    }

    /// Whether a 32-element kind has Q5_0's fifth bits (Q5_0, Q5_1).
    pub const fn has_fifth_bits(self) -> bool {
        matches!(self, Self::Q5 | Self::Q51)
    }

    /// Whether this is a K-quant with a `dmin` and sub-block mins (`w = d·sc·q − dmin·m`:
    /// Q2_K, Q4_K, Q5_K).
    pub const fn has_dmin(self) -> bool {
        matches!(self, Self::K2 | Self::K4 | Self::K5)
    }
}

// Offsets inside a K-quant super-block of a tile (see `pack_tile`).
pub(crate) const K4_DMIN: usize = 64;
pub(crate) const K4_SC: usize = 128;
pub(crate) const K4_MIN: usize = 256;
pub(crate) const K4_QS: usize = 512;
pub(crate) const K6_SC: usize = 64;
pub(crate) const K6_PAIRS: usize = 320;
pub(crate) const K6_QS: usize = 832;
/// Where every kind with a `dmin` ([`PackKind::has_dmin`]) keeps it.
pub(crate) const K2_DMIN: usize = K4_DMIN;
pub(crate) const K2_SC: usize = 128;
pub(crate) const K2_QS: usize = 384;
pub(crate) const K3_SC: usize = 64;
pub(crate) const K3_LO: usize = 320;
pub(crate) const K3_HI: usize = 1344;
pub(crate) const X4_SC: usize = 64;
pub(crate) const X4_QS: usize = 192;

/// A weight packed into tiles (tile `i` holds rows `16i..16i+16`, the last one zero-padded).
pub struct Packed {
    pub kind: PackKind,
    pub rows: usize,
    /// Blocks (super-blocks for the K-quants) per row.
    pub nb: usize,
    /// The tiles, on huge pages where the OS grants them (decode streams them every token).
    buf: HugeBuf,
}

impl Packed {
    pub fn tiles(&self) -> usize {
        self.rows.div_ceil(TILE_ROWS)
    }

    /// The rows tile `t` holds (16, fewer in a last partial tile).
    pub fn tile_rows(&self, t: usize) -> usize {
        (self.rows - t * TILE_ROWS).min(TILE_ROWS)
    }

    pub fn tile_bytes(&self) -> usize {
        self.kind.tile_bytes(self.nb)
    }

    /// The bytes of tile `i`.
    pub fn tile(&self, i: usize) -> &[u8] {
        let tb = self.tile_bytes();
        &self.bytes()[i * tb..(i + 1) * tb]
    }

    /// All tiles, in order.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Packs `rows × nb` blocks of `ty` (`data`, ggml rows) on `pool`. `None` for types
    /// without a packed format.
    pub fn new(pool: &ThreadPool, ty: GgmlType, data: &[u8], rows: usize, nb: usize) -> Option<Self> {
        Self::new_releasing(pool, ty, data, rows, nb, &|_, _| {})
    }

    /// [`Packed::new`] in chunks of about 8 MB of `data`, calling `done(offset, len)` with each
    /// chunk's byte range of `data` once it is packed, so a caller can let a file's pages go
    /// while the packed copy grows (peak memory: the copy plus one chunk, not both whole).
    pub fn new_releasing(pool: &ThreadPool, ty: GgmlType, data: &[u8], rows: usize, nb: usize, done: &dyn Fn(usize, usize)) -> Option<Self> {
        Self::new_as(pool, PackKind::for_type(ty)?, ty, data, rows, nb, done)
    }

    /// [`Packed::new_releasing`] into the tile format `kind` (that of `ty` or its
    /// [compact](PackKind::compact) one); `None` also if the weight does not fit `kind` (see
    /// [`pack_tile`]).
    pub fn new_as(pool: &ThreadPool, kind: PackKind, ty: GgmlType, data: &[u8], rows: usize, nb: usize, done: &dyn Fn(usize, usize)) -> Option<Self> {
        let rs = nb * ty.type_size();
        assert!(data.len() >= rows * rs, "Packed::new: {} bytes for {rows} rows of {rs}", data.len());
        let tiles = rows.div_ceil(TILE_ROWS);
        let tb = kind.tile_bytes(nb);
        let mut buf = HugeBuf::new(tiles * tb);
        let base = SharedMut(buf.as_mut_ptr());
        let chunk = ((8 << 20) / (TILE_ROWS * rs).max(1)).max(1);
        let mut t0 = 0;
        let fits = std::sync::atomic::AtomicBool::new(true);
        while t0 < tiles {
            let t1 = (t0 + chunk).min(tiles);
            let n = t1 - t0;
            let tasks = (pool.threads() * 4).min(n);
            pool.for_each(tasks, &|i| {
                for t in (t0 + i * n / tasks)..(t0 + (i + 1) * n / tasks) {
                    let (r0, r1) = (t * TILE_ROWS, ((t + 1) * TILE_ROWS).min(rows));
                    // SAFETY: tile `t` is written by exactly one task.
                    let out = unsafe { std::slice::from_raw_parts_mut(base.ptr().add(t * tb), tb) };
                    if !pack_tile(kind, ty, &data[r0 * rs..r1 * rs], r1 - r0, nb, out) {
                        fits.store(false, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
            if !fits.load(std::sync::atomic::Ordering::Relaxed) {
                return None;
            }
            let (r0, r1) = (t0 * TILE_ROWS, (t1 * TILE_ROWS).min(rows));
            done(r0 * rs, (r1 - r0) * rs);
            t0 = t1;
        }
        Some(Self { kind, rows, nb, buf })
    }
}

impl Packed {
    /// The screening copy of an LM head packed compact ([`PackKind::Q8H`]) for exact greedy
    /// decoding (`matmul::head_argmax`): standard [`PackKind::Q5`] tiles whose quants are the
    /// top five bits of each Q8_0 quant and whose scales are 8·|d| (f32, exact), so the Q5_0
    /// product of a row is the Q8_0 one without the low three bits of every quant. Both layouts
    /// hold a row's four quants of group `g` at the same lane of a 64-byte vector, so the copy
    /// is made byte by byte from the tiles in memory.
    ///
    /// A block with a negative scale is stored negated (`q' = sign(d)·q`, `d' = |d|`: the same
    /// products), so every screening scale is ≥ 0 and the low bits `q' − 8·(q' >> 3)` lie in
    /// 0..=7 with a positive weight (Q8H has no quant −128). `None` for other kinds and for a
    /// scale that is not finite.
    pub fn screen_of(pool: &ThreadPool, head: &Packed) -> Option<Self> {
        if head.kind != PackKind::Q8H {
            return None;
        }
        let (kind, nb, tiles) = (PackKind::Q5, head.nb, head.tiles());
        let (tb, bb) = (kind.tile_bytes(nb), kind.block_bytes());
        let mut buf = HugeBuf::new(tiles * tb);
        let base = SharedMut(buf.as_mut_ptr());
        let fits = std::sync::atomic::AtomicBool::new(true);
        let tasks = (pool.threads() * 4).min(tiles).max(1);
        pool.for_each(tasks, &|i| {
            for t in (i * tiles / tasks)..((i + 1) * tiles / tasks) {
                let src = head.tile(t);
                // SAFETY: tile `t` is written by exactly one task.
                let out = unsafe { std::slice::from_raw_parts_mut(base.ptr().add(t * tb), tb) };
                for b in 0..nb {
                    let (sc, pl, ob) = (head.kind.scales_at(b), head.kind.payload_at(b), b * bb);
                    let mut neg = [false; TILE_ROWS];
                    for (j, neg) in neg.iter_mut().enumerate() {
                        let d = quant::f16_at(src, sc + 2 * j);
                        if !d.is_finite() {
                            fits.store(false, std::sync::atomic::Ordering::Relaxed);
                            return;
                        }
                        *neg = d.is_sign_negative();
                        out[ob + 4 * j..ob + 4 * j + 4].copy_from_slice(&(8.0 * d.abs()).to_le_bytes());
                    }
                    // u = (q' >> 3) + 16 in 0..=31 per group vector byte (row k / 4).
                    let mut u = [[0u8; 64]; 8];
                    for (g, u) in u.iter_mut().enumerate() {
                        for (k, u) in u.iter_mut().enumerate() {
                            let q = src[pl + 64 * g + k] as i8;
                            let q = if neg[k / 4] { q.wrapping_neg() } else { q };
                            *u = ((q >> 3) + 16) as u8;
                        }
                    }
                    // Q5: groups 2i and 2i + 1 in the low and high nibbles of vector i, the fifth
                    // bits of group g at bit g of a lane byte.
                    let payload = &mut out[ob + 64..ob + bb];
                    for i in 0..4 {
                        for k in 0..64 {
                            payload[64 * i + k] = (u[2 * i][k] & 0x0F) | (u[2 * i + 1][k] << 4);
                        }
                    }
                    for k in 0..64 {
                        payload[256 + k] = (0..8).fold(0u8, |h, g| h | ((u[g][k] >> 4) << g));
                    }
                }
            }
        });
        fits.load(std::sync::atomic::Ordering::Relaxed).then_some(Self { kind, rows: head.rows, nb, buf })
    }
}

/// Writes `nrows ≤ 16` rows (`src`, `nb` blocks of `ty` each) as one tile into `out`
/// (`kind.tile_bytes(nb)` bytes); missing rows get zero scales. Returns false if the rows do
/// not fit `kind` (a quant −128 for [`PackKind::Q8H`]; the tile is then not usable).
///
/// K-quant super-blocks (row `r` of the tile is lane `r`; "lane word" = 4 bytes at `4r`):
/// - Q4_K: `d` f32 lane words at 0, `dmin` at [`K4_DMIN`]; the 8 sub-block scales as bytes
///   (`K4_SC + 16j + r`); the 8 mins as i16 pairs (sub-blocks `2p`, `2p+1`) in lane words at
///   `K4_MIN + 64p`, for `vpdpwssd` with the activations' 32-element sums; the 4-bit quants of
///   sub-block `j` at `K4_QS + 256j` in the Q4_0 tile layout.
/// - Q2_K (quants 0..=3, 16 sub-blocks of 16): `d` at 0, `dmin` at `K2_DMIN`; the file's
///   scale/min byte of each sub-block (scale in the low nibble, min in the high one) at
///   `K2_SC + 16j + r`; the quants of sub-block `j` as one 2-bit plane at `K2_QS + 64j`, group
///   `g` at bits `2g..2g+2` of the lane bytes: 88 bytes per super-block and row (84 in the file).
/// - Q3_K (`u = q + 4` in 0..=7, 16 sub-blocks of 16 elements = 4 groups): `d` at 0; the 16
///   sub-block scales minus 32 as i8 (`K3_SC + 16j + r`); the low two bits of sub-block `j` in
///   one vector at `K3_LO + 64j`, group `g` at bits `2g..2g+2` of the lane bytes; the high bits
///   of sub-blocks `2i` and `2i + 1` in one vector at `K3_HI + 64i`, group `g` of sub-block `j`
///   at bit `4·(j % 2) + g`: 116 bytes per super-block and row (110 in the file).
/// - IQ4_XS: `d` at 0; the 8 sub-block scales minus 32 as i8 (`X4_SC + 16j + r`); the indices
///   of sub-block `j` at `X4_QS + 256j` in the Q4_0 tile layout.
/// - Q5_K: as Q4_K, with the 5-bit quants of sub-block `j` at `K4_QS + 320j` in the Q5_0 tile
///   layout (four nibble vectors, then the fifth bits).
/// - Q6_K: `d` at 0; the 16 sub-block scales as i8 (`K6_SC + 16j + r`) and again as i16 pairs
///   at `K6_PAIRS + 64p` (for the `−32` correction with the 16-element sums); the unsigned
///   6-bit quants (`q + 32`) as bytes, sub-block `j` (16 elements = 4 groups) at
///   `K6_QS + 256j`, group `g` at `+ 64g`, lane bytes `4r..4r+4`.
pub fn pack_tile(kind: PackKind, ty: GgmlType, src: &[u8], nrows: usize, nb: usize, out: &mut [u8]) -> bool {
    let (ts, bb) = (ty.type_size(), kind.block_bytes());
    assert!(nrows <= TILE_ROWS && out.len() >= kind.tile_bytes(nb) && src.len() >= nrows * nb * ts);
    assert_eq!(PackKind::for_type(ty).map(PackKind::compact), Some(kind.compact()), "pack_tile: {} weights into {kind:?} tiles", ty.name());
    if kind.is_k() {
        out[..nb * bb].fill(0);
        for b in 0..nb {
            let ob = &mut out[b * bb..(b + 1) * bb];
            for r in 0..nrows {
                let blk = &src[(r * nb + b) * ts..(r * nb + b + 1) * ts];
                match kind {
                    PackKind::K4 => pack_k4(blk, r, ob),
                    PackKind::K5 => pack_k5(blk, r, ob),
                    PackKind::X4 => pack_x4(blk, r, ob),
                    PackKind::K3 => pack_k3(blk, r, ob),
                    PackKind::K2 => pack_k2(blk, r, ob),
                    _ => pack_k6(blk, r, ob),
                }
            }
        }
        return true;
    }
    let mut fits = true;
    let rd = |p: &[u8], o: usize| u32::from_le_bytes([p[o], p[o + 1], p[o + 2], p[o + 3]]);
    out[..kind.tile_bytes(nb)].fill(0);
    for b in 0..nb {
        let sc = kind.scales_at(b);
        for j in 0..nrows {
            let blk = &src[(j * nb + b) * ts..(j * nb + b + 1) * ts];
            if kind.is_compact() {
                // The file's f16 scale, as it is.
                out[sc + 2 * j..sc + 2 * j + 2].copy_from_slice(&blk[..2]);
            } else if kind.has_min() {
                // The file's f16 `d` and `m`, as they are.
                out[sc + 2 * j..sc + 2 * j + 2].copy_from_slice(&blk[..2]);
                out[sc + 32 + 2 * j..sc + 34 + 2 * j].copy_from_slice(&blk[2..4]);
            } else {
                out[sc + 4 * j..sc + 4 * j + 4].copy_from_slice(&quant::f16_at(blk, 0).to_le_bytes());
            }
        }
        // The block's quants (after its scales in the standard layout).
        let qb = if kind.is_compact() { bb } else { bb - 64 };
        let payload = &mut out[kind.payload_at(b)..kind.payload_at(b) + qb];
        for j in 0..nrows {
            let blk = &src[(j * nb + b) * ts..(j * nb + b + 1) * ts];
            let lane = 4 * j;
            match kind {
                PackKind::Q8 => {
                    for g in 0..QK / 4 {
                        let w = rd(blk, 2 + 4 * g) ^ 0x8080_8080;
                        payload[g * 64 + lane..g * 64 + lane + 4].copy_from_slice(&w.to_le_bytes());
                    }
                }
                PackKind::Q8H => {
                    fits &= !blk[2..ts].contains(&0x80);
                    for g in 0..QK / 4 {
                        payload[g * 64 + lane..g * 64 + lane + 4].copy_from_slice(&blk[2 + 4 * g..6 + 4 * g]);
                    }
                }
                PackKind::Q5 | PackKind::Q4 | PackKind::Q41 | PackKind::Q51 | PackKind::I4 => {
                    // The file's nibbles are already `q + zp` (IQ4_NL: the table indices).
                    let qh = kind.has_fifth_bits().then(|| rd(blk, if kind.has_min() { 4 } else { 2 }));
                    put_q45(payload, lane, &blk[ts - 16..], qh);
                }
                PackKind::K2 | PackKind::K3 | PackKind::K4 | PackKind::K5 | PackKind::K6 | PackKind::X4 => unreachable!(),
            }
        }
    }
    fits
}

/// One row's lane bytes (`lane = 4·row`) of a Q4_0 tile block, or with `qh` a Q5_0 one, into
/// `payload` (the block's quants, zeroed): from the 16 nibble bytes `qs` as ggml stores them
/// (element `e < 16` the low nibble of byte `e`, `e ≥ 16` the high nibble of byte `e − 16`),
/// vector `h` holds elements `8h..8h+4` in its low nibbles and `8h+4..8h+8` in its high ones;
/// the fifth bits (element `e` at bit `e` of `qh`) go to bit `g` of the lane bytes `256 + lane`
/// for group `g` (one byte per lane holds its eight fifth bits).
fn put_q45(payload: &mut [u8], lane: usize, qs: &[u8], qh: Option<u32>) {
    for h in 0..4 {
        let x = u64::from_le_bytes(qs[8 * (h % 2)..8 * (h % 2) + 8].try_into().expect("8 bytes"));
        let n = (x >> (4 * (h / 2))) & 0x0F0F_0F0F_0F0F_0F0F;
        let w = (n as u32) | ((n >> 32) as u32) << 4;
        put(payload, 64 * h + lane, &w.to_le_bytes());
    }
    if let Some(qh) = qh {
        for g in 0..QK / 4 {
            for k in 0..4 {
                payload[256 + lane + k] |= (((qh >> (4 * g + k)) & 1) as u8) << g;
            }
        }
    }
}

/// Row `r` of a Q2_K super-block into the tile super-block `ob`.
fn pack_k2(blk: &[u8], r: usize, ob: &mut [u8]) {
    put(ob, 4 * r, &quant::f16_at(blk, 80).to_le_bytes());
    put(ob, K2_DMIN + 4 * r, &quant::f16_at(blk, 82).to_le_bytes());
    for j in 0..16 {
        ob[K2_SC + 16 * j + r] = blk[j];
        for e in 16 * j..16 * j + 16 {
            let (q, _) = quant::q2_k_at(blk, e);
            ob[K2_QS + 64 * j + 4 * r + e % 4] |= q << (2 * (e % 16 / 4));
        }
    }
}

/// Row `r` of a Q3_K super-block into the tile super-block `ob`.
fn pack_k3(blk: &[u8], r: usize, ob: &mut [u8]) {
    put(ob, 4 * r, &quant::f16_at(blk, 108).to_le_bytes());
    let sc = quant::q3_k_scales(blk);
    for j in 0..16 {
        ob[K3_SC + 16 * j + r] = (sc[j] as i8 - 32) as u8;
        for e in 16 * j..16 * j + 16 {
            let u = (quant::q3_k_at(blk, e) + 4) as u8;
            let (g, k) = (e % 16 / 4, e % 4);
            ob[K3_LO + 64 * j + 4 * r + k] |= (u & 3) << (2 * g);
            ob[K3_HI + 64 * (j / 2) + 4 * r + k] |= (u >> 2) << (4 * (j % 2) + g);
        }
    }
}

/// Row `r` of an IQ4_XS super-block into the tile super-block `ob`.
fn pack_x4(blk: &[u8], r: usize, ob: &mut [u8]) {
    put(ob, 4 * r, &quant::f16_at(blk, 0).to_le_bytes());
    for j in 0..8 {
        ob[X4_SC + 16 * j + r] = (quant::iq4_xs_scale(blk, j) - 32) as i8 as u8;
        put_q45(&mut ob[X4_QS + 256 * j..], 4 * r, &blk[8 + 16 * j..8 + 16 * j + 16], None);
    }
}

fn put(out: &mut [u8], o: usize, bytes: &[u8]) {
    out[o..o + bytes.len()].copy_from_slice(bytes);
}

/// Row `r` of a Q4_K super-block into the tile super-block `ob`.
fn pack_k4(blk: &[u8], r: usize, ob: &mut [u8]) {
    put(ob, 4 * r, &quant::f16_at(blk, 0).to_le_bytes());
    put(ob, K4_DMIN + 4 * r, &quant::f16_at(blk, 2).to_le_bytes());
    let qs = &blk[16..144];
    for j in 0..8 {
        let (sc, m) = quant::get_scale_min_k4(j, &blk[4..16]);
        ob[K4_SC + 16 * j + r] = sc;
        put(ob, K4_MIN + 64 * (j / 2) + 4 * r + 2 * (j % 2), &(m as i16).to_le_bytes());
        // Sub-block j: nibble j % 2 of bytes 32·(j/2) ..; vector h as in the Q4_0 tiles.
        for h in 0..4 {
            let o = 32 * (j / 2) + 8 * h;
            let x = u64::from_le_bytes(qs[o..o + 8].try_into().unwrap());
            let n = (x >> (4 * (j % 2))) & 0x0F0F_0F0F_0F0F_0F0F;
            let w = (n as u32) | ((n >> 32) as u32) << 4;
            put(ob, K4_QS + 256 * j + 64 * h + 4 * r, &w.to_le_bytes());
        }
    }
}

/// Row `r` of a Q5_K super-block into the tile super-block `ob`.
fn pack_k5(blk: &[u8], r: usize, ob: &mut [u8]) {
    put(ob, 4 * r, &quant::f16_at(blk, 0).to_le_bytes());
    put(ob, K4_DMIN + 4 * r, &quant::f16_at(blk, 2).to_le_bytes());
    let (qh, qs) = (&blk[16..48], &blk[48..176]);
    for j in 0..8 {
        let (sc, m) = quant::get_scale_min_k4(j, &blk[4..16]);
        ob[K4_SC + 16 * j + r] = sc;
        put(ob, K4_MIN + 64 * (j / 2) + 4 * r + 2 * (j % 2), &(m as i16).to_le_bytes());
        // Element l of sub-block j: nibble j % 2 of byte 32·(j/2) + l, fifth bit j of qh[l];
        // as a Q5_0 block's nibble bytes and fifth-bit word.
        let nib = |l: usize| (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
        let q5: [u8; 16] = std::array::from_fn(|l| nib(l) | nib(l + 16) << 4);
        let bits = (0..32).fold(0u32, |h, l| h | (((qh[l] >> j) & 1) as u32) << l);
        put_q45(&mut ob[K4_QS + 320 * j..], 4 * r, &q5, Some(bits));
    }
}

/// Row `r` of a Q6_K super-block into the tile super-block `ob`.
fn pack_k6(blk: &[u8], r: usize, ob: &mut [u8]) {
    put(ob, 4 * r, &quant::f16_at(blk, 208).to_le_bytes());
    let u = quant::q6_k_quants(blk);
    for j in 0..16 {
        let sc = blk[192 + j] as i8;
        ob[K6_SC + 16 * j + r] = sc as u8;
        put(ob, K6_PAIRS + 64 * (j / 2) + 4 * r + 2 * (j % 2), &(sc as i16).to_le_bytes());
        for g in 0..4 {
            put(ob, K6_QS + 256 * j + 64 * g + 4 * r, &u[16 * j + 4 * g..16 * j + 4 * g + 4]);
        }
    }
}

/// The unsigned quant of row `j`, element `e` of block `b` of a tile (the packed layout's
/// definition, used by the scalar model).
fn tile_u(kind: PackKind, tile: &[u8], b: usize, j: usize, e: usize) -> i32 {
    let base = &tile[kind.payload_at(b)..];
    match kind {
        // Sub-block e / 32, laid out as a Q4_0 tile block.
        PackKind::K4 => return tile_u(PackKind::Q4, &base[K4_QS + 256 * (e / 32) - PackKind::Q4.payload_at(0)..], 0, j, e % 32),
        PackKind::K5 => return tile_u(PackKind::Q5, &base[K4_QS + 320 * (e / 32) - PackKind::Q5.payload_at(0)..], 0, j, e % 32),
        PackKind::K6 => return base[K6_QS + 256 * (e / 16) + 64 * (e % 16 / 4) + 4 * j + e % 4] as i32,
        PackKind::K2 => return ((base[K2_QS + 64 * (e / 16) + 4 * j + e % 4] >> (2 * (e % 16 / 4))) & 3) as i32,
        PackKind::K3 => {
            // Row j; element e is group g = e % 16 / 4, byte k = e % 4 of sub-block e / 16.
            let (sb, g, k) = (e / 16, e % 16 / 4, e % 4);
            let lo = (base[K3_LO + 64 * sb + 4 * j + k] >> (2 * g)) & 3;
            let hi = (base[K3_HI + 64 * (sb / 2) + 4 * j + k] >> (4 * (sb % 2) + g)) & 1;
            return (lo | hi << 2) as i32;
        }
        PackKind::X4 => return tile_u(PackKind::I4, &base[X4_QS + 256 * (e / 32) - PackKind::I4.payload_at(0)..], 0, j, e % 32),
        _ => {}
    }
    let p = base;
    let (g, k) = (e / 4, e % 4);
    let lane = j * 4 + k;
    match kind {
        PackKind::Q8 => p[g * 64 + lane] as i32,
        PackKind::Q8H => p[g * 64 + lane] as i8 as i32 + 128,
        PackKind::Q5 | PackKind::Q4 | PackKind::Q41 | PackKind::Q51 => {
            let lo = (p[(g / 2) * 64 + lane] >> (4 * (g % 2))) & 0x0F;
            let hi = if kind.has_fifth_bits() { (p[256 + lane] >> g) & 1 } else { 0 };
            (lo | hi << 4) as i32
        }
        // The index as a Q4_0 tile holds it, looked up.
        PackKind::I4 => quant::KVALUES_IQ4NL[tile_u(PackKind::Q4, tile, b, j, e) as usize] as i32 + 128,
        PackKind::K2 | PackKind::K3 | PackKind::K4 | PackKind::K5 | PackKind::K6 | PackKind::X4 => unreachable!(),
    }
}

/// A tile GEMM: for tokens `0..ntok` (activation rows of `nb` blocks, consecutive in `act`)
/// writes the first `nrows` outputs of each token to `y[t·ystride ..]`.
pub type GemmFn = unsafe fn(kind: PackKind, tile: &[u8], nb: usize, act: &[BlockQ8], ntok: usize, y: *mut f32, ystride: usize, nrows: usize);

/// A greedy screening kernel (see `arch::x86::avx2_gemm::emulated::screen`): one token over
/// one tile of a screening copy ([`Packed::screen_of`]), writing `nrows` lower and upper
/// bounds of the rows' exact products.
pub type ScreenFn = unsafe fn(tile: &[u8], nb: usize, act: &[BlockQ8], c: &[[f32; 3]], e: f32, lower: *mut f32, upper: *mut f32, nrows: usize);

/// Scalar model of the SIMD tile GEMM (same operations in the same order).
///
/// # Safety
/// `y` must be valid for writes of `y[t·ystride + j]`, `t < ntok`, `j < nrows`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_ref(kind: PackKind, tile: &[u8], nb: usize, act: &[BlockQ8], ntok: usize, y: *mut f32, ystride: usize, nrows: usize) {
    assert!(!kind.is_k() && tile.len() >= kind.tile_bytes(nb) && act.len() >= ntok * nb && nrows <= TILE_ROWS);
    for t in 0..ntok {
        let mut acc = [0f32; TILE_ROWS];
        for (b, ab) in act[t * nb..(t + 1) * nb].iter().enumerate() {
            for (j, acc) in acc.iter_mut().enumerate() {
                let mut s = -kind.zp() * ab.qsum;
                for (e, &q) in ab.qs.iter().enumerate() {
                    s += tile_u(kind, tile, b, j, e) * q as i32;
                }
                *acc = (kind.scale(tile, b, j) * ab.d).mul_add(s as f32, *acc);
                if kind.has_min() {
                    *acc = kind.min(tile, b, j).mul_add(ab.s, *acc);
                }
            }
        }
        for (j, v) in acc.iter().take(nrows).enumerate() {
            *y.add(t * ystride + j) = *v;
        }
    }
}

/// A K-quant tile GEMM (activations [`BlockQ8K`], `nb` super-blocks per row); otherwise as
/// [`GemmFn`].
pub type GemmKFn = unsafe fn(kind: PackKind, tile: &[u8], nb: usize, act: &[BlockQ8K], ntok: usize, y: *mut f32, ystride: usize, nrows: usize);

fn f32_at(p: &[u8], o: usize) -> f32 {
    f32::from_le_bytes([p[o], p[o + 1], p[o + 2], p[o + 3]])
}

fn i16_at(p: &[u8], o: usize) -> i32 {
    i16::from_le_bytes([p[o], p[o + 1]]) as i32
}

/// Scalar model of the SIMD K-quant tile GEMM (same operations in the same order): per
/// super-block, `Σ_j sc_j · Σ u·a` in integers; Q4_K and Q5_K add `− dmin·d_a·Σ_j m_j·Σa_j`, Q6_K
/// subtracts `32 · Σ_j sc_j · Σa_j` in integers; Q2_K adds `− dmin·d_a·Σ_j m_j·Σa_j` (16-element
/// sub-blocks); IQ4_XS and Q3_K take `zp·Σa_j` off each
/// sub-block's sum before its scale.
///
/// # Safety
/// As [`gemm_ref`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_k_ref(kind: PackKind, tile: &[u8], nb: usize, act: &[BlockQ8K], ntok: usize, y: *mut f32, ystride: usize, nrows: usize) {
    let bb = kind.block_bytes();
    assert!(kind.is_k() && tile.len() >= nb * bb && act.len() >= ntok * nb && nrows <= TILE_ROWS);
    let sub = if matches!(kind, PackKind::K6 | PackKind::K3 | PackKind::K2) { 16 } else { 32 };
    let bs = |ab: &BlockQ8K, i: usize| ab.bsums[i] as i32;
    for t in 0..ntok {
        let mut acc = [0f32; TILE_ROWS];
        for (b, ab) in act[t * nb..(t + 1) * nb].iter().enumerate() {
            let base = &tile[b * bb..];
            for (r, acc) in acc.iter_mut().enumerate() {
                let mut isum = 0i32;
                for j in 0..QK_K / sub {
                    let mut s = 0i32;
                    for e in sub * j..sub * (j + 1) {
                        s += tile_u(kind, tile, b, r, e) * ab.qs[e] as i32;
                    }
                    let sc = match kind {
                        PackKind::X4 => {
                            s -= 128 * (bs(ab, 2 * j) + bs(ab, 2 * j + 1));
                            base[X4_SC + 16 * j + r] as i8 as i32
                        }
                        PackKind::K2 => (base[K2_SC + 16 * j + r] & 0x0F) as i32,
                        PackKind::K3 => {
                            s -= 4 * bs(ab, j);
                            base[K3_SC + 16 * j + r] as i8 as i32
                        }
                        PackKind::K6 => base[K6_SC + 16 * j + r] as i8 as i32,
                        _ => base[K4_SC + 16 * j + r] as i32,
                    };
                    isum = isum.wrapping_add(s.wrapping_mul(sc));
                }
                let bs = |i: usize| bs(ab, i);
                // The min terms (Q6_K: the `−32` offset's `Σ_j sc_j·Σa_j`).
                let msum: i32 = match kind {
                    PackKind::K2 => (0..16).map(|j| (base[K2_SC + 16 * j + r] >> 4) as i32 * bs(j)).sum(),
                    PackKind::K4 | PackKind::K5 => {
                        (0..8).map(|j| i16_at(base, K4_MIN + 64 * (j / 2) + 4 * r + 2 * (j % 2)) * (bs(2 * j) + bs(2 * j + 1))).sum()
                    }
                    PackKind::K6 => (0..16).map(|j| i16_at(base, K6_PAIRS + 64 * (j / 2) + 4 * r + 2 * (j % 2)) * bs(j)).sum(),
                    _ => 0,
                };
                let s = if kind == PackKind::K6 { isum.wrapping_sub(msum << 5) } else { isum };
                *acc = (f32_at(base, 4 * r) * ab.d).mul_add(s as f32, *acc);
                if kind.has_dmin() {
                    *acc = (-(f32_at(base, K2_DMIN + 4 * r) * ab.d)).mul_add(msum as f32, *acc);
                }
            }
        }
        for (j, v) in acc.iter().take(nrows).enumerate() {
            *y.add(t * ystride + j) = *v;
        }
    }
}
