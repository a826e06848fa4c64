//! AVX-512 (F, BW, VNNI) prefill GEMM on packed row tiles; the layout and the arithmetic are
//! described in `gemm`. Chosen at run time by `dispatch::gemm_kernel`.
//!
//! Safety contract: the CPU supports AVX512F, AVX512BW, AVX512VNNI and FMA.

#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

use crate::backend::cpu::gemm::{self, PackKind, TILE_ROWS};
use crate::backend::cpu::quant::{BlockQ8, BlockQ8K};

use super::{kind_of, I4, IQ4_U, K2, K3, K4, K5, K6, Q4, Q41, Q5, Q51, Q8, X4};

/// Tile GEMM (see `gemm::GemmFn`).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm(kind: PackKind, tile: &[u8], nb: usize, act: &[BlockQ8], ntok: usize, y: *mut f32, ystride: usize, nrows: usize) {
    let (eight, four, one): (Tokens<BlockQ8>, Tokens<BlockQ8>, Tokens<BlockQ8>) = match kind {
        PackKind::Q8 => (tokens::<Q8, false, 8>, tokens::<Q8, false, 4>, tokens::<Q8, false, 1>),
        PackKind::Q8H => (tokens::<Q8, true, 8>, tokens::<Q8, true, 4>, tokens::<Q8, true, 1>),
        PackKind::Q5 => (tokens::<Q5, false, 8>, tokens::<Q5, false, 4>, tokens::<Q5, false, 1>),
        PackKind::Q4 => (tokens::<Q4, false, 8>, tokens::<Q4, false, 4>, tokens::<Q4, false, 1>),
        PackKind::Q41 => (tokens::<Q41, false, 8>, tokens::<Q41, false, 4>, tokens::<Q41, false, 1>),
        PackKind::Q51 => (tokens::<Q51, false, 8>, tokens::<Q51, false, 4>, tokens::<Q51, false, 1>),
        PackKind::I4 => (tokens::<I4, false, 8>, tokens::<I4, false, 4>, tokens::<I4, false, 1>),
        PackKind::K2 | PackKind::K3 | PackKind::K4 | PackKind::K5 | PackKind::K6 | PackKind::X4 => panic!("gemm: {kind:?} tiles take gemm_k"),
    };
    groups(Some(eight), four, one, kind, tile, nb, act, ntok, y, ystride, nrows)
}

/// Some consecutive tokens over all blocks of a tile: `(tile, nb, their activations, their
/// first output, ystride, store mask)`.
type Tokens<A> = unsafe fn(*const u8, usize, *const A, *mut f32, usize, __mmask16);

/// Checks the lengths, then runs `eight` (when given) on the tokens eight at a time, `four` on
/// the rest four at a time and `one` on the rest. Each token's sums run in the same order
/// whichever group it falls in, so its result does not depend on how many tokens share the pass.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn groups<A>(
    eight: Option<Tokens<A>>,
    four: Tokens<A>,
    one: Tokens<A>,
    kind: PackKind,
    tile: &[u8],
    nb: usize,
    act: &[A],
    ntok: usize,
    y: *mut f32,
    ystride: usize,
    nrows: usize,
) {
    assert!(tile.len() >= kind.tile_bytes(nb) && act.len() >= ntok * nb && nrows <= TILE_ROWS);
    let mask: __mmask16 = if nrows == TILE_ROWS { 0xFFFF } else { (1u16 << nrows) - 1 };
    let (p, a) = (tile.as_ptr(), act.as_ptr());
    let mut t = 0;
    if let Some(eight) = eight {
        while t + 8 <= ntok {
            eight(p, nb, a.add(t * nb), y.add(t * ystride), ystride, mask);
            t += 8;
        }
    }
    while t + 4 <= ntok {
        four(p, nb, a.add(t * nb), y.add(t * ystride), ystride, mask);
        t += 4;
    }
    while t < ntok {
        one(p, nb, a.add(t * nb), y.add(t * ystride), ystride, mask);
        t += 1;
    }
}

