//! AVX2 (+FMA) prefill GEMM on the packed row tiles of `gemm` (the AVX-512 kernel's layout): a
//! 16-row tile is run as two 8-row halves, each 32-byte half of a 64-byte group vector holding
//! eight rows' four quants. Chosen at run time by `dispatch::gemm_kernel` where the AVX-512 one
//! is not.
//!
//! Without VNNI, `vpdpbusd` (u8 × i8 → i32) is emulated with `vpmaddubsw` (u8 × i8, pairs summed
//! into i16 with saturation) and `vpmaddwd` (i16 pairs into i32). Every i16 value stays in range,
//! so the integer sums are exact and the results equal the scalar model (`gemm::gemm_ref`,
//! `gemm::gemm_k_ref`) bit for bit:
//! - Q4_0/Q4_1/Q5_0/Q5_1/Q4_K quants are at most 31: a pair is at most 2·31·128 = 7936 in magnitude, so
//!   four groups are summed in i16 before one `vpmaddwd` (Q4_0, Q4_1 and Q4_K: eight, ≤ 30720);
//! - Q5_K's (≤ 31) likewise four groups per i16 sum, scaled by `vpmaddwd` per sum;
//! - Q2_K's (at most 3) four groups in one i16 sum;
//! - Q3_K's (`q + 4`, at most 7) four groups and the `−4·Σa` start in one i16 sum;
//! - IQ4_NL/IQ4_XS values (−127..=113) are multiplied signed, as Q8_0's: `|v| · sign(a, v)`;
//! - Q6_K quants (`q + 32`) are at most 63: pairs ≤ 16128, two groups per i16 sum;
//! - Q8_0 (`u = q + 128` up to 255) would saturate, so its signed quants are used instead:
//!   `vpmaddubsw(|q|, sign(a, q))` has pairs of at most 2·128·127 = 32512 (activations of
//!   `quantize_act_q8` lie in −127..=127), and then the `−128·Σa` start is not needed. The
//!   compact Q8H tiles (an LM head) store `q` in −127..=127, so `vpmaddubsw(|a|, sign(q, a))`
//!   is exact too (pairs ≤ 2·128·127 for any activation) and needs no `vpabsb` or `vpxor` per
//!   weight vector: one `vpsignb`, where the standard tiles take three instructions.
//!
//! Q4_K sub-block scales are applied to the i16 sums with `vpmaddwd` (scale in both halves of
//! each 32-bit lane), Q6_K's likewise; the products are the same integers as the model's.
//!
//! With AVX-VNNI (VEX `vpdpbusd`, Alder Lake and later, Zen 5) the emulation is replaced by the
//! instruction itself, as in the AVX-512 kernel (module `vnni`).
//!
//! The helpers are `#[inline(always)]` without target features of their own, so they are
//! compiled into the kernels (with `#[inline]` and the features LLVM kept `weights` out of line,
//! its eight vectors going through memory).
//!
//! Safety contract: the CPU supports AVX2, FMA and F16C (and AVX-VNNI for the `vnni` functions).

#![allow(clippy::missing_safety_doc)]

use super::{kind_of, I4, IQ4_S, IQ4_U, K2, K3, K4, K5, K6, Q4, Q41, Q5, Q51, Q8, X4};

