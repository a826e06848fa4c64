//! Layers the model files are built from. [`Linear`] is every projection of a decoder block: a
//! weight of any quantization type, an optional bias, and whatever LoRA adapters the request
//! carries, applied in one place. [`AttentionMask`] says which positions attention sees.

pub mod lora;
pub mod mask;

use crate::backend::cpu::matmul::{matmul, matmul_fused};
use crate::backend::cpu::{ops, QWeight};
use crate::runtime::ThreadPool;
pub use lora::{AdapterSet, LoraAdapter, Proj};
pub use mask::AttentionMask;

/// `y = W·x + b + Σᵢ sᵢ · Bᵢ(Aᵢ·x)` for one projection of block `layer`. The weight stays in its
/// quantized form; adapters come with each call, so one model serves any set of them.
pub struct Linear {
    pub weight: QWeight,
    pub bias: Option<Vec<f32>>,
    /// Which projection of which block this is: how adapters find their factors.
    pub layer: usize,
    pub proj: Proj,
}

impl Linear {
    pub fn new(weight: QWeight, bias: Option<Vec<f32>>, layer: usize, proj: Proj) -> Self {
        Linear { weight, bias, layer, proj }
    }

    /// `y` (`n × rows`) for the `n` rows of `x` (`n × cols`).
    pub fn forward(&self, pool: &ThreadPool, x: &[f32], n: usize, y: &mut [f32], adapters: &AdapterSet) {
        matmul(pool, &self.weight, x, n, y);
        self.add_bias(n, y);
        adapters.apply(pool, self.layer, [self.proj], x, n, &mut [y]);
    }

    /// Several projections of the same input in one pass over `x` (the quantized products are
    /// fused; each projection's bias and adapter deltas are added after its product).
    pub fn forward_fused<const N: usize>(pool: &ThreadPool, ls: [&Linear; N], x: &[f32], n: usize, ys: &mut [&mut [f32]; N], adapters: &AdapterSet) {
        matmul_fused(pool, &ls.map(|l| &l.weight), x, n, ys);
        for (l, y) in ls.iter().zip(ys.iter_mut()) {
            l.add_bias(n, y);
        }
        // One pass over the pool for the adapters of all the projections.
        adapters.apply(pool, ls[0].layer, ls.map(|l| l.proj), x, n, ys);
    }

    fn add_bias(&self, n: usize, y: &mut [f32]) {
        if let Some(b) = &self.bias {
            for row in y[..n * self.weight.rows].chunks_exact_mut(self.weight.rows) {
                ops::add_inplace(row, b);
            }
        }
    }
}
