//! The reference mode's launches (`RUVLLM_CUDA_EXACT=1`, `reference.cu`): every operation as
//! the CPU's scalar path computes it.

use super::*;

impl CudaBackend {
    /// Reference mode: `y = W·x` for `n` rows as the CPU's scalar path computes it
    /// (`reference.cu`): the activations quantized as `matmul` does for the weight's type
    /// (Q8_0 blocks, or Q8_K for the K-quants) into the activation buffer, then one thread per
    /// (row, token) with the scalar dot product's sums in order.
    pub(super) fn ref_product(&mut self, w: &QWeight, x: CUdeviceptr, y: CUdeviceptr, n: usize) {
        let (rows, cols) = (w.rows, w.cols);
        let Some(suffix) = self.ref_suffix(w.ty, "weights") else { return };
        // How `matmul` rounds the activations (as `act_kernel` says): (block elements, block
        // bytes, kernel); none for the float formats.
        let quant = act_kernel(w.ty).map(|k| if k == "act_q8_k" { (256, 292, "ref_act_q8k") } else { (32, 36, "ref_act_q8") });
        let Some((wp, rb)) = self.weight(w) else { return };
        let act = Self::ptr_of(&self.act_buf);
        let mut stride = 0;
        if let Some((block, block_bytes, kernel)) = quant {
            let blocks = n * cols / block;
            self.push(kernel, [Self::blocks(blocks, 128), 1, 1], 128, Args::new().ptr(x).ptr(act).i32(blocks as i32));
            stride = cols / block * block_bytes;
        }
        let args = Args::new().ptr(wp).i64(rb as i64).i32(rows as i32).ptr(act).i64(stride as i64).ptr(x).i32(cols as i32).ptr(y);
        self.push(&format!("ref_mv_{suffix}"), [Self::blocks(rows, 128), n as u32, 1], 128, args);
    }

    /// The reference mode's kernel suffix for a weight or embedding-table type (`what`), or
    /// `None` with the coded error for a type it does not run.
    pub(super) fn ref_suffix(&mut self, ty: GgmlType, what: &str) -> Option<&'static str> {
        if matches!(ty, GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q4_K | GgmlType::Q6_K | GgmlType::F32 | GgmlType::F16) {
            return type_suffix(ty);
        }
        let msg = format!("the CUDA reference mode (RUVLLM_CUDA_EXACT) does not run {} {what} (Q8_0, Q4_0, Q5_0, Q4_K, Q6_K, F32, F16 only)", ty.name());
        self.fail(Error::Gpu { code: "ERR_GPU", msg });
        None
    }

    /// Reference mode: attention as the CPU's scalar path computes it (`reference.cu`): the
    /// scores of every visible position, each row's softmax, the value sums in position order.
    pub(super) fn ref_attention(&mut self, cache: &LayerCache, shape: AttnShape, mask: AttentionMask, window: Option<usize>, pos0: usize, n: usize) {
        let Some(d) = self.device_rows(cache) else { return };
        let (kp, vp, f16) = (d.k, d.v, u64::from(d.elem == 2));
        if shape.n_kv_head == 0 || !shape.n_head.is_multiple_of(shape.n_kv_head) {
            self.fail(Error::Gpu { code: "ERR_GPU", msg: format!("attention shape {shape:?}: query heads are not a multiple of the KV heads") });
            return;
        }
        // No query sees more than the stored positions.
        let stride = pos0 + n;
        let need = n * shape.n_head * stride * 4;
        if self.ref_scores.as_ref().is_none_or(|p| p.bytes < need) {
            self.flush();
            self.sync();
            self.clear_graphs();
            self.ref_scores = self.alloc(need);
        }
        let (mk, block) = match mask {
            AttentionMask::Causal => (0u64, 1u64),
            AttentionMask::Bidirectional => (1, 1),
            AttentionMask::BlockCausal { block } => (2, block.max(1) as u64),
        };
        let pair = |a: u64, b: u64| (a & 0xffff_ffff) | (b << 32);
        // `RefAtt` in reference.cu: five pointers, eleven ints and the scale.
        let words = [
            self.buf(Buf::Q),
            kp,
            vp,
            Self::ptr_of(&self.ref_scores),
            self.buf(Buf::Attn),
            pair(f16, cache.capacity as u64),
            pair(shape.n_head as u64, shape.n_kv_head as u64),
            pair(shape.head_dim as u64, mk),
            pair(block, window.unwrap_or(0) as u64),
            pair(pos0 as u64, n as u64),
            pair(stride as u64, u64::from(shape.scale.to_bits())),
        ];
        let (heads, hd) = (shape.n_head as u32, shape.head_dim);
        self.push("ref_att_scores", [Self::blocks(stride, 128), heads, n as u32], 128, Args::new().words(&words));
        self.push("ref_att_softmax", [Self::blocks(shape.n_head, 32), n as u32, 1], 32, Args::new().words(&words));
        self.push("ref_att_values", [Self::blocks(hd, 128), heads, n as u32], 128, Args::new().words(&words));
    }
}