macro_rules! tile_gemm {
    ($name:ident, $feat:literal, $vnni:expr) => {
        pub mod $name {
            use std::arch::x86_64::*;

            use super::{kind_of, I4, IQ4_S, IQ4_U, K2, K3, K4, K5, K6, Q4, Q41, Q5, Q51, Q8, X4};
            use crate::backend::cpu::gemm::{self, PackKind, TILE_ROWS};
            use crate::backend::cpu::quant::{BlockQ8, BlockQ8K};

            const VNNI: bool = $vnni;

            /// Some consecutive tokens over all blocks of one 8-row half of a tile, or of both
            /// halves in one pass: `(tile, first half, nb, their activations, the first half's
            /// first output, ystride, the tile's rows from that half on)`.
            type Tokens<A> = unsafe fn(*const u8, usize, usize, *const A, *mut f32, usize, usize);

            /// Tile GEMM (see `gemm::GemmFn`).
            #[target_feature(enable = $feat)]
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn gemm(kind: PackKind, tile: &[u8], nb: usize, act: &[BlockQ8], ntok: usize, y: *mut f32, ystride: usize, nrows: usize) {
                let fns: [Tokens<BlockQ8>; 4] = match kind {
                    PackKind::Q8 => [tokens::<Q8, false, 8, 1>, tokens::<Q8, false, 4, 1>, tokens::<Q8, false, 1, 1>, tokens::<Q8, false, 1, 2>],
                    PackKind::Q8H => [tokens::<Q8, true, 8, 1>, tokens::<Q8, true, 4, 1>, tokens::<Q8, true, 1, 1>, tokens::<Q8, true, 1, 2>],
                    PackKind::Q5 => [tokens::<Q5, false, 8, 1>, tokens::<Q5, false, 4, 1>, tokens::<Q5, false, 1, 1>, tokens::<Q5, false, 1, 2>],
                    PackKind::Q4 => [tokens::<Q4, false, 8, 1>, tokens::<Q4, false, 4, 1>, tokens::<Q4, false, 1, 1>, tokens::<Q4, false, 1, 2>],
                    PackKind::Q41 => [tokens::<Q41, false, 8, 1>, tokens::<Q41, false, 4, 1>, tokens::<Q41, false, 1, 1>, tokens::<Q41, false, 1, 2>],
                    PackKind::Q51 => [tokens::<Q51, false, 8, 1>, tokens::<Q51, false, 4, 1>, tokens::<Q51, false, 1, 1>, tokens::<Q51, false, 1, 2>],
                    PackKind::I4 => [tokens::<I4, false, 8, 1>, tokens::<I4, false, 4, 1>, tokens::<I4, false, 1, 1>, tokens::<I4, false, 1, 2>],
                    PackKind::K2 | PackKind::K3 | PackKind::K4 | PackKind::K5 | PackKind::K6 | PackKind::X4 => panic!("gemm: {kind:?} tiles take gemm_k"),
                };
                groups(fns, kind, tile, nb, act, ntok, y, ystride, nrows)
            }

            /// K-quant tile GEMM (see `gemm::GemmKFn` and `gemm::gemm_k_ref`).
            #[target_feature(enable = $feat)]
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn gemm_k(kind: PackKind, tile: &[u8], nb: usize, act: &[BlockQ8K], ntok: usize, y: *mut f32, ystride: usize, nrows: usize) {
                let fns: [Tokens<BlockQ8K>; 4] = match kind {
                    PackKind::K4 => [tokens_k::<K4, 8, 1>, tokens_k::<K4, 4, 1>, tokens_k::<K4, 1, 1>, tokens_k::<K4, 1, 2>],
                    PackKind::K5 => [tokens_k::<K5, 8, 1>, tokens_k::<K5, 4, 1>, tokens_k::<K5, 1, 1>, tokens_k::<K5, 1, 2>],
                    PackKind::X4 => [tokens_k::<X4, 8, 1>, tokens_k::<X4, 4, 1>, tokens_k::<X4, 1, 1>, tokens_k::<X4, 1, 2>],
                    PackKind::K3 => [tokens_k::<K3, 8, 1>, tokens_k::<K3, 4, 1>, tokens_k::<K3, 1, 1>, tokens_k::<K3, 1, 2>],
                    PackKind::K2 => [tokens_k::<K2, 8, 1>, tokens_k::<K2, 4, 1>, tokens_k::<K2, 1, 1>, tokens_k::<K2, 1, 2>],
                    PackKind::K6 => [tokens_k::<K6, 8, 1>, tokens_k::<K6, 4, 1>, tokens_k::<K6, 1, 1>, tokens_k::<K6, 1, 2>],
                    _ => panic!("gemm_k: {kind:?} is not a K-quant tile"),
                };
                groups(fns, kind, tile, nb, act, ntok, y, ystride, nrows)
            }

            /// Checks the lengths, then runs each half of the tile over the tokens eight at a
            /// time and the rest four at a time; the last few tokens (decode's one) go one at a
            /// time through both halves in one pass over the tile, so its bytes stream in once
            /// rather than once per half. `fns`: eight tokens, four, one, one over both halves.
            /// Each token's sums run in the same order whichever group it falls in.
            #[target_feature(enable = $feat)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn groups<A>(
                fns: [Tokens<A>; 4],
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
                let [eight, four, one, one_both] = fns;
                let (p, a) = (tile.as_ptr(), act.as_ptr());
                // The groups of eight and four leave `ntok % 4` tokens.
                let singles = ntok % 4;
                for h in 0..2 {
                    let rows = nrows.saturating_sub(8 * h);
                    if rows == 0 {
                        break;
                    }
                    let yh = y.add(8 * h);
                    let mut t = 0;
                    while t + 8 <= ntok {
                        eight(p, h, nb, a.add(t * nb), yh.add(t * ystride), ystride, rows);
                        t += 8;
                    }
                    while t + 4 <= ntok {
                        four(p, h, nb, a.add(t * nb), yh.add(t * ystride), ystride, rows);
                        t += 4;
                    }
                }
                let single = if nrows > 8 { one_both } else { one };
                for t in ntok - singles..ntok {
                    single(p, 0, nb, a.add(t * nb), y.add(t * ystride), ystride, nrows);
                }
            }

            /// Stores the accumulators of `T` tokens of `H` halves (`rows`: the rows from the
            /// first half on; a half stores at most 8).
            #[inline(always)]
            unsafe fn store<const T: usize, const H: usize>(acc: &[[__m256; T]; H], y: *mut f32, ystride: usize, rows: usize) {
                for (hh, acc) in acc.iter().enumerate() {
                    let rows = rows.saturating_sub(8 * hh).min(8);
                    if rows > 0 {
                        store_half(acc, y.add(8 * hh), ystride, rows);
                    }
                }
            }

            /// Stores the accumulators of `T` tokens (`rows ≤ 8` outputs each).
            #[inline(always)]
            unsafe fn store_half<const T: usize>(acc: &[__m256; T], y: *mut f32, ystride: usize, rows: usize) {
                for (k, acc) in acc.iter().enumerate() {
                    if rows == 8 {
                        _mm256_storeu_ps(y.add(k * ystride), *acc);
                    } else {
                        let mut tmp = [0f32; 8];
                        _mm256_storeu_ps(tmp.as_mut_ptr(), *acc);
                        std::ptr::copy_nonoverlapping(tmp.as_ptr(), y.add(k * ystride), rows);
                    }
                }
            }

            #[inline(always)]
            unsafe fn ld(p: *const u8) -> __m256i {
                _mm256_loadu_si256(p as *const __m256i)
            }

            /// u8 × i8 products of four-byte groups summed into the i32 lanes of `acc` (VNNI).
            #[inline(always)]
            unsafe fn dpbusd(acc: __m256i, u: __m256i, a: __m256i) -> __m256i {
                if VNNI {
                    _mm256_dpbusd_avx_epi32(acc, u, a)
                } else {
                    unreachable!()
                }
            }

            /// `init` plus one token's products of a 32-element block with VNNI (`w` from
            /// [`weights`], `q` its 32 activation bytes), in two chains of four (even and odd
            /// groups).
            #[inline(always)]
            unsafe fn vnni_block(init: __m256i, w: &[__m256i; 8], q: *const i32) -> __m256i {
                // No closure: it would not be compiled with the caller's features.
                let mut e = dpbusd(init, w[0], _mm256_set1_epi32(q.read_unaligned()));
                let mut o = dpbusd(_mm256_setzero_si256(), w[1], _mm256_set1_epi32(q.add(1).read_unaligned()));
                for g in (2..8).step_by(2) {
                    e = dpbusd(e, w[g], _mm256_set1_epi32(q.add(g).read_unaligned()));
                    o = dpbusd(o, w[g + 1], _mm256_set1_epi32(q.add(g + 1).read_unaligned()));
                }
                _mm256_add_epi32(e, o)
            }

            /// One token's scaled sum `sc · (start + Σ u·a)` of a 16-element sub-block of small
            /// unsigned quants (Q2_K, Q3_K: `w` its four group vectors, `q` its 16 activation
            /// bytes); `sc` in i32 lanes with VNNI, in both i16 halves of each lane without, where
            /// everything stays in i16 (|Σ| ≤ 4·2·7·127 + 4·16·128) with the start in each lane's
            /// low half and `vpmaddwd` applies the scale.
            #[inline(always)]
            unsafe fn sub16(w: &[__m256i; 4], q: *const i32, start: i32, sc: __m256i) -> __m256i {
                let x0 = _mm256_set1_epi32(q.read_unaligned());
                let x1 = _mm256_set1_epi32(q.add(1).read_unaligned());
                let x2 = _mm256_set1_epi32(q.add(2).read_unaligned());
                let x3 = _mm256_set1_epi32(q.add(3).read_unaligned());
                if VNNI {
                    let e = dpbusd(dpbusd(_mm256_set1_epi32(start), w[0], x0), w[2], x2);
                    let od = dpbusd(dpbusd(_mm256_setzero_si256(), w[1], x1), w[3], x3);
                    _mm256_mullo_epi32(_mm256_add_epi32(e, od), sc)
                } else {
                    let s = _mm256_add_epi16(_mm256_add_epi16(mul16(w[0], x0), mul16(w[1], x1)), _mm256_add_epi16(mul16(w[2], x2), mul16(w[3], x3)));
                    _mm256_madd_epi16(_mm256_add_epi16(s, _mm256_set1_epi32(start & 0xFFFF)), sc)
                }
            }

            /// `vpmaddubsw`: u8 × i8, adjacent pairs summed into i16.
            #[inline(always)]
            unsafe fn mul16(u: __m256i, a: __m256i) -> __m256i {
                _mm256_maddubs_epi16(u, a)
            }

            /// The i16 pairs of `s` summed into i32 lanes.
            #[inline(always)]
            unsafe fn widen(s: __m256i) -> __m256i {
                _mm256_madd_epi16(s, _mm256_set1_epi16(1))
            }

            /// The 32 bytes of half `h` of each of the eight group vectors of a 32-element block
            /// (`p`: its quants), as unsigned quants; Q8_0 without VNNI: the signed ones (`C`:
            /// the compact Q8H tiles, which store them signed); IQ4: the indices' values, plus
            /// 128 with VNNI, signed without.
            #[inline(always)]
            unsafe fn weights<const K: u8, const C: bool>(p: *const u8, h: usize) -> [__m256i; 8] {
                let o = 32 * h;
                // No closures here: they would not be compiled with the caller's features.
                if K == Q8 {
                    let mut w = [_mm256_setzero_si256(); 8];
                    let flip = _mm256_set1_epi8(0x80u8 as i8);
                    for (g, w) in w.iter_mut().enumerate() {
                        *w = ld(p.add(o + 64 * g));
                        // Stored `q + 128` (standard) or `q` (compact): flip where the kernel
                        // wants the other.
                        if VNNI == C {
                            *w = _mm256_xor_si256(*w, flip);
                        }
                    }
                    return w;
                }
                let m = _mm256_set1_epi8(0x0F);
                let mut w = [_mm256_setzero_si256(); 8];
                for i in 0..4 {
                    let v = ld(p.add(64 * i + o));
                    w[2 * i] = _mm256_and_si256(v, m);
                    w[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m);
                }
                if K == I4 {
                    let table = if VNNI { IQ4_U.as_ptr() } else { IQ4_S.as_ptr() as *const u8 };
                    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(table as *const __m128i));
                    for w in w.iter_mut() {
                        *w = _mm256_shuffle_epi8(table, *w);
                    }
                }
                if K == Q5 || K == Q51 {
                    // The half's lane bytes of fifth bits: bit g of each → 0x10 of group g's byte
                    // (16-bit shifts: what crosses into the neighbouring byte is masked off).
                    let hb = ld(p.add(256 + 32 * h));
                    let sixteen = _mm256_set1_epi8(0x10);
                    let at4 = [
                        _mm256_slli_epi16::<4>(hb),
                        _mm256_slli_epi16::<3>(hb),
                        _mm256_slli_epi16::<2>(hb),
                        _mm256_slli_epi16::<1>(hb),
                        hb,
                        _mm256_srli_epi16::<1>(hb),
                        _mm256_srli_epi16::<2>(hb),
                        _mm256_srli_epi16::<3>(hb),
                    ];
                    for (w, b) in w.iter_mut().zip(at4) {
                        *w = _mm256_or_si256(*w, _mm256_and_si256(b, sixteen));
                    }
                }
                w
            }

            /// Group `g`'s four activation bytes of `ab` in every lane.
            #[inline(always)]
            unsafe fn xg(ab: &BlockQ8, g: usize) -> __m256i {
                _mm256_set1_epi32((ab.qs.as_ptr() as *const i32).add(g).read_unaligned())
            }

            /// Group `g`'s products for the compact Q8H tiles without VNNI: `|a| · sign(q, a)`.
            #[inline(always)]
            unsafe fn q8h_group(w: &[__m256i; 8], ab: &BlockQ8, g: usize) -> __m256i {
                let x = xg(ab, g);
                widen(mul16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(w[g], x)))
            }

            /// Group `g`'s products for the standard Q8_0 tiles without VNNI: `|q| · sign(a, q)`.
            #[inline(always)]
            unsafe fn q8_group(w: &[__m256i; 8], aw: &[__m256i; 8], ab: &BlockQ8, g: usize) -> __m256i {
                widen(mul16(aw[g], _mm256_sign_epi8(xg(ab, g), w[g])))
            }

            /// One token's integer sums of one block of a half (`w` from [`weights`], `aw` its
            /// absolute values for the standard Q8_0 tiles without VNNI), `Σ q·a` in each row's
            /// lane. (No closures: they would not be compiled with the caller's features.)
            #[inline(always)]
            unsafe fn isum<const K: u8, const C: bool>(w: &[__m256i; 8], aw: &[__m256i; 8], ab: &BlockQ8, zp: i32) -> __m256i {
                if VNNI {
                    vnni_block(_mm256_set1_epi32(-zp * ab.qsum), w, ab.qs.as_ptr() as *const i32)
                } else if K == Q8 && C {
                    let e = _mm256_add_epi32(
                        _mm256_add_epi32(q8h_group(w, ab, 0), q8h_group(w, ab, 2)),
                        _mm256_add_epi32(q8h_group(w, ab, 4), q8h_group(w, ab, 6)),
                    );
                    let o = _mm256_add_epi32(
                        _mm256_add_epi32(q8h_group(w, ab, 1), q8h_group(w, ab, 3)),
                        _mm256_add_epi32(q8h_group(w, ab, 5), q8h_group(w, ab, 7)),
                    );
                    _mm256_add_epi32(e, o)
                } else if K == Q8 || K == I4 {
                    let e = _mm256_add_epi32(
                        _mm256_add_epi32(q8_group(w, aw, ab, 0), q8_group(w, aw, ab, 2)),
                        _mm256_add_epi32(q8_group(w, aw, ab, 4), q8_group(w, aw, ab, 6)),
                    );
                    let o = _mm256_add_epi32(
                        _mm256_add_epi32(q8_group(w, aw, ab, 1), q8_group(w, aw, ab, 3)),
                        _mm256_add_epi32(q8_group(w, aw, ab, 5), q8_group(w, aw, ab, 7)),
                    );
                    _mm256_add_epi32(e, o)
                } else {
                    let e = _mm256_add_epi16(
                        _mm256_add_epi16(mul16(w[0], xg(ab, 0)), mul16(w[2], xg(ab, 2))),
                        _mm256_add_epi16(mul16(w[4], xg(ab, 4)), mul16(w[6], xg(ab, 6))),
                    );
                    let o = _mm256_add_epi16(
                        _mm256_add_epi16(mul16(w[1], xg(ab, 1)), mul16(w[3], xg(ab, 3))),
                        _mm256_add_epi16(mul16(w[5], xg(ab, 5)), mul16(w[7], xg(ab, 7))),
                    );
                    let s = if K == Q4 || K == Q41 { widen(_mm256_add_epi16(e, o)) } else { _mm256_add_epi32(widen(e), widen(o)) };
                    _mm256_add_epi32(_mm256_set1_epi32(-zp * ab.qsum), s)
                }
            }

            /// `T` consecutive tokens over all blocks of `H` halves of the tile from half `h0`;
            /// `C`: the compact layout (f16 scales in pair headers, `PackKind::Q8H`); Q4_1, Q5_1: f16
            /// scales and mins in each block's header, the min term `m·s` after the block.
            #[target_feature(enable = $feat)]
            unsafe fn tokens<const K: u8, const C: bool, const T: usize, const H: usize>(
                tile: *const u8,
                h0: usize,
                nb: usize,
                act: *const BlockQ8,
                y: *mut f32,
                ystride: usize,
                rows: usize,
            ) {
                let kind = if C { kind_of(K).compact() } else { kind_of(K) };
                let zp = kind.zp();
                let mins = K == Q41 || K == Q51;
                let mut accs = [[_mm256_setzero_ps(); T]; H];
                for b in 0..nb {
                    // One token (both halves in one pass): decode, where the tile streams
                    // from DRAM.
                    if H == 2 {
                        super::super::prefetch_ahead(tile, kind, b);
                    }
                    let (sc, base) = (tile.add(kind.scales_at(b)), tile.add(kind.payload_at(b)));
                    for (hh, acc) in accs.iter_mut().enumerate() {
                        let h = h0 + hh;
                        // The half's eight row scales (f16 ones widened exactly).
                        let dv = if C || mins {
                            _mm256_cvtph_ps(_mm_loadu_si128(sc.add(16 * h) as *const __m128i))
                        } else {
                            _mm256_loadu_ps(sc.add(32 * h) as *const f32)
                        };
                        let mv = if mins { _mm256_cvtph_ps(_mm_loadu_si128(sc.add(32 + 16 * h) as *const __m128i)) } else { _mm256_setzero_ps() };
                        let w = weights::<K, C>(base, h);
                        // Q8_0 without VNNI: |q| once per block, the signs per token (the compact
                        // tiles, which have no −128, take |a| and sign(q, a) instead).
                        let aw = if (K == Q8 || K == I4) && !VNNI && !C { w.map(|v| _mm256_sign_epi8(v, v)) } else { w };
                        for (k, acc) in acc.iter_mut().enumerate() {
                            let ab = &*act.add(k * nb + b);
                            let s = isum::<K, C>(&w, &aw, ab, zp);
                            *acc = _mm256_fmadd_ps(_mm256_mul_ps(dv, _mm256_set1_ps(ab.d)), _mm256_cvtepi32_ps(s), *acc);
                            if mins {
                                *acc = _mm256_fmadd_ps(mv, _mm256_set1_ps(ab.s), *acc);
                            }
                        }
                    }
                }
                store(&accs, y, ystride, rows);
            }

            /// Greedy screening of one token over one tile of an LM head's screening copy
            /// (`gemm::Packed::screen_of`: standard Q5 tiles, scales 8·|d| ≥ 0): the Q5_0
            /// product `A` as the one-token kernel computes it, and beside it, per block, `dvx ·
            /// c[b]` summed for the three token constants of `c` (`matmul::head_argmax`: the low
            /// bits' least and greatest contribution and a magnitude for the rounding margin).
            /// Writes `lower = A + lo − e·mag` and `upper = A + hi + e·mag` for the tile's first
            /// `nrows` rows.
            #[target_feature(enable = $feat)]
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn screen(tile: &[u8], nb: usize, act: &[BlockQ8], c: &[[f32; 3]], e: f32, lower: *mut f32, upper: *mut f32, nrows: usize) {
                let kind = PackKind::Q5;
                assert!(tile.len() >= kind.tile_bytes(nb) && act.len() >= nb && c.len() >= nb && nrows <= TILE_ROWS);
                let (tile, zp) = (tile.as_ptr(), kind.zp());
                let z = _mm256_setzero_ps();
                let (mut acc, mut lo, mut hi, mut mag) = ([z; 2], [z; 2], [z; 2], [z; 2]);
                for (b, (ab, cb)) in act.iter().zip(c).take(nb).enumerate() {
                    super::super::prefetch_ahead(tile, kind, b);
                    let (sc, base) = (tile.add(kind.scales_at(b)), tile.add(kind.payload_at(b)));
                    let (cl, ch, cm) = (_mm256_set1_ps(cb[0]), _mm256_set1_ps(cb[1]), _mm256_set1_ps(cb[2]));
                    for h in 0..2 {
                        let dvx = _mm256_mul_ps(_mm256_loadu_ps(sc.add(32 * h) as *const f32), _mm256_set1_ps(ab.d));
                        let w = weights::<Q5, false>(base, h);
                        let s = isum::<Q5, false>(&w, &w, ab, zp);
                        acc[h] = _mm256_fmadd_ps(dvx, _mm256_cvtepi32_ps(s), acc[h]);
                        lo[h] = _mm256_fmadd_ps(dvx, cl, lo[h]);
                        hi[h] = _mm256_fmadd_ps(dvx, ch, hi[h]);
                        mag[h] = _mm256_fmadd_ps(dvx, cm, mag[h]);
                    }
                }
                let ev = _mm256_set1_ps(e);
                for h in 0..2 {
                    let rows = nrows.saturating_sub(8 * h).min(8);
                    if rows == 0 {
                        break;
                    }
                    let m = _mm256_mul_ps(mag[h], ev);
                    let l = [_mm256_sub_ps(_mm256_add_ps(acc[h], lo[h]), m)];
                    let u = [_mm256_add_ps(_mm256_add_ps(acc[h], hi[h]), m)];
                    store_half(&l, lower.add(8 * h), 0, rows);
                    store_half(&u, upper.add(8 * h), 0, rows);
                }
            }

            /// The eight bytes at `p` (one per row of the half) as i32 lanes, zero- or
            /// sign-extended; `pairs` puts the value in both i16 halves of its lane (for
            /// `vpmaddwd` with i16 sums).
            #[inline(always)]
            unsafe fn scales<const SIGNED: bool>(p: *const u8, pairs: bool) -> __m256i {
                let b = _mm_loadl_epi64(p as *const __m128i);
                if pairs {
                    let w = if SIGNED { _mm_cvtepi8_epi16(b) } else { _mm_cvtepu8_epi16(b) };
                    let v = _mm256_cvtepu16_epi32(w);
                    _mm256_or_si256(v, _mm256_slli_epi32::<16>(v))
                } else if SIGNED {
                    _mm256_cvtepi8_epi32(b)
                } else {
                    _mm256_cvtepu8_epi32(b)
                }
            }

            /// `T` consecutive tokens over all super-blocks of `H` halves of a K-quant tile from
            /// half `h0`.
            #[target_feature(enable = $feat)]
            unsafe fn tokens_k<const K: u8, const T: usize, const H: usize>(
                tile: *const u8,
                h0: usize,
                nb: usize,
                act: *const BlockQ8K,
                y: *mut f32,
                ystride: usize,
                rows: usize,
            ) {
                let kind = kind_of(K);
                let bb = kind.block_bytes();
                // Q4_K and Q5_K: 32-element sub-blocks with 6-bit scales and mins.
                let k4_scales = K == K4 || K == K5;
                let mut accs = [[_mm256_setzero_ps(); T]; H];
                // One token (both halves): the super-block 8 KiB ahead is prefetched a part per
                // sub-block (`prefetch_ahead_part`).
                let ahead = H == 2;
                for b in 0..nb {
                    let base = tile.add(b * bb);
                    // The halves side by side: each 64-byte line of the super-block is read once,
                    // both of its 32-byte halves together, in address order (a pass per half
                    // read the super-block's ~40–77 lines twice, and ran at half the DRAM rate of
                    // the Q5_0 kernel). Per half the integer sums run in the same order.
                    // The min (or −32 offset) terms first; the row scales (the first lines, in
                    // L1 since the prefetch) when the sums are done.
                    let mut mins = [[_mm256_setzero_si256(); T]; H];
                    for (hh, mins) in mins.iter_mut().enumerate() {
                        let o = 32 * (h0 + hh);
                        for (k, m) in mins.iter_mut().enumerate() {
                            let bs = (*act.add(k * nb + b)).bsums.as_ptr();
                            if k4_scales {
                                for p in 0..4 {
                                    let s0 = (*bs.add(4 * p) as i32 + *bs.add(4 * p + 1) as i32) as u16 as u32;
                                    let s1 = (*bs.add(4 * p + 2) as i32 + *bs.add(4 * p + 3) as i32) as u16 as u32;
                                    let v = _mm256_madd_epi16(ld(base.add(gemm::K4_MIN + 64 * p + o)), _mm256_set1_epi32((s0 | s1 << 16) as i32));
                                    *m = _mm256_add_epi32(*m, v);
                                }
                            } else if K == K6 {
                                for p in 0..8 {
                                    let pair = (bs.add(2 * p) as *const i32).read_unaligned();
                                    let v = _mm256_madd_epi16(ld(base.add(gemm::K6_PAIRS + 64 * p + o)), _mm256_set1_epi32(pair));
                                    *m = _mm256_add_epi32(*m, v);
                                }
                            }
                        }
                    }
                    let mut isum = [[_mm256_setzero_si256(); T]; H];
                    if K == K2 {
                        let three = _mm256_set1_epi8(3);
                        for j in 0..16 {
                            if ahead {
                                super::super::prefetch_ahead_part(tile, kind, b, j, 16);
                            }
                            for (hh, (isum, mins)) in isum.iter_mut().zip(mins.iter_mut()).enumerate() {
                                let h = h0 + hh;
                                let plane = ld(base.add(gemm::K2_QS + 64 * j + 32 * h));
                                let w = [
                                    _mm256_and_si256(plane, three),
                                    _mm256_and_si256(_mm256_srli_epi16::<2>(plane), three),
                                    _mm256_and_si256(_mm256_srli_epi16::<4>(plane), three),
                                    _mm256_and_si256(_mm256_srli_epi16::<6>(plane), three),
                                ];
                                // The file's scale/min bytes: scale in the low nibble, min in the
                                // high one (the scale in both i16 halves of a lane without VNNI).
                                let sm = scales::<false>(base.add(gemm::K2_SC + 16 * j + 8 * h), !VNNI);
                                let sc = _mm256_and_si256(sm, _mm256_set1_epi16(0x0F));
                                let mn = _mm256_srli_epi32::<4>(_mm256_and_si256(sm, _mm256_set1_epi32(0xFF)));
                                for (k, (isum, m)) in isum.iter_mut().zip(mins.iter_mut()).enumerate() {
                                    let ab = &*act.add(k * nb + b);
                                    let v = sub16(&w, ab.qs.as_ptr().add(16 * j) as *const i32, 0, sc);
                                    *isum = _mm256_add_epi32(*isum, v);
                                    *m = _mm256_add_epi32(*m, _mm256_mullo_epi32(mn, _mm256_set1_epi32(ab.bsums[j] as i32)));
                                }
                            }
                        }
                    } else if K == K3 {
                        let (three, four) = (_mm256_set1_epi8(3), _mm256_set1_epi8(4));
                        for j in 0..16 {
                            if ahead {
                                super::super::prefetch_ahead_part(tile, kind, b, j, 16);
                            }
                            for (hh, isum) in isum.iter_mut().enumerate() {
                                let h = h0 + hh;
                                // u = low two bits + 4·high bit, for the four groups of sub-block j.
                                let lo = ld(base.add(gemm::K3_LO + 64 * j + 32 * h));
                                let hi = ld(base.add(gemm::K3_HI + 64 * (j / 2) + 32 * h));
                                let low = [lo, _mm256_srli_epi16::<2>(lo), _mm256_srli_epi16::<4>(lo), _mm256_srli_epi16::<6>(lo)];
                                let mut w = [_mm256_setzero_si256(); 4];
                                for (g, w) in w.iter_mut().enumerate() {
                                    let bit = _mm256_set1_epi8(1 << (4 * (j % 2) + g));
                                    let set = _mm256_cmpeq_epi8(_mm256_and_si256(hi, bit), bit);
                                    *w = _mm256_or_si256(_mm256_and_si256(low[g], three), _mm256_and_si256(set, four));
                                }
                                let sc = scales::<true>(base.add(gemm::K3_SC + 16 * j + 8 * h), !VNNI);
                                for (k, isum) in isum.iter_mut().enumerate() {
                                    let ab = &*act.add(k * nb + b);
                                    // u = q + 4: −4·Σa of the sub-block comes off its sum.
                                    let v = sub16(&w, ab.qs.as_ptr().add(16 * j) as *const i32, -4 * ab.bsums[j] as i32, sc);
                                    *isum = _mm256_add_epi32(*isum, v);
                                }
                            }
                        }
                    } else if K == X4 {
                        for j in 0..8 {
                            if ahead {
                                super::super::prefetch_ahead_part(tile, kind, b, j, 8);
                            }
                            for (hh, isum) in isum.iter_mut().enumerate() {
                                let h = h0 + hh;
                                let w = weights::<I4, false>(base.add(gemm::X4_QS + 256 * j), h);
                                let aw = if VNNI { w } else { w.map(|v| _mm256_sign_epi8(v, v)) };
                                let sc = scales::<true>(base.add(gemm::X4_SC + 16 * j + 8 * h), false);
                                for (k, isum) in isum.iter_mut().enumerate() {
                                    let ab = &*act.add(k * nb + b);
                                    let q = ab.qs.as_ptr().add(32 * j) as *const i32;
                                    let x = |g: usize| _mm256_set1_epi32(q.add(g).read_unaligned());
                                    let v = if VNNI {
                                        // u = v + 128: start from −128·Σa of the sub-block.
                                        let zs = -128 * (ab.bsums[2 * j] as i32 + ab.bsums[2 * j + 1] as i32);
                                        vnni_block(_mm256_set1_epi32(zs), &w, q)
                                    } else {
                                        // Signed values: |v| · sign(a, v), one group per i32 widening.
                                        let p = |g: usize| widen(mul16(aw[g], _mm256_sign_epi8(x(g), w[g])));
                                        let e = _mm256_add_epi32(_mm256_add_epi32(p(0), p(2)), _mm256_add_epi32(p(4), p(6)));
                                        let od = _mm256_add_epi32(_mm256_add_epi32(p(1), p(3)), _mm256_add_epi32(p(5), p(7)));
                                        _mm256_add_epi32(e, od)
                                    };
                                    *isum = _mm256_add_epi32(*isum, _mm256_mullo_epi32(v, sc));
                                }
                            }
                        }
                    } else if k4_scales {
                        for j in 0..8 {
                            if ahead {
                                super::super::prefetch_ahead_part(tile, kind, b, j, 8);
                            }
                            for (hh, isum) in isum.iter_mut().enumerate() {
                                let h = h0 + hh;
                                let w = if K == K5 {
                                    weights::<Q5, false>(base.add(gemm::K4_QS + 320 * j), h)
                                } else {
                                    weights::<Q4, false>(base.add(gemm::K4_QS + 256 * j), h)
                                };
                                let sc = scales::<false>(base.add(gemm::K4_SC + 16 * j + 8 * h), !VNNI);
                                for (k, isum) in isum.iter_mut().enumerate() {
                                    let q = (*act.add(k * nb + b)).qs.as_ptr().add(32 * j) as *const i32;
                                    let x = |g: usize| _mm256_set1_epi32(q.add(g).read_unaligned());
                                    let v = if VNNI {
                                        _mm256_mullo_epi32(vnni_block(_mm256_setzero_si256(), &w, q), sc)
                                    } else {
                                        let p = |g: usize| mul16(w[g], x(g));
                                        let e = _mm256_add_epi16(_mm256_add_epi16(p(0), p(2)), _mm256_add_epi16(p(4), p(6)));
                                        let od = _mm256_add_epi16(_mm256_add_epi16(p(1), p(3)), _mm256_add_epi16(p(5), p(7)));
                                        if K == K5 {
                                            // Five bits: the even and odd groups' i16 sums stay apart.
                                            _mm256_add_epi32(_mm256_madd_epi16(e, sc), _mm256_madd_epi16(od, sc))
                                        } else {
                                            _mm256_madd_epi16(_mm256_add_epi16(e, od), sc)
                                        }
                                    };
                                    *isum = _mm256_add_epi32(*isum, v);
                                }
                            }
                        }
                    } else {
                        for j in 0..16 {
                            if ahead {
                                super::super::prefetch_ahead_part(tile, kind, b, j, 16);
                            }
                            for (hh, isum) in isum.iter_mut().enumerate() {
                                let h = h0 + hh;
                                let wp = base.add(gemm::K6_QS + 256 * j + 32 * h);
                                let (w0, w1, w2, w3) = (ld(wp), ld(wp.add(64)), ld(wp.add(128)), ld(wp.add(192)));
                                let sc = scales::<true>(base.add(gemm::K6_SC + 16 * j + 8 * h), !VNNI);
                                for (k, isum) in isum.iter_mut().enumerate() {
                                    let q = (*act.add(k * nb + b)).qs.as_ptr().add(16 * j) as *const i32;
                                    let x = |g: usize| _mm256_set1_epi32(q.add(g).read_unaligned());
                                    let v = if VNNI {
                                        let e = dpbusd(_mm256_setzero_si256(), w0, x(0));
                                        let od = dpbusd(_mm256_setzero_si256(), w1, x(1));
                                        let e = dpbusd(e, w2, x(2));
                                        let od = dpbusd(od, w3, x(3));
                                        _mm256_mullo_epi32(_mm256_add_epi32(e, od), sc)
                                    } else {
                                        let e = _mm256_add_epi16(mul16(w0, x(0)), mul16(w2, x(2)));
                                        let od = _mm256_add_epi16(mul16(w1, x(1)), mul16(w3, x(3)));
                                        _mm256_add_epi32(_mm256_madd_epi16(e, sc), _mm256_madd_epi16(od, sc))
                                    };
                                    *isum = _mm256_add_epi32(*isum, v);
                                }
                            }
                        }
                    }
                    for (hh, acc) in accs.iter_mut().enumerate() {
                        let o = 32 * (h0 + hh);
                        let dv = _mm256_loadu_ps(base.add(o) as *const f32);
                        let dmin = if kind.has_dmin() { _mm256_loadu_ps(base.add(gemm::K2_DMIN + o) as *const f32) } else { _mm256_setzero_ps() };
                        for (k, (acc, (isum, m))) in acc.iter_mut().zip(isum[hh].into_iter().zip(mins[hh])).enumerate() {
                            let da = _mm256_set1_ps((*act.add(k * nb + b)).d);
                            // Q6_K: the `−32` offset's term comes off in integers.
                            let s = if K == K6 { _mm256_sub_epi32(isum, _mm256_slli_epi32::<5>(m)) } else { isum };
                            *acc = _mm256_fmadd_ps(_mm256_mul_ps(dv, da), _mm256_cvtepi32_ps(s), *acc);
                            if kind.has_dmin() {
                                *acc = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, da), _mm256_cvtepi32_ps(m), *acc);
                            }
                        }
                    }
                }
                store(&accs, y, ystride, rows);
            }
        }
    };
}

tile_gemm!(emulated, "avx2,fma,f16c", false);
tile_gemm!(vnni, "avx2,fma,f16c,avxvnni", true);
