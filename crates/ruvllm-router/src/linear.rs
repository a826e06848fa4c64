//! A softmax-regression head over the embeddings plus sparse lexical features (`lexical.rs`):
//! per agent one weight vector over the embedding, a bias and one weight per vocabulary word,
//! trained on the router's patterns with L2 regularisation and each pattern's weight as sample
//! weight.
//!
//! A row is either positive (`-log p(label)`) or negative: a task that failed with agent `label`
//! (`-log(1 - p(label))`), which pushes that agent down for this task and tasks like it without
//! saying who should have had it.
//!
//! Why: on 5-fold cross-validation over the catalogue only (`ruvllm-eval`'s `examples/catalogue_cv.rs`), nearest
//! centroids score ~79 %, this head on the embedding alone ~85.7 %, with the lexical features
//! ~92 %; the router combines head and centroids with weights fitted on out-of-fold scores.
//! Hyper-parameters (`LAMBDA`, `SCALE`, iterations, `lexical::ALPHA`) were chosen by that
//! catalogue cross-validation, never on the held-out split.

use crate::simd::{axpy, dot};

/// L2 penalty (embedding and word weights; not the bias).
pub const LAMBDA: f32 = 1e-3;
/// Logit scale: `z = SCALE * (w . x + b + u . lex)`.
pub const SCALE: f32 = 5.0;
/// Full-batch gradient steps from scratch (also after each outcome: the head is always trained
/// from scratch, so it is a function of its rows alone).
pub const ITERS: usize = 300;

/// One training row.
pub struct Row<'a> {
    pub x: &'a [f32],
    pub lex: &'a [(u32, f32)],
    pub label: usize,
    pub weight: f32,
    /// A failure of `label` on this task rather than a success.
    pub negative: bool,
}

/// Agent-major embedding weights: row `a` is `[w_a (dim), b_a]`; word weights word-major:
/// `lex[word * agents + a]`.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct LinearHead {
    pub agents: usize,
    pub dim: usize,
    pub w: Vec<f32>,
    #[serde(default)]
    pub lex: Vec<f32>,
}

impl LinearHead {
    pub fn is_trained(&self) -> bool {
        self.agents > 0 && self.w.len() == self.agents * (self.dim + 1)
    }

    /// Logits `SCALE * (w_a . q + b_a + sum u_{word,a} * f_word)` for each agent. Words beyond
    /// the head's vocabulary count zero.
    pub fn logits(&self, q: &[f32], lex: &[(u32, f32)]) -> Vec<f32> {
        let mut z = vec![0.0f32; self.agents];
        self.logits_into(q, lex, &mut z);
        z
    }

    fn logits_into(&self, q: &[f32], lex: &[(u32, f32)], z: &mut [f32]) {
        let (d, na) = (self.dim, self.agents);
        for (a, za) in z.iter_mut().enumerate().take(na) {
            *za = dot(&self.w[a * (d + 1)..a * (d + 1) + d], q) + self.w[a * (d + 1) + d];
        }
        for &(j, v) in lex {
            if let Some(u) = self.lex.get(j as usize * na..(j as usize + 1) * na) {
                for a in 0..na {
                    z[a] += u[a] * v;
                }
            }
        }
        z.iter_mut().for_each(|x| *x *= SCALE);
    }

    /// Trains on `rows` over a vocabulary of `vocab` words, from zero weights, for `ITERS`
    /// full-batch steps.
    pub fn train(rows: &[Row], agents: usize, dim: usize, vocab: usize) -> LinearHead {
        let row = dim + 1;
        let mut h = LinearHead { agents, dim, w: vec![0.0f32; agents * row], lex: vec![0.0f32; vocab * agents] };
        let total: f32 = rows.iter().map(|x| x.weight).sum();
        if rows.is_empty() || total <= 0.0 {
            return h;
        }
        let mut mom = vec![0.0f32; agents * row];
        let mut g = vec![0.0f32; agents * row];
        let mut mom_l = vec![0.0f32; vocab * agents];
        let mut g_l = vec![0.0f32; vocab * agents];
        let mut z = vec![0.0f32; agents];
        let mut r = vec![0.0f32; agents];
        let lr = 0.5f32;
        for _ in 0..ITERS {
            g.iter_mut().for_each(|v| *v = 0.0);
            g_l.iter_mut().for_each(|v| *v = 0.0);
            for rw in rows {
                h.logits_into(rw.x, rw.lex, &mut z);
                let m = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut s = 0.0;
                for v in z.iter_mut() {
                    *v = (*v - m).exp();
                    s += *v;
                }
                z.iter_mut().for_each(|v| *v /= s);
                let y = rw.label;
                if rw.negative {
                    // d/dz_a of -log(1 - p_y) = p_y (delta_ay - p_a) / (1 - p_y).
                    let py = z[y];
                    let c = py / (1.0 - py).max(1e-6);
                    for a in 0..agents {
                        r[a] = rw.weight * SCALE * c * (if a == y { 1.0 } else { 0.0 } - z[a]);
                    }
                } else {
                    for a in 0..agents {
                        r[a] = rw.weight * SCALE * (z[a] - if a == y { 1.0 } else { 0.0 });
                    }
                }
                for a in 0..agents {
                    if r[a] == 0.0 {
                        continue;
                    }
                    let ga = &mut g[a * row..(a + 1) * row];
                    axpy(&mut ga[..dim], r[a], rw.x);
                    ga[dim] += r[a];
                }
                for &(j, v) in rw.lex {
                    let gl = &mut g_l[j as usize * agents..(j as usize + 1) * agents];
                    for a in 0..agents {
                        gl[a] += r[a] * v;
                    }
                }
            }
            for a in 0..agents {
                for j in 0..row {
                    let i = a * row + j;
                    let reg = if j < dim { LAMBDA * h.w[i] } else { 0.0 };
                    mom[i] = 0.9 * mom[i] + g[i] / total + reg;
                    h.w[i] -= lr * mom[i];
                }
            }
            for i in 0..vocab * agents {
                mom_l[i] = 0.9 * mom_l[i] + g_l[i] / total + LAMBDA * h.lex[i];
                h.lex[i] -= lr * mom_l[i];
            }
        }
        h
    }
}
