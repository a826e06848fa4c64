//! Attention kernels over the KV cache: scores of queries against cached keys and the
//! weighted sums of cached values, per head and several heads per pass over the rows.

#[cfg(target_arch = "x86_64")]
use super::arch::x86::vec as simd;
use super::ops::{axpy, dot, KvElem};

/// Attention scores over cached keys: `out[j] = dot(q, k[offs[j]..][..q.len()]) * scale`, the
/// same operations as [`dot`] per key (identical results), several keys at a time so `q` is
/// loaded once for them.
///
/// Panics if a key row lies outside `k` or `out` is shorter than `offs`.
pub fn scores<T: KvElem>(q: &[f32], k: &[T], offs: &[usize], scale: f32, out: &mut [f32]) {
    let hd = q.len();
    assert!(out.len() >= offs.len() && offs.iter().all(|&o| o + hd <= k.len()), "scores: key rows out of range");
    #[cfg(target_arch = "x86_64")]
    if simd::avx512() && hd.is_multiple_of(16) {
        // SAFETY: AVX-512F was detected; every row `offs[j]..offs[j] + hd` is inside `k`.
        return unsafe { simd::scores512(q, k, offs, scale, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if simd::avx2() && hd.is_multiple_of(16) {
        // SAFETY: AVX2 and FMA were detected; every row `offs[j]..offs[j] + hd` is inside `k`.
        return unsafe { simd::scores(q, k, offs, scale, out) };
    }
    for (o, &off) in out.iter_mut().zip(offs) {
        *o = with_f32_row(&k[off..off + hd], |r| dot(q, r)) * scale;
    }
}

/// Calls `f` with `row` widened to f32 (exactly), in a stack buffer for rows of up to 512.
fn with_f32_row<T: KvElem, R>(row: &[T], f: impl FnOnce(&[f32]) -> R) -> R {
    let mut stack = [0f32; 512];
    let mut heap = Vec::new();
    let buf: &mut [f32] = if row.len() <= stack.len() {
        &mut stack[..row.len()]
    } else {
        heap.resize(row.len(), 0.0);
        &mut heap
    };
    for (b, &x) in buf.iter_mut().zip(row) {
        *b = x.to_f32();
    }
    f(buf)
}

/// Attention output over cached values: `out = Σ_j w[j] · v[offs[j]..][..out.len()]`, rows in
/// order from zero, with per element the same fused multiply-adds as [`axpy`] row by row
/// (identical results), but the output stays in registers across the rows.
///
/// Panics if a value row lies outside `v` or `w` is shorter than `offs`.
pub fn weighted_sum<T: KvElem>(w: &[f32], v: &[T], offs: &[usize], out: &mut [f32]) {
    let hd = out.len();
    assert!(w.len() >= offs.len() && offs.iter().all(|&o| o + hd <= v.len()), "weighted_sum: value rows out of range");
    #[cfg(target_arch = "x86_64")]
    if simd::avx512() && hd == 256 {
        // SAFETY: AVX-512F was detected; every row `offs[j]..offs[j] + hd` is inside `v`.
        return unsafe { simd::weighted_sum256(w, v, offs, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if simd::avx2() && hd.is_multiple_of(8) {
        // SAFETY: AVX2 and FMA were detected; every row `offs[j]..offs[j] + hd` is inside `v`.
        return unsafe { simd::weighted_sum(w, v, offs, out) };
    }
    out.fill(0.0);
    for (&wj, &off) in w.iter().zip(offs) {
        with_f32_row(&v[off..off + hd], |r| axpy(out, wj, r));
    }
}

/// [`scores`] for several query heads over the same keys (the heads of a KV group):
/// `outs[h][j] = dot(qs[h], k[offs[j]..][..hd]) * scale`, identical to [`scores`] per head, but
/// each key row is loaded (and, from the f16 cache, widened) once for up to four heads.
///
/// Panics if the heads differ in length, `outs` is shorter than `qs` or an output row shorter
/// than `offs`, or a key row lies outside `k`.
pub fn scores_heads<T: KvElem>(qs: &[&[f32]], k: &[T], offs: &[usize], scale: f32, outs: &mut [&mut [f32]]) {
    let Some(hd) = qs.first().map(|q| q.len()) else { return };
    assert!(
        outs.len() >= qs.len() && qs.iter().all(|q| q.len() == hd) && outs.iter().all(|o| o.len() >= offs.len()),
        "scores_heads: heads or output rows do not match"
    );
    #[cfg(target_arch = "x86_64")]
    if qs.len() > 1 && simd::avx2() && hd.is_multiple_of(16) {
        assert!(offs.iter().all(|&o| o + hd <= k.len()), "scores: key rows out of range");
        for (q4, o4) in qs.chunks(4).zip(outs.chunks_mut(4)) {
            // SAFETY: AVX2/FMA/F16C (and AVX-512F for the 512-bit variant) were detected; every
            // key row is inside `k`, every query has `hd` elements and every output row
            // `offs.len()`.
            unsafe { simd::scores_heads_dispatch(q4, k, offs, scale, o4, simd::avx512()) };
        }
        return;
    }
    for (q, o) in qs.iter().zip(outs.iter_mut()) {
        scores(q, k, offs, scale, o);
    }
}

/// [`weighted_sum`] for several heads over the same value rows: `outs[h] = Σ_j ws[h][j] ·
/// v[offs[j]..][..width]`, identical to [`weighted_sum`] per head (per element the same fused
/// multiply-adds over the rows in order), but each value row is loaded (and widened) once for
/// up to four heads.
///
/// Panics if the outputs differ in width, `ws` is shorter than `outs` or a weight row shorter
/// than `offs`, or a value row lies outside `v`.
pub fn weighted_sum_heads<T: KvElem>(ws: &[&[f32]], v: &[T], offs: &[usize], outs: &mut [&mut [f32]]) {
    let Some(width) = outs.first().map(|o| o.len()) else { return };
    assert!(
        ws.len() >= outs.len() && outs.iter().all(|o| o.len() == width) && ws.iter().all(|w| w.len() >= offs.len()),
        "weighted_sum_heads: heads or weight rows do not match"
    );
    #[cfg(target_arch = "x86_64")]
    if outs.len() > 1 && simd::avx2() && width.is_multiple_of(8) {
        assert!(offs.iter().all(|&o| o + width <= v.len()), "weighted_sum: value rows out of range");
        for (w4, o4) in ws.chunks(4).zip(outs.chunks_mut(4)) {
            // SAFETY: as in `scores_heads`; every value row `offs[j]..offs[j] + width` is inside
            // `v`, every weight row has `offs.len()` elements.
            unsafe { simd::weighted_sum_heads_dispatch(w4, v, offs, o4, simd::avx512()) };
        }
        return;
    }
    for (w, o) in ws.iter().zip(outs.iter_mut()) {
        weighted_sum(w, v, offs, o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    /// Checks `scores`/`weighted_sum` over cache rows `k`, `v` of element type `T` against the
    /// per-row `dot` and `axpy` on the rows widened to f32 (`kw`, `vw`), exactly, through the
    /// dispatcher and each SIMD variant this CPU has.
    fn check_attention_kernels<T: KvElem>(hd: usize, rows: usize, k: &[T], v: &[T], q: &[f32], w_all: &[f32]) {
        let kw: Vec<f32> = k.iter().map(|x| x.to_f32()).collect();
        let vw: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
        let ty = std::any::type_name::<T>();
        for span in [0, 1, 3, 4, 5, 9] {
            // Ring-buffer-like order with an odd start offset.
            let offs: Vec<usize> = (0..span).map(|j| ((j * 7 + 3) % rows) * hd + 1).collect();
            let mut got = vec![f32::NAN; span];
            scores(q, k, &offs, 0.37, &mut got);
            let want: Vec<f32> = offs.iter().map(|&o| dot(q, &kw[o..o + hd]) * 0.37).collect();
            assert_eq!(got, want, "scores {ty} hd={hd} span={span}");
            #[cfg(target_arch = "x86_64")]
            if simd::avx2() && hd.is_multiple_of(16) {
                let mut got = vec![f32::NAN; span];
                unsafe { simd::scores(q, k, &offs, 0.37, &mut got) };
                assert_eq!(got, want, "avx2 scores {ty} hd={hd} span={span}");
            }
            #[cfg(target_arch = "x86_64")]
            if simd::avx512() && hd.is_multiple_of(16) {
                let mut got = vec![f32::NAN; span];
                unsafe { simd::scores512(q, k, &offs, 0.37, &mut got) };
                assert_eq!(got, want, "avx512 scores {ty} hd={hd} span={span}");
            }
            let w = &w_all[..span];
            let mut got = vec![f32::NAN; hd];
            weighted_sum(w, v, &offs, &mut got);
            let mut want = vec![0f32; hd];
            for (&wj, &o) in w.iter().zip(&offs) {
                axpy(&mut want, wj, &vw[o..o + hd]);
            }
            assert_eq!(got, want, "weighted_sum {ty} hd={hd} span={span}");
            #[cfg(target_arch = "x86_64")]
            if simd::avx2() && hd.is_multiple_of(8) {
                let mut got = vec![f32::NAN; hd];
                unsafe { simd::weighted_sum(w, v, &offs, &mut got) };
                assert_eq!(got, want, "avx2 weighted_sum {ty} hd={hd} span={span}");
            }
            #[cfg(target_arch = "x86_64")]
            if simd::avx512() && hd == 256 {
                let mut got = vec![f32::NAN; hd];
                unsafe { simd::weighted_sum256(w, v, &offs, &mut got) };
                assert_eq!(got, want, "avx512 weighted_sum {ty} hd={hd} span={span}");
            }
            // Several heads over the same rows (1 to 5 heads: the kernels take four at a time)
            // equal the per-head kernels, for the whole row and for a column slice of it.
            for heads in 1..=5 {
                let qh: Vec<Vec<f32>> = (0..heads).map(|h| (0..hd).map(|i| q[(i + 3 * h) % hd] * (1.0 + 0.1 * h as f32)).collect()).collect();
                let wh: Vec<Vec<f32>> = (0..heads).map(|h| (0..span).map(|j| w_all[(j + 5 * h) % w_all.len()]).collect()).collect();
                let qs: Vec<&[f32]> = qh.iter().map(|x| x.as_slice()).collect();
                let want: Vec<Vec<f32>> = qh
                    .iter()
                    .map(|q| {
                        let mut w = vec![f32::NAN; span];
                        scores(q, k, &offs, 0.37, &mut w);
                        w
                    })
                    .collect();
                let mut got = vec![vec![f32::NAN; span]; heads];
                scores_heads(&qs, k, &offs, 0.37, &mut got.iter_mut().map(|x| x.as_mut_slice()).collect::<Vec<_>>());
                assert_eq!(got, want, "scores_heads {ty} hd={hd} span={span} heads={heads}");
                #[cfg(target_arch = "x86_64")]
                for wide in [false, true] {
                    if simd::avx2() && hd.is_multiple_of(16) && (!wide || simd::avx512()) {
                        let mut got = vec![vec![f32::NAN; span]; heads];
                        let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|x| x.as_mut_slice()).collect();
                        for (q4, o4) in qs.chunks(4).zip(outs.chunks_mut(4)) {
                            unsafe { simd::scores_heads_dispatch(q4, k, &offs, 0.37, o4, wide) };
                        }
                        assert_eq!(got, want, "scores_heads wide={wide} {ty} hd={hd} span={span} heads={heads}");
                    }
                }
                let ws: Vec<&[f32]> = wh.iter().map(|x| x.as_slice()).collect();
                for (c0, width) in [(0, hd), (hd / 2, hd - hd / 2)] {
                    let sub: Vec<usize> = offs.iter().map(|&o| o + c0).collect();
                    let want: Vec<Vec<f32>> = wh
                        .iter()
                        .map(|w| {
                            let mut o = vec![f32::NAN; width];
                            weighted_sum(w, v, &sub, &mut o);
                            o
                        })
                        .collect();
                    let mut got = vec![vec![f32::NAN; width]; heads];
                    weighted_sum_heads(&ws, v, &sub, &mut got.iter_mut().map(|x| x.as_mut_slice()).collect::<Vec<_>>());
                    assert_eq!(got, want, "weighted_sum_heads {ty} hd={hd} span={span} heads={heads} cols {c0}+{width}");
                    #[cfg(target_arch = "x86_64")]
                    for wide in [false, true] {
                        if simd::avx2() && width.is_multiple_of(8) && (!wide || simd::avx512()) {
                            let mut got = vec![vec![f32::NAN; width]; heads];
                            let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|x| x.as_mut_slice()).collect();
                            for (w4, o4) in ws.chunks(4).zip(outs.chunks_mut(4)) {
                                unsafe { simd::weighted_sum_heads_dispatch(w4, v, &sub, o4, wide) };
                            }
                            assert_eq!(got, want, "weighted_sum_heads wide={wide} {ty} hd={hd} span={span} heads={heads} cols {c0}+{width}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn attention_kernels_equal_dot_and_axpy() {
        // `scores` and `weighted_sum` must give exactly the per-row `dot` and `axpy` results
        // (decode and prefill share them), for head sizes on and off their SIMD paths, over f32
        // rows and over the f16 rows of the KV cache (widened exactly).
        let mut seed = 7u32;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed % 2001) as f32 / 1000.0 - 1.0
        };
        for hd in [8, 16, 24, 48, 64, 72, 208, 256, 20] {
            let rows = 11;
            let k: Vec<f32> = (0..rows * hd + 5).map(|_| rnd()).collect();
            let v: Vec<f32> = (0..rows * hd + 5).map(|_| rnd()).collect();
            let q: Vec<f32> = (0..hd).map(|_| rnd()).collect();
            let w: Vec<f32> = (0..16).map(|_| rnd()).collect();
            check_attention_kernels(hd, rows, &k, &v, &q, &w);
            let half = |x: &Vec<f32>| x.iter().map(|&y| f16::from_f32(y)).collect::<Vec<f16>>();
            check_attention_kernels(hd, rows, &half(&k), &half(&v), &q, &w);
        }
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn scores_rejects_rows_outside_the_cache() {
        let mut out = [0f32; 1];
        scores(&[1.0; 16], &[0.0f32; 20], &[8], 1.0, &mut out);
    }

}
