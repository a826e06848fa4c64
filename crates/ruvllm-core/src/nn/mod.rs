//! Layers the model files are built from. [`Linear`] is every projection of a decoder block: a
//! weight of any quantization type, an optional bias, and whatever LoRA adapters the request
//! carries, applied in one place. [`AttentionMask`] says which positions attention sees.

pub mod lora;

pub use crate::backend::AttentionMask;
use crate::backend::{Backend, Buf, QWeight};
pub use lora::{AdapterSet, LoraAdapter, Proj};

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

    /// `dst` (`n × rows`) for the `n` rows of `src` (`n × cols`).
    pub fn forward(&self, be: &mut dyn Backend, src: Buf, dst: Buf, n: usize, adapters: &AdapterSet) {
        be.matmul(&self.weight, src, dst, n);
        if let Some(b) = &self.bias {
            be.add_bias(dst, b, n);
        }
        be.add_low_rank(&adapters.terms(self.layer, [self.proj]), src, &[dst], n);
    }

    /// Several projections of the same input in one pass over `src` (the quantized products
    /// are fused; each projection's bias and adapter deltas are added after its product).
    pub fn forward_fused<const N: usize>(be: &mut dyn Backend, ls: [&Linear; N], src: Buf, dsts: [Buf; N], n: usize, adapters: &AdapterSet) {
        be.matmul_fused(&ls.map(|l| &l.weight), src, &dsts, n);
        let biases: Vec<(Buf, &[f32])> = ls.iter().zip(&dsts).filter_map(|(l, &dst)| l.bias.as_deref().map(|b| (dst, b))).collect();
        if !biases.is_empty() {
            be.add_biases(&biases, n);
        }
        // One pass for the adapters of all the projections.
        be.add_low_rank(&adapters.terms(ls[0].layer, ls.map(|l| l.proj)), src, &dsts, n);
    }
}
