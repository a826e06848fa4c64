//! Adam (Kingma & Ba, 2015) over a flat parameter vector, with global-norm gradient clipping.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Adam {
    pub lr: f32,
    pub step: u64,
    #[serde(skip)]
    pub m: Vec<f32>,
    #[serde(skip)]
    pub v: Vec<f32>,
}

const B1: f32 = 0.9;
const B2: f32 = 0.999;
const EPS: f32 = 1e-8;

impl Adam {
    pub fn new(len: usize, lr: f32) -> Self {
        Adam { lr, step: 0, m: vec![0.0; len], v: vec![0.0; len] }
    }

    /// One step on `w` with gradient `g`, first scaled so its norm is at most `clip`; returns
    /// the gradient's norm before clipping.
    pub fn step(&mut self, w: &mut [f32], g: &[f32], clip: f32) -> f32 {
        let norm = g.iter().map(|x| (*x as f64) * (*x as f64)).sum::<f64>().sqrt() as f32;
        let k = if norm > clip && norm > 0.0 { clip / norm } else { 1.0 };
        self.step += 1;
        let t = self.step as i32;
        let (c1, c2) = (1.0 - B1.powi(t), 1.0 - B2.powi(t));
        for i in 0..w.len() {
            let gi = g[i] * k;
            self.m[i] = B1 * self.m[i] + (1.0 - B1) * gi;
            self.v[i] = B2 * self.v[i] + (1.0 - B2) * gi * gi;
            w[i] -= self.lr * (self.m[i] / c1) / ((self.v[i] / c2).sqrt() + EPS);
        }
        norm
    }

    /// Forgets the moments of `range` (after those parameters were replaced).
    pub fn reset(&mut self, range: std::ops::Range<usize>) {
        self.m[range.clone()].iter_mut().for_each(|x| *x = 0.0);
        self.v[range].iter_mut().for_each(|x| *x = 0.0);
    }
}
