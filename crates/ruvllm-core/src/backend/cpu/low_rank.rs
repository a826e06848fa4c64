//! Low-rank deltas (LoRA) on the CPU: `y[t] += s · B·(A·x[t])` with the factors in half
//! precision, all of a call's terms in one pass over the thread pool.

use super::ops;
use crate::backend::{LowRank, LowRankTerms};
use crate::runtime::{SharedMut, ThreadPool};

/// Most outputs one call adds to (a fused Q/K/V projection has three).
pub const MAX_OUTS: usize = 4;

impl LowRank<'_> {
    /// `h[t] = A·x[t]` (`n × rank`) for the `n` rows of `x` (the model `add` splits over tasks).
    #[cfg(test)]
    fn down(&self, x: &[f32], n: usize, h: &mut [f32]) {
        for t in 0..n {
            let xt = &x[t * self.d_in..(t + 1) * self.d_in];
            for j in 0..self.rank {
                h[t * self.rank + j] = ops::dot_elem(xt, &self.a[j * self.d_in..(j + 1) * self.d_in]);
            }
        }
    }

    /// Columns `c0..c1` of `y[t] += scale · B·h[t]` for the `n` rows of `h` (`n × rank`); `y`
    /// points at row 0 of `n × d_out`.
    ///
    /// # Safety
    /// `y` must be valid for `n * d_out` floats, and no other thread may touch columns
    /// `c0..c1` of its rows meanwhile.
    unsafe fn up_columns(&self, h: &[f32], n: usize, scale: f32, y: SharedMut, c0: usize, c1: usize) {
        for t in 0..n {
            // SAFETY: the caller guarantees the rows exist and that these columns are ours.
            let yt = unsafe { std::slice::from_raw_parts_mut(y.ptr().add(t * self.d_out + c0), c1 - c0) };
            for j in 0..self.rank {
                ops::axpy_elem(yt, scale * h[t * self.rank + j], &self.bt[j * self.d_out + c0..j * self.d_out + c1]);
            }
        }
    }

    /// Output columns of task `i` of `parts` when `B·h` is split by columns: whole 16-float
    /// vectors (so each element is summed as by an `axpy` over the full row), the last task
    /// taking the tail.
    fn columns(&self, i: usize, parts: usize) -> (usize, usize) {
        let width = self.d_out.div_ceil(parts).next_multiple_of(16);
        ((i * width).min(self.d_out), ((i + 1) * width).min(self.d_out))
    }

    /// `y[t] += scale · B·(A·x[t])` for the `n` rows of `x` (`n × d_in`) and `y` (`n × d_out`).
    pub(crate) fn apply(&self, x: &[f32], n: usize, scale: f32, y: &mut [f32]) {
        let mut h = [0.0f32; 64];
        let mut big = Vec::new();
        let h: &mut [f32] = if self.rank <= h.len() {
            &mut h[..self.rank]
        } else {
            big.resize(self.rank, 0.0);
            &mut big
        };
        for t in 0..n {
            let xt = &x[t * self.d_in..(t + 1) * self.d_in];
            for (j, hj) in h.iter_mut().enumerate() {
                *hj = ops::dot_elem(xt, &self.a[j * self.d_in..(j + 1) * self.d_in]);
            }
            let yt = &mut y[t * self.d_out..(t + 1) * self.d_out];
            for (j, &hj) in h.iter().enumerate() {
                ops::axpy_elem(yt, scale * hj, &self.bt[j * self.d_out..(j + 1) * self.d_out]);
            }
        }
    }
}

