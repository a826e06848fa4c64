//! The small dense linear algebra the aggregation needs, in f64: thin QR by modified
//! Gram–Schmidt (with a second orthogonalisation pass) and the one-sided Jacobi SVD (Hestenes),
//! and from them the SVD of a low-rank product `P·Q` without forming it.

/// Thin QR of the `cols` vectors in `v` (each of the same length): returns `Q` (as columns) and
/// `R` (`cols × cols`, row-major, upper triangular) with `v_j = Σ_k Q_k · R[k][j]`. A column
/// that is (numerically) in the span of the earlier ones gets a zero `Q` column and a zero
/// diagonal, so the product still reproduces the input.
pub fn qr(v: &[Vec<f64>]) -> (Vec<Vec<f64>>, Vec<f64>) {
    let n = v.len();
    let mut q: Vec<Vec<f64>> = Vec::with_capacity(n);
    let mut r = vec![0.0f64; n * n];
    for (j, col) in v.iter().enumerate() {
        let mut w = col.clone();
        let norm0 = dot(&w, &w).sqrt();
        // Two passes: one Gram–Schmidt pass loses orthogonality when columns are nearly
        // dependent; a second one restores it to working precision.
        for _ in 0..2 {
            for (k, qk) in q.iter().enumerate() {
                let c = dot(qk, &w);
                r[k * n + j] += c;
                axpy(-c, qk, &mut w);
            }
        }
        let norm = dot(&w, &w).sqrt();
        if norm > 1e-13 * norm0.max(f64::MIN_POSITIVE) && norm > 0.0 {
            r[j * n + j] = norm;
            w.iter_mut().for_each(|x| *x /= norm);
        } else {
            w.iter_mut().for_each(|x| *x = 0.0);
        }
        q.push(w);
    }
    (q, r)
}

