//! Layers the model files are built from. [`Linear`] is every projection of a decoder block: a
//! weight of any quantization type, an optional bias, and whatever LoRA adapters the request
//! carries, applied in one place. [`AttentionMask`] says which positions attention sees.

pub mod lora;

pub use crate::backend::AttentionMask;
use crate::backend::{Backend, Buf, QWeight};
pub use lora::{AdapterSet, LoraAdapter, Proj};

/// `y = W·x + b + Σᵢ sᵢ · Bᵢ(Aᵢ·x)` for one projection of block `layer`. The weight stays in its
/// quantized form; adapters come with each call, so one model serves any set of them.
#[derive(Clone)]
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

    /// This projection with `scale · B·A` of `pair` folded into its weight, which is stored
    /// again as Q8_0 (F32 where the rows are not whole Q8_0 blocks): a copy that runs without
    /// the adapter's low-rank products. (An F16 copy scores the same but runs a GPU's many-row
    /// products on its float GEMM, at a fifth of the speed.)
    pub fn merged(&self, pair: &lora::LoraPair, scale: f32) -> crate::Result<Linear> {
        use crate::backend::{cpu::quant, WeightData};
        use crate::gguf::GgmlType;
        let w = &self.weight;
        let (rows, cols, rank) = (w.rows, w.cols, pair.rank);
        if (pair.d_out, pair.d_in) != (rows, cols) {
            return Err(crate::Error::Internal(format!("merging {}×{} factors into a {rows}×{cols} weight", pair.d_out, pair.d_in)));
        }
        let ty = if cols.is_multiple_of(GgmlType::Q8_0.block_size()) { GgmlType::Q8_0 } else { GgmlType::F32 };
        let a: Vec<f32> = pair.a.iter().map(|v| v.to_f32()).collect();
        let mut bytes = Vec::with_capacity(rows * ty.bytes_for(cols as u64).unwrap_or(0) as usize);
        let mut row = vec![0f32; cols];
        for r in 0..rows {
            w.dequantize_row(r, &mut row);
            for k in 0..rank {
                let c = scale * pair.bt[k * rows + r].to_f32();
                for (x, &ak) in row.iter_mut().zip(&a[k * cols..(k + 1) * cols]) {
                    *x += c * ak;
                }
            }
            bytes.extend_from_slice(&quant::quantize(ty, &row));
        }
        let weight = QWeight::new(ty, rows, cols, WeightData::Owned(std::sync::Arc::new(bytes))).map_err(crate::Error::Internal)?;
        Ok(Linear { weight, bias: self.bias.clone(), layer: self.layer, proj: self.proj })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{cpu::quant, WeightData};
    use crate::gguf::GgmlType;
    use std::sync::Arc;

    /// The merged weight is the base weight plus `scale · B·A`, to within Q8_0's rounding (half
    /// a step of each 32-block's largest magnitude / 127, and the step's own f16 rounding); a
    /// wrong orientation of either factor or a missing scale is off by far more.
    #[test]
    fn a_merged_projection_is_the_weight_plus_the_scaled_low_rank_product() {
        let (rows, cols, rank, scale) = (48, 96, 5, 0.75f32);
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        let w: Vec<f32> = (0..rows * cols).map(|_| next()).collect();
        let a: Vec<f32> = (0..rank * cols).map(|_| next()).collect();
        let b: Vec<f32> = (0..rows * rank).map(|_| next()).collect();
        let weight = QWeight::new(GgmlType::Q4_0, rows, cols, WeightData::Owned(Arc::new(quant::quantize(GgmlType::Q4_0, &w)))).unwrap();
        let lin = Linear::new(weight, None, 0, Proj::Q);
        let pair = lora::LoraPair::new(a, &b, rank, cols, rows);
        let merged = lin.merged(&pair, scale).unwrap();
        assert_eq!((merged.weight.ty, merged.weight.rows, merged.weight.cols), (GgmlType::Q8_0, rows, cols));
        let (mut base, mut got) = (vec![0f32; cols], vec![0f32; cols]);
        for r in 0..rows {
            lin.weight.dequantize_row(r, &mut base);
            merged.weight.dequantize_row(r, &mut got);
            let want: Vec<f32> =
                (0..cols).map(|c| base[c] + scale * (0..rank).map(|k| pair.bt[k * rows + r].to_f32() * pair.a[k * cols + c].to_f32()).sum::<f32>()).collect();
            for (blk_want, blk_got) in want.chunks(32).zip(got.chunks(32)) {
                let step = blk_want.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
                for (x, y) in blk_want.iter().zip(blk_got) {
                    assert!((x - y).abs() <= 0.6 * step + 1e-6, "row {r}: {y} for {x} (step {step})");
                }
            }
        }
    }
}