/// `ys[k] += scale · B(A·x)` for every term `(k, factors, scale)` (all of the same input `x`,
/// `n` rows; `ys[k]` is `n × d_out`), in one pass over the thread pool: with several tokens
/// each task takes a share of them; with fewer tokens than threads (decode), every `A·x` is
/// computed first and each task adds its share of the output columns. Per element the deltas
/// are added in the terms' order with the same operations as `LowRank::apply`, so the result
/// does not depend on the threads.
///
/// Panics if there are more than [`MAX_OUTS`] outputs.
pub fn add(pool: &ThreadPool, terms: &LowRankTerms, x: &[f32], n: usize, ys: &mut [&mut [f32]]) {
    assert!(ys.len() <= MAX_OUTS, "low_rank::add: {} outputs", ys.len());
    if terms.is_empty() {
        return;
    }
    let parts = pool.threads();
    if parts <= 1 {
        for (k, pair, s) in terms.iter() {
            pair.apply(x, n, s, ys[k]);
        }
        return;
    }
    let outs: [SharedMut; MAX_OUTS] = std::array::from_fn(|k| SharedMut(ys.get_mut(k).map_or(std::ptr::null_mut(), |y| y.as_mut_ptr())));
    if n >= parts {
        pool.for_each(parts, &|i| {
            let (t0, t1) = (i * n / parts, (i + 1) * n / parts);
            for (k, pair, s) in terms.iter() {
                // SAFETY: task i owns rows t0..t1 of every output, disjoint across tasks.
                let y = unsafe { std::slice::from_raw_parts_mut(outs[k].ptr().add(t0 * pair.d_out), (t1 - t0) * pair.d_out) };
                pair.apply(&x[t0 * pair.d_in..t1 * pair.d_in], t1 - t0, s, y);
            }
        });
        return;
    }
    // h of item m at hs[offs[m]..][..n * rank].
    let total: usize = terms.iter().map(|(_, p, _)| n * p.rank).sum();
    let (mut stack, mut heap) = ([0.0f32; 1024], Vec::new());
    let hs: &mut [f32] = if total <= stack.len() {
        &mut stack[..total]
    } else {
        heap.resize(total, 0.0);
        &mut heap
    };
    // Every `A·x` first, its dot products split over the tasks (each entry is one `dot_elem`,
    // as in `down`, so the split does not change it).
    let hp = SharedMut(hs.as_mut_ptr());
    pool.for_each(parts, &|i| {
        let (e0, e1) = (i * total / parts, (i + 1) * total / parts);
        let mut at = 0;
        for (_, pair, _) in terms.iter() {
            let len = n * pair.rank;
            for e in e0.max(at)..e1.min(at + len) {
                let (t, j) = ((e - at) / pair.rank, (e - at) % pair.rank);
                let v = ops::dot_elem(&x[t * pair.d_in..(t + 1) * pair.d_in], &pair.a[j * pair.d_in..(j + 1) * pair.d_in]);
                // SAFETY: task i alone writes entries e0..e1 of `hs`, which outlives the pass.
                unsafe { *hp.ptr().add(e) = v };
            }
            at += len;
        }
    });
    let hs: &[f32] = hs;
    pool.for_each(parts, &|i| {
        let mut at = 0;
        for (k, pair, s) in terms.iter() {
            let (c0, c1) = pair.columns(i, parts);
            if c0 < c1 {
                // SAFETY: `outs[k]` is `n × d_out` (from `ys[k]`); task i owns columns c0..c1.
                unsafe { pair.up_columns(&hs[at..at + n * pair.rank], n, s, outs[k], c0, c1) };
            }
            at += n * pair.rank;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    /// A pair from `A` (`rank × d_in`) and `B` (`d_out × rank`), row-major, rounded to half.
    fn factors(a: &[f32], b: &[f32], rank: usize, d_out: usize) -> (Vec<f16>, Vec<f16>) {
        let mut bt = vec![f16::ZERO; rank * d_out];
        for o in 0..d_out {
            for j in 0..rank {
                bt[j * d_out + o] = f16::from_f32(b[o * rank + j]);
            }
        }
        (a.iter().map(|&v| f16::from_f32(v)).collect(), bt)
    }

    #[test]
    fn apply_equals_the_naive_product() {
        let (r, d_in, d_out, n) = (3, 5, 4, 2);
        // Values exact in half precision, as the pair holds them.
        let a: Vec<f32> = (0..r * d_in).map(|i| f16::from_f32((i as f32 * 0.37).sin()).to_f32()).collect();
        let b: Vec<f32> = (0..d_out * r).map(|i| f16::from_f32((i as f32 * 0.11).cos()).to_f32()).collect();
        let x: Vec<f32> = (0..n * d_in).map(|i| i as f32 * 0.1 - 0.3).collect();
        let (fa, fbt) = factors(&a, &b, r, d_out);
        let pair = LowRank { rank: r, d_in, d_out, a: &fa, bt: &fbt, id: 0 };
        let mut y = vec![1.0f32; n * d_out];
        pair.apply(&x, n, 0.5, &mut y);
        for t in 0..n {
            let h: Vec<f32> = (0..r).map(|j| (0..d_in).map(|i| a[j * d_in + i] * x[t * d_in + i]).sum()).collect();
            for o in 0..d_out {
                let want = 1.0 + 0.5 * (0..r).map(|j| b[o * r + j] * h[j]).sum::<f32>();
                assert!((y[t * d_out + o] - want).abs() < 1e-5, "t {t} o {o}: {} vs {want}", y[t * d_out + o]);
            }
        }
    }

    #[test]
    fn column_split_is_bit_identical_to_apply() {
        let (r, d_in, d_out) = (5, 64, 200);
        let a: Vec<f32> = (0..r * d_in).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..d_out * r).map(|i| (i as f32 * 0.11).cos()).collect();
        let (fa, fbt) = factors(&a, &b, r, d_out);
        let pair = LowRank { rank: r, d_in, d_out, a: &fa, bt: &fbt, id: 0 };
        for parts in [1, 2, 3, 5] {
            for n in [1, 2, 7] {
                let x: Vec<f32> = (0..n * d_in).map(|i| (i as f32 * 0.013).cos()).collect();
                let (mut y1, mut y2) = (vec![0.5f32; n * d_out], vec![0.5f32; n * d_out]);
                pair.apply(&x, n, 0.7, &mut y1);
                let mut h = vec![0.0; n * r];
                pair.down(&x, n, &mut h);
                let mut covered = 0;
                for i in 0..parts {
                    let (c0, c1) = pair.columns(i, parts);
                    covered += c1 - c0;
                    // SAFETY: y2 is n × d_out and nothing else touches it.
                    unsafe { pair.up_columns(&h, n, 0.7, SharedMut(y2.as_mut_ptr()), c0, c1) };
                }
                assert_eq!(covered, d_out);
                assert!(y1.iter().zip(&y2).all(|(p, q)| p.to_bits() == q.to_bits()), "parts {parts} n {n}");
            }
        }
    }
}