/// The eight unsigned group vectors of block `p` (its quants; `C`: compact Q8H tiles, whose
/// signed quants get their sign bit flipped to make `q + 128`; IQ4: the indices' table values
/// plus 128).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
#[inline]
unsafe fn weights<const K: u8, const C: bool>(p: *const u8) -> [__m512i; 8] {
    let ld = |o: usize| _mm512_load_si512(p.add(o) as *const _);
    if K == Q8 {
        let w = [ld(0), ld(64), ld(128), ld(192), ld(256), ld(320), ld(384), ld(448)];
        return if C { w.map(|v| _mm512_xor_si512(v, _mm512_set1_epi8(0x80u8 as i8))) } else { w };
    }
    let m = _mm512_set1_epi8(0x0F);
    let mut w = [_mm512_setzero_si512(); 8];
    for h in 0..4 {
        let v = ld(64 * h);
        w[2 * h] = _mm512_and_si512(v, m);
        w[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m);
    }
    if K == I4 {
        let table = _mm512_broadcast_i32x4(_mm_loadu_si128(IQ4_U.as_ptr() as *const __m128i));
        for w in w.iter_mut() {
            *w = _mm512_shuffle_epi8(table, *w);
        }
    }
    if K == Q5 || K == Q51 {
        // One byte of fifth bits per lane, bit g for group g.
        let hb = ld(256);
        let sixteen = _mm512_set1_epi8(0x10);
        for (g, w) in w.iter_mut().enumerate() {
            let k = _mm512_test_epi8_mask(hb, _mm512_set1_epi8(1 << g));
            *w = _mm512_mask_add_epi8(*w, k, *w, sixteen);
        }
    }
    w
}

/// `init` plus one token's products of a 32-element block (`w` from [`weights`], `q` its 32
/// activation bytes as `*const i32`), in two chains of four `vpdpbusd` (even and odd groups).
/// A macro, so the kernels compile exactly as with the chain written out in each (an
/// `#[inline]` helper leaves that to the inliner).
macro_rules! block_sum {
    ($init:expr, $w:expr, $q:expr) => {{
        let (w, q): (&[__m512i; 8], *const i32) = ($w, $q);
        let x = |g: usize| _mm512_set1_epi32(q.add(g).read_unaligned());
        let mut e = _mm512_dpbusd_epi32($init, w[0], x(0));
        let mut o = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], x(1));
        e = _mm512_dpbusd_epi32(e, w[2], x(2));
        o = _mm512_dpbusd_epi32(o, w[3], x(3));
        e = _mm512_dpbusd_epi32(e, w[4], x(4));
        o = _mm512_dpbusd_epi32(o, w[5], x(5));
        e = _mm512_dpbusd_epi32(e, w[6], x(6));
        o = _mm512_dpbusd_epi32(o, w[7], x(7));
        _mm512_add_epi32(e, o)
    }};
}

/// [`block_sum`] for a 16-element sub-block (`w`: its four group vectors).
macro_rules! sub_sum {
    ($init:expr, $w:expr, $q:expr) => {{
        let (w, q): (&[__m512i; 4], *const i32) = ($w, $q);
        let x = |g: usize| _mm512_set1_epi32(q.add(g).read_unaligned());
        let e = _mm512_dpbusd_epi32($init, w[0], x(0));
        let o = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], x(1));
        let e = _mm512_dpbusd_epi32(e, w[2], x(2));
        let o = _mm512_dpbusd_epi32(o, w[3], x(3));
        _mm512_add_epi32(e, o)
    }};
}

