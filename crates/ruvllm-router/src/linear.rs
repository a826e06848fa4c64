//! A softmax-regression head over the embeddings (one weight vector and bias per agent), trained
//! on the router's patterns with L2 regularisation and each pattern's weight as sample weight.
//!
//! Why: on 5-fold cross-validation over the catalogue only (`examples/catalogue_cv.rs`), nearest
//! centroids score ~79 % and this head ~85 %; the router combines both (and the k-NN features)
//! with weights fitted on out-of-fold scores. Hyper-parameters (`LAMBDA`, `SCALE`, iterations)
//! were chosen by that catalogue cross-validation, never on the held-out split.

use crate::simd::dot;

/// L2 penalty.
pub const LAMBDA: f32 = 1e-3;
/// Logit scale: `z = SCALE * (w . x + b)`.
pub const SCALE: f32 = 5.0;
/// Full-batch gradient steps from scratch.
pub const ITERS: usize = 300;
/// Steps when warm-starting after feedback.
pub const ITERS_WARM: usize = 60;

/// Agent-major weights: row `a` is `[w_a (dim), b_a]`.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct LinearHead {
    pub agents: usize,
    pub dim: usize,
    pub w: Vec<f32>,
}

impl LinearHead {
    pub fn is_trained(&self) -> bool {
        self.agents > 0 && self.w.len() == self.agents * (self.dim + 1)
    }

    /// Logits `SCALE * (w_a . q + b_a)` for each agent.
    pub fn logits(&self, q: &[f32]) -> Vec<f32> {
        let d = self.dim;
        (0..self.agents).map(|a| SCALE * (dot(&self.w[a * (d + 1)..a * (d + 1) + d], q) + self.w[a * (d + 1) + d])).collect()
    }

    /// Trains on `(vector, label, sample weight)`; starts from `init` when it has the right shape.
    pub fn train(xs: &[(&[f32], usize, f32)], agents: usize, dim: usize, init: Option<&LinearHead>, iters: usize) -> LinearHead {
        let row = dim + 1;
        let mut w = match init {
            Some(h) if h.agents == agents && h.dim == dim && h.w.len() == agents * row => h.w.clone(),
            _ => vec![0.0f32; agents * row],
        };
        let total: f32 = xs.iter().map(|x| x.2).sum();
        if xs.is_empty() || total <= 0.0 {
            return LinearHead { agents, dim, w };
        }
        let mut mom = vec![0.0f32; agents * row];
        let mut g = vec![0.0f32; agents * row];
        let mut z = vec![0.0f32; agents];
        let lr = 0.5f32;
        for _ in 0..iters {
            g.iter_mut().for_each(|v| *v = 0.0);
            for &(x, y, sw) in xs {
                for a in 0..agents {
                    z[a] = SCALE * (dot(&w[a * row..a * row + dim], x) + w[a * row + dim]);
                }
                let m = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut s = 0.0;
                for v in z.iter_mut() {
                    *v = (*v - m).exp();
                    s += *v;
                }
                for a in 0..agents {
                    let r = sw * SCALE * (z[a] / s - if a == y { 1.0 } else { 0.0 });
                    if r == 0.0 {
                        continue;
                    }
                    let ga = &mut g[a * row..(a + 1) * row];
                    for (gj, xj) in ga[..dim].iter_mut().zip(x) {
                        *gj += r * xj;
                    }
                    ga[dim] += r;
                }
            }
            for a in 0..agents {
                for j in 0..row {
                    let i = a * row + j;
                    let reg = if j < dim { LAMBDA * w[i] } else { 0.0 };
                    mom[i] = 0.9 * mom[i] + g[i] / total + reg;
                    w[i] -= lr * mom[i];
                }
            }
        }
        LinearHead { agents, dim, w }
    }
}