/// SVD of the square `n × n` row-major `m` by one-sided Jacobi rotations: returns
/// `(U columns, σ, V columns)` with `m = Σ_j σ_j u_j v_jᵀ`, σ sorted descending.
pub fn svd_square(m: &[f64], n: usize) -> (Vec<Vec<f64>>, Vec<f64>, Vec<Vec<f64>>) {
    let mut u: Vec<Vec<f64>> = (0..n).map(|j| (0..n).map(|i| m[i * n + j]).collect()).collect();
    let mut v: Vec<Vec<f64>> = (0..n).map(|j| (0..n).map(|i| if i == j { 1.0 } else { 0.0 }).collect()).collect();
    for _sweep in 0..60 {
        let mut rotated = false;
        for i in 0..n {
            for j in i + 1..n {
                let (a, b, g) = (dot(&u[i], &u[i]), dot(&u[j], &u[j]), dot(&u[i], &u[j]));
                if g.abs() <= 1e-15 * (a * b).sqrt() || g == 0.0 {
                    continue;
                }
                rotated = true;
                let zeta = (b - a) / (2.0 * g);
                let t = zeta.signum() / (zeta.abs() + (1.0 + zeta * zeta).sqrt());
                let c = 1.0 / (1.0 + t * t).sqrt();
                let s = c * t;
                rotate(&mut u, i, j, c, s);
                rotate(&mut v, i, j, c, s);
            }
        }
        if !rotated {
            break;
        }
    }
    let mut sigma: Vec<f64> = u.iter().map(|c| dot(c, c).sqrt()).collect();
    for (c, &s) in u.iter_mut().zip(&sigma) {
        if s > 0.0 {
            c.iter_mut().for_each(|x| *x /= s);
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| sigma[b].total_cmp(&sigma[a]));
    let u = order.iter().map(|&k| u[k].clone()).collect();
    let v = order.iter().map(|&k| v[k].clone()).collect();
    sigma = order.iter().map(|&k| sigma[k]).collect();
    (u, sigma, v)
}

/// SVD of `P·Q` where `P` is given by its `k` columns (length `m`) and `Q` by its `k` rows
/// (length `n`): QR of both sides, then the SVD of the `k × k` core `R_P·R_Qᵀ`. Returns
/// `(u columns, σ, v columns)`, σ descending, `P·Q = Σ σ_j u_j v_jᵀ`. Costs `O((m + n)·k²)`.
pub fn lowrank_svd(p_cols: &[Vec<f64>], q_rows: &[Vec<f64>]) -> (Vec<Vec<f64>>, Vec<f64>, Vec<Vec<f64>>) {
    let k = p_cols.len();
    let (qp, rp) = qr(p_cols);
    let (qq, rq) = qr(q_rows);
    let mut core = vec![0.0f64; k * k];
    for i in 0..k {
        for j in 0..k {
            core[i * k + j] = (0..k).map(|l| rp[i * k + l] * rq[j * k + l]).sum();
        }
    }
    let (cu, sigma, cv) = svd_square(&core, k);
    let lift = |basis: &[Vec<f64>], c: &[f64], len: usize| {
        let mut out = vec![0.0f64; len];
        for (b, &w) in basis.iter().zip(c) {
            axpy(w, b, &mut out);
        }
        out
    };
    let m = p_cols.first().map_or(0, Vec::len);
    let n = q_rows.first().map_or(0, Vec::len);
    let u = cu.iter().map(|c| lift(&qp, c, m)).collect();
    let v = cv.iter().map(|c| lift(&qq, c, n)).collect();
    (u, sigma, v)
}

/// The best rank-`rank` approximation of the dense `rows × cols` row-major `m`, by the
/// randomized range finder with two power iterations (Halko, Martinsson and Tropp, "Finding
/// Structure with Randomness", 2011, Alg. 4.4) and then [`lowrank_svd`] of `Q·(Qᵀm)`.
/// `gauss` draws standard normal numbers. Returns `(u columns, σ, v columns)`, `rank` of each.
pub fn truncated_svd_dense(m: &[f64], rows: usize, cols: usize, rank: usize, gauss: &mut dyn FnMut() -> f64) -> (Vec<Vec<f64>>, Vec<f64>, Vec<Vec<f64>>) {
    let k = (rank + 8).min(rows).min(cols);
    let times = |x: &[f64]| -> Vec<f64> { (0..rows).map(|i| dot(&m[i * cols..(i + 1) * cols], x)).collect() };
    let times_t = |y: &[f64]| -> Vec<f64> {
        let mut out = vec![0.0f64; cols];
        for (i, &c) in y.iter().enumerate() {
            axpy(c, &m[i * cols..(i + 1) * cols], &mut out);
        }
        out
    };
    let mut y: Vec<Vec<f64>> = (0..k).map(|_| times(&(0..cols).map(|_| gauss()).collect::<Vec<_>>())).collect();
    for _ in 0..2 {
        let (q, _) = qr(&y);
        let (z, _) = qr(&q.iter().map(|c| times_t(c)).collect::<Vec<_>>());
        y = z.iter().map(|c| times(c)).collect();
    }
    let (q, _) = qr(&y);
    let b_rows: Vec<Vec<f64>> = q.iter().map(|c| times_t(c)).collect();
    let (mut u, mut s, mut v) = lowrank_svd(&q, &b_rows);
    u.truncate(rank);
    s.truncate(rank);
    v.truncate(rank);
    (u, s, v)
}

fn rotate(cols: &mut [Vec<f64>], i: usize, j: usize, c: f64, s: f64) {
    let (lo, hi) = cols.split_at_mut(j);
    for (x, y) in lo[i].iter_mut().zip(hi[0].iter_mut()) {
        let (a, b) = (*x, *y);
        *x = c * a - s * b;
        *y = s * a + c * b;
    }
}

pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

pub fn axpy(c: f64, x: &[f64], y: &mut [f64]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o += c * v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn rand_cols(k: usize, len: usize, seed: u64) -> Vec<Vec<f64>> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..k).map(|_| (0..len).map(|_| rng.gen_range(-1.0..1.0)).collect()).collect()
    }

    #[test]
    fn lowrank_svd_reconstructs_and_is_orthonormal() {
        let (p, q) = (rand_cols(5, 9, 1), rand_cols(5, 7, 2));
        let (u, s, v) = lowrank_svd(&p, &q);
        for i in 0..9 {
            for j in 0..7 {
                let want: f64 = (0..5).map(|k| p[k][i] * q[k][j]).sum();
                let got: f64 = (0..5).map(|k| s[k] * u[k][i] * v[k][j]).sum();
                assert!((want - got).abs() < 1e-12, "({i},{j}) {want} vs {got}");
            }
        }
        for a in 0..5 {
            for b in 0..5 {
                let e = if a == b { 1.0 } else { 0.0 };
                assert!((dot(&u[a], &u[b]) - e).abs() < 1e-12 && (dot(&v[a], &v[b]) - e).abs() < 1e-12);
            }
        }
        assert!(s.windows(2).all(|w| w[0] >= w[1]));
    }

    #[test]
    fn randomized_svd_recovers_a_low_rank_matrix_under_small_noise() {
        let (p, q) = (rand_cols(3, 40, 5), rand_cols(3, 30, 6));
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let m: Vec<f64> = (0..40 * 30).map(|x| (0..3).map(|k| p[k][x / 30] * q[k][x % 30]).sum::<f64>() + 1e-9 * rng.gen_range(-1.0..1.0)).collect();
        let (u, s, v) = truncated_svd_dense(&m, 40, 30, 3, &mut || rng.gen_range(-1.0..1.0));
        let err: f64 = (0..40 * 30).map(|x| m[x] - (0..3).map(|k| s[k] * u[k][x / 30] * v[k][x % 30]).sum::<f64>()).map(|d| d * d).sum();
        let norm: f64 = m.iter().map(|x| x * x).sum();
        assert!((err / norm).sqrt() < 1e-8, "relative error {}", (err / norm).sqrt());
    }

    #[test]
    fn dependent_columns_keep_the_product() {
        // The third column of P is the sum of the first two: rank 2, not 3.
        let mut p = rand_cols(2, 6, 3);
        p.push(p[0].iter().zip(&p[1]).map(|(a, b)| a + b).collect());
        let q = rand_cols(3, 4, 4);
        let (u, s, v) = lowrank_svd(&p, &q);
        assert!(s[2] < 1e-12 * s[0], "third singular value {}", s[2]);
        for i in 0..6 {
            for j in 0..4 {
                let want: f64 = (0..3).map(|k| p[k][i] * q[k][j]).sum();
                let got: f64 = (0..3).map(|k| s[k] * u[k][i] * v[k][j]).sum();
                assert!((want - got).abs() < 1e-12);
            }
        }
    }
}