/// `T` consecutive tokens over all blocks of the tile (`C`: the compact layout, f16 scales in
/// pair headers; Q4_1, Q5_1: f16 scales and mins in each block's header, the min term `m·s` added
/// after the block). Each token's block sum runs in two chains of four `vpdpbusd` (even and
/// odd groups), so four tokens keep eight chains in flight.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
unsafe fn tokens<const K: u8, const C: bool, const T: usize>(tile: *const u8, nb: usize, act: *const BlockQ8, y: *mut f32, ystride: usize, mask: __mmask16) {
    let kind = kind_of(K);
    let mins = K == Q41 || K == Q51;
    let kind = if C { kind.compact() } else { kind };
    let zp = kind.zp();
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        // One token: decode, where the tile streams from DRAM.
        if T == 1 {
            super::prefetch_ahead(tile, kind, b);
        }
        let sc = tile.add(kind.scales_at(b));
        // The 16 rows' scales (f16 ones, 32-byte aligned in the pair's header, widened exactly).
        let dv = if C || mins { _mm512_cvtph_ps(_mm256_load_si256(sc as *const __m256i)) } else { _mm512_load_ps(sc as *const f32) };
        let mv = if mins { _mm512_cvtph_ps(_mm256_load_si256(sc.add(32) as *const __m256i)) } else { _mm512_setzero_ps() };
        let w = weights::<K, C>(tile.add(kind.payload_at(b)));
        for (k, acc) in acc.iter_mut().enumerate() {
            let ab = &*act.add(k * nb + b);
            let q = ab.qs.as_ptr() as *const i32;
            let s = _mm512_cvtepi32_ps(block_sum!(_mm512_set1_epi32(-zp * ab.qsum), &w, q));
            *acc = _mm512_fmadd_ps(_mm512_mul_ps(dv, _mm512_set1_ps(ab.d)), s, *acc);
            if mins {
                *acc = _mm512_fmadd_ps(mv, _mm512_set1_ps(ab.s), *acc);
            }
        }
    }
    for (k, acc) in acc.iter().enumerate() {
        _mm512_mask_storeu_ps(y.add(k * ystride), mask, *acc);
    }
}

/// K-quant tile GEMM (see `gemm::GemmKFn` and `gemm::gemm_k_ref`).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_k(kind: PackKind, tile: &[u8], nb: usize, act: &[BlockQ8K], ntok: usize, y: *mut f32, ystride: usize, nrows: usize) {
    let (four, one): (Tokens<BlockQ8K>, Tokens<BlockQ8K>) = match kind {
        PackKind::K4 => (tokens_k::<K4, 4>, tokens_k::<K4, 1>),
        PackKind::K5 => (tokens_k::<K5, 4>, tokens_k::<K5, 1>),
        PackKind::X4 => (tokens_k::<X4, 4>, tokens_k::<X4, 1>),
        PackKind::K3 => (tokens_k::<K3, 4>, tokens_k::<K3, 1>),
        PackKind::K2 => (tokens_k::<K2, 4>, tokens_k::<K2, 1>),
        PackKind::K6 => (tokens_k::<K6, 4>, tokens_k::<K6, 1>),
        _ => panic!("gemm_k: {kind:?} is not a K-quant tile"),
    };
    groups(None, four, one, kind, tile, nb, act, ntok, y, ystride, nrows)
}

