//! x86-64: AVX2/FMA/F16C dot products (`avx2`), the AVX-512 VNNI Q8_0 dot (`vnni`), the AVX-512
//! tile GEMM (`avx512`), the AVX2 tile GEMM (`avx2_gemm`, with or without AVX-VNNI) and the f32
//! vector ops and attention kernels (`vec`); [`prefetch_ahead`], which both tile GEMMs' one-token
//! kernels call.

use crate::backend::cpu::gemm::PackKind;

// The tile kinds as const-generic numbers of the tile kernels (`avx512`, `avx2_gemm`).
pub(crate) const Q8: u8 = 0;
pub(crate) const Q5: u8 = 1;
pub(crate) const Q4: u8 = 2;
pub(crate) const K4: u8 = 3;
pub(crate) const K6: u8 = 4;
pub(crate) const Q41: u8 = 5;
pub(crate) const K5: u8 = 6;
pub(crate) const Q51: u8 = 7;
pub(crate) const I4: u8 = 8;
pub(crate) const X4: u8 = 9;
pub(crate) const K3: u8 = 10;
pub(crate) const K2: u8 = 11;

/// IQ4_NL's values (`vpshufb` tables): signed, and plus 128 (for `vpdpbusd`).
pub(crate) static IQ4_S: [i8; 16] = crate::backend::cpu::quant::KVALUES_IQ4NL;
pub(crate) static IQ4_U: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (IQ4_S[i] as i16 + 128) as u8;
        i += 1;
    }
    t
};

/// The tile kind of a kernel's const-generic kind number.
pub(crate) const fn kind_of(k: u8) -> PackKind {
    match k {
        Q8 => PackKind::Q8,
        Q5 => PackKind::Q5,
        Q4 => PackKind::Q4,
        K4 => PackKind::K4,
        K5 => PackKind::K5,
        Q41 => PackKind::Q41,
        Q51 => PackKind::Q51,
        I4 => PackKind::I4,
        X4 => PackKind::X4,
        K3 => PackKind::K3,
        K2 => PackKind::K2,
        _ => PackKind::K6,
    }
}

pub mod avx2;
pub mod avx2_gemm;
pub mod avx512;
pub mod vec;
pub mod vnni;

/// How far ahead of the block being multiplied the one-token (decode) tile kernels prefetch the
/// tile: 8 KiB, the lines of the block that lies that far on, each block's as it starts (a
/// K-quant super-block's spread over its sub-blocks: [`prefetch_ahead_part`]).
///
/// The hardware prefetchers alone fell well short of the streaming rate here. With AVX2 on one
/// thread (an AMD EPYC with AVX-512 and AVX-VNNI, `examples/decode_bw`, both variants in
/// alternating fresh processes) Q5_0 tiles went from ~30 to ~39 GB/s, Q4_K from 17 to 33 (with
/// the halves read side by side in `avx2_gemm`'s K-quant kernel) and Q6_K from 21 to 33.
/// Prefetching 2 or 4 KiB ahead gained less, 16 and 32 KiB no more. Decode, old against new binary (`examples/forward`,
/// 512-token prompt, 128 tokens, 4 alternating pairs, medians): AVX2 1.17× at 1 thread and 1.12×
/// at 2, AVX2 + AVX-VNNI 1.18× and 1.09×, AVX-512 1.08× and 1.07×.
pub(crate) const PREFETCH_AHEAD: usize = 8192;

/// Prefetches into L1 the lines of the block [`PREFETCH_AHEAD`] bytes past block `b` of a
/// tile of `kind`, counted from where block `b` starts (its pair header first for the compact
/// kinds, for an even `b`). Past the tile's end this reaches into the next tile (the next one a
/// thread takes, as a rule) or past the weight's end: a prefetch never faults, and the address
/// is only computed (`wrapping_add`), never dereferenced.
#[inline(always)]
pub(crate) unsafe fn prefetch_ahead(tile: *const u8, kind: PackKind, b: usize) {
    if kind.is_compact() {
        let header = if b.is_multiple_of(2) { 64 } else { 0 };
        prefetch_lines(tile.wrapping_add(kind.payload_at(b) - header + PREFETCH_AHEAD), 0..(kind.block_bytes() + header).div_ceil(64));
    } else {
        prefetch_ahead_part(tile, kind, b, 0, 1);
    }
}

/// Prefetches lines `lines` (64 bytes each) from `p` into L1.
#[inline(always)]
unsafe fn prefetch_lines(p: *const u8, lines: std::ops::Range<usize>) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    for l in lines {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * l) as *const i8);
    }
}

/// Part `part` of `parts` of the lines [`prefetch_ahead`] would prefetch for block `b` of a
/// standard (not compact) kind: the K-quant kernels spread a super-block's 2.5–4.8 KiB (40–77
/// lines) over its 8 or 16 sub-blocks. Issued at once, as for the 6–9 lines of a 32-block,
/// the burst left the tile stream at about half the DRAM rate (one token, 1 thread, the EPYC
/// above, `examples/decode_bw`, alternating binaries): Q6_K 640×2048 70 → 40 µs on the AVX2
/// path and 49 → 39 µs on AVX-512, Q4_K 640×2048 26 → 21 and 25 → 20.5 µs, layer weights 2.34 →
/// 2.0 ms (AVX2) and 2.16 → 1.99 ms (AVX-512) per token; decode (`examples/forward`, 512-token
/// prompt, 4 alternating pairs) 1.05× on AVX2, 1.03× with AVX-VNNI, 1.04× on AVX-512.
#[inline(always)]
pub(crate) unsafe fn prefetch_ahead_part(tile: *const u8, kind: PackKind, b: usize, part: usize, parts: usize) {
    debug_assert!(!kind.is_compact(), "prefetch_ahead_part: {kind:?} is a compact kind");
    let lines = kind.block_bytes().div_ceil(64);
    prefetch_lines(tile.wrapping_add(kind.scales_at(b) + PREFETCH_AHEAD), part * lines / parts..(part + 1) * lines / parts);
}