/// `T` consecutive tokens over all super-blocks of a K-quant tile.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
unsafe fn tokens_k<const K: u8, const T: usize>(tile: *const u8, nb: usize, act: *const BlockQ8K, y: *mut f32, ystride: usize, mask: __mmask16) {
    let kind = kind_of(K);
    // Q4_K and Q5_K: 32-element sub-blocks with 6-bit scales and mins.
    let k4_scales = K == K4 || K == K5;
    let bb = kind.block_bytes();
    let mut acc = [_mm512_setzero_ps(); T];
    let ld = |p: *const u8| _mm512_load_si512(p as *const _);
    for b in 0..nb {
        let base = tile.add(b * bb);
        // The scales and the min (or −32 offset) terms first, so the tile's bytes are read
        // in ascending order (one token: the super-block 8 KiB ahead is prefetched a part per
        // sub-block, `prefetch_ahead_part`).
        let dv = _mm512_load_ps(base as *const f32);
        let dmin = if kind.has_dmin() { _mm512_load_ps(base.add(gemm::K2_DMIN) as *const f32) } else { _mm512_setzero_ps() };
        let mut mins = [_mm512_setzero_si512(); T];
        for (k, m) in mins.iter_mut().enumerate() {
            let bs = (*act.add(k * nb + b)).bsums.as_ptr();
            if k4_scales {
                for p in 0..4 {
                    let s0 = (*bs.add(4 * p) as i32 + *bs.add(4 * p + 1) as i32) as u16 as u32;
                    let s1 = (*bs.add(4 * p + 2) as i32 + *bs.add(4 * p + 3) as i32) as u16 as u32;
                    *m = _mm512_dpwssd_epi32(*m, ld(base.add(gemm::K4_MIN + 64 * p)), _mm512_set1_epi32((s0 | s1 << 16) as i32));
                }
            } else if K == K6 {
                for p in 0..8 {
                    let pair = (bs.add(2 * p) as *const i32).read_unaligned();
                    *m = _mm512_dpwssd_epi32(*m, ld(base.add(gemm::K6_PAIRS + 64 * p)), _mm512_set1_epi32(pair));
                }
            }
        }
        let mut isum = [_mm512_setzero_si512(); T];
        if K == K2 {
            let three = _mm512_set1_epi8(3);
            for j in 0..16 {
                if T == 1 {
                    super::prefetch_ahead_part(tile, kind, b, j, 16);
                }
                let plane = ld(base.add(gemm::K2_QS + 64 * j));
                let w = [
                    _mm512_and_si512(plane, three),
                    _mm512_and_si512(_mm512_srli_epi16::<2>(plane), three),
                    _mm512_and_si512(_mm512_srli_epi16::<4>(plane), three),
                    _mm512_and_si512(_mm512_srli_epi16::<6>(plane), three),
                ];
                // The file's scale/min bytes: scale in the low nibble, min in the high one.
                let sm = _mm512_cvtepu8_epi32(_mm_load_si128(base.add(gemm::K2_SC + 16 * j) as *const __m128i));
                let (sc, mn) = (_mm512_and_si512(sm, _mm512_set1_epi32(0x0F)), _mm512_srli_epi32::<4>(sm));
                for (k, (isum, m)) in isum.iter_mut().zip(mins.iter_mut()).enumerate() {
                    let ab = &*act.add(k * nb + b);
                    let s = sub_sum!(_mm512_setzero_si512(), &w, ab.qs.as_ptr().add(16 * j) as *const i32);
                    *isum = _mm512_add_epi32(*isum, _mm512_mullo_epi32(s, sc));
                    *m = _mm512_add_epi32(*m, _mm512_mullo_epi32(mn, _mm512_set1_epi32(ab.bsums[j] as i32)));
                }
            }
        } else if K == K3 {
            let (three, four) = (_mm512_set1_epi8(3), _mm512_set1_epi8(4));
            for j in 0..16 {
                if T == 1 {
                    super::prefetch_ahead_part(tile, kind, b, j, 16);
                }
                // u = low two bits + 4·high bit, for the four groups of sub-block j.
                let lo = ld(base.add(gemm::K3_LO + 64 * j));
                let hi = ld(base.add(gemm::K3_HI + 64 * (j / 2)));
                let low = [lo, _mm512_srli_epi16::<2>(lo), _mm512_srli_epi16::<4>(lo), _mm512_srli_epi16::<6>(lo)];
                let mut w = [_mm512_setzero_si512(); 4];
                for (g, w) in w.iter_mut().enumerate() {
                    let bit = _mm512_test_epi8_mask(hi, _mm512_set1_epi8(1 << (4 * (j % 2) + g)));
                    let l = _mm512_and_si512(low[g], three);
                    *w = _mm512_mask_add_epi8(l, bit, l, four);
                }
                let sc = _mm512_cvtepi8_epi32(_mm_load_si128(base.add(gemm::K3_SC + 16 * j) as *const __m128i));
                for (k, isum) in isum.iter_mut().enumerate() {
                    let ab = &*act.add(k * nb + b);
                    // u = q + 4: start from −4·Σa of the sub-block.
                    let s = sub_sum!(_mm512_set1_epi32(-4 * ab.bsums[j] as i32), &w, ab.qs.as_ptr().add(16 * j) as *const i32);
                    *isum = _mm512_add_epi32(*isum, _mm512_mullo_epi32(s, sc));
                }
            }
        } else if k4_scales || K == X4 {
            // 32-element sub-blocks in the 32-block tile layouts, one scale each.
            for j in 0..8 {
                if T == 1 {
                    super::prefetch_ahead_part(tile, kind, b, j, 8);
                }
                let (w, sc) = match K {
                    X4 => (
                        weights::<I4, false>(base.add(gemm::X4_QS + 256 * j)),
                        _mm512_cvtepi8_epi32(_mm_load_si128(base.add(gemm::X4_SC + 16 * j) as *const __m128i)),
                    ),
                    K5 => (
                        weights::<Q5, false>(base.add(gemm::K4_QS + 320 * j)),
                        _mm512_cvtepu8_epi32(_mm_load_si128(base.add(gemm::K4_SC + 16 * j) as *const __m128i)),
                    ),
                    _ => (
                        weights::<Q4, false>(base.add(gemm::K4_QS + 256 * j)),
                        _mm512_cvtepu8_epi32(_mm_load_si128(base.add(gemm::K4_SC + 16 * j) as *const __m128i)),
                    ),
                };
                for (k, isum) in isum.iter_mut().enumerate() {
                    let ab = &*act.add(k * nb + b);
                    // IQ4_XS: u = v + 128, so start from −128·Σa of the sub-block.
                    let zs = if K == X4 { -128 * (ab.bsums[2 * j] as i32 + ab.bsums[2 * j + 1] as i32) } else { 0 };
                    let s = block_sum!(_mm512_set1_epi32(zs), &w, ab.qs.as_ptr().add(32 * j) as *const i32);
                    *isum = _mm512_add_epi32(*isum, _mm512_mullo_epi32(s, sc));
                }
            }
        } else {
            for j in 0..16 {
                if T == 1 {
                    super::prefetch_ahead_part(tile, kind, b, j, 16);
                }
                let wp = base.add(gemm::K6_QS + 256 * j);
                let w = [ld(wp), ld(wp.add(64)), ld(wp.add(128)), ld(wp.add(192))];
                let sc = _mm512_cvtepi8_epi32(_mm_load_si128(base.add(gemm::K6_SC + 16 * j) as *const __m128i));
                for (k, isum) in isum.iter_mut().enumerate() {
                    let q = (*act.add(k * nb + b)).qs.as_ptr().add(16 * j) as *const i32;
                    *isum = _mm512_add_epi32(*isum, _mm512_mullo_epi32(sub_sum!(_mm512_setzero_si512(), &w, q), sc));
                }
            }
        }
        for (k, (acc, (isum, m))) in acc.iter_mut().zip(isum.into_iter().zip(mins)).enumerate() {
            let da = _mm512_set1_ps((*act.add(k * nb + b)).d);
            // Q6_K: the `−32` offset's term comes off in integers.
            let s = if K == K6 { _mm512_sub_epi32(isum, _mm512_slli_epi32::<5>(m)) } else { isum };
            *acc = _mm512_fmadd_ps(_mm512_mul_ps(dv, da), _mm512_cvtepi32_ps(s), *acc);
            if kind.has_dmin() {
                *acc = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, da), _mm512_cvtepi32_ps(m), *acc);
            }
        }
    }
    for (k, acc) in acc.iter().enumerate() {
        _mm512_mask_storeu_ps(y.add(k * ystride), mask, *acc);
    }
}
