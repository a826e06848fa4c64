//! The LM head: the final norm of the wanted rows, the product (one fused kernel for one row of
//! a Q8_0 head), soft-capping and the greedy picks.

use super::*;

impl CudaBackend {
    /// The LM head's kernels: norm of the step's head rows, product, soft-cap, argmax of row 0.
    pub(super) fn head(&mut self, output: &QWeight, norm: &[f32], eps: f32, softcap: Option<f32>, rows: &[usize]) {
        let (d, v, m) = (self.widths.d_model, self.widths.vocab_size, rows.len());
        let mb = self.max_batch;
        self.step[2] = m as i32;
        for (i, &r) in rows.iter().enumerate() {
            self.step[4 + mb + i] = r as i32;
        }
        if self.logits_dev.as_ref().is_none_or(|l| l.bytes < m * v * 4) {
            self.flush();
            self.sync();
            // Captured graphs point at the buffers being replaced.
            self.clear_graphs();
            self.logits_dev = self.alloc(m * v * 4);
            self.current();
            self.logits_host = HostMem::alloc(self.api, self.ctx, m * v * 4).map_err(|e| self.fail(gpu_error(&e))).ok();
        }
        let (x, xn) = (self.buf(Buf::X), self.buf(Buf::Xn));
        let w = self.vector(norm);
        let step = Self::ptr_of(&self.step_dev);
        if self.exact {
            self.push("ref_norm_rows", [Self::blocks(m, 32), 1, 1], 32, Args::new().ptr(x).ptr(xn).ptr(w).i32(d as i32).f32(eps).ptr(step).i32(mb as i32));
            let logits = Self::ptr_of(&self.logits_dev);
            self.ref_product(output, xn, logits, m);
            self.head_tail(logits, softcap, m);
            return;
        }
        let fused = m == 1 && output.ty == GgmlType::Q8_0 && d <= HEAD_MAX_COLS && d.is_multiple_of(32);
        if !(fused && self.fuse_head) {
            self.push("norm_rows", [m as u32, 1, 1], 256, Args::new().ptr(x).ptr(xn).ptr(w).i32(d as i32).f32(eps).ptr(step).i32(mb as i32));
        }
        let Some((wp, rb)) = self.weight(output) else { return };
        let logits = Self::ptr_of(&self.logits_dev);
        if fused {
            // One kernel: the final norm (unless `norm_rows` ran), product, soft-cap and the
            // greedy pick.
            let (input, nw) = if self.fuse_head { (x, w) } else { (xn, 0) };
            let (pv, out, counter) = (Self::ptr_of(&self.argmax_part), Self::ptr_of(&self.argmax_out), Self::ptr_of(&self.head_counter));
            let chunks = d.div_ceil(256);
            let (name, blocks) = match self.head2_blocks {
                Some(b) if chunks <= HEAD2_MAX_CHUNKS => (format!("head2_q8_0r_{chunks}"), b),
                _ => ("head_q8_0r".to_string(), v.div_ceil(HEAD_TILE).clamp(1, self.head_blocks)),
            };
            let args = Args::new()
                .ptr(wp)
                .i64(rb as i64)
                .i32(v as i32)
                .ptr(input)
                .i32(d as i32)
                .ptr(logits)
                .f32(softcap.unwrap_or(0.0))
                .ptr(pv)
                .ptr(pv + (HEAD_BLOCKS_MAX * 4) as u64)
                .ptr(counter)
                .ptr(out)
                .ptr(nw)
                .f32(eps)
                .ptr(step)
                .i32(mb as i32);
            self.push(&name, [blocks as u32, 1, 1], 256, args);
            self.head_rows = m;
            self.logits_ready = false;
            return;
        }
        if m <= self.head_mmv_max {
            let nt = Self::mmv_tokens(m);
            let name = format!("mmv{nt}_{}", type_suffix(output.ty).unwrap_or("f32"));
            let args = Args::new().words(&mmv3_words([wp, 0, 0], [rb as i64, 0, 0], [v as i32, 0, 0], [logits, 0, 0])).ptr(xn).i32(d as i32).i32(m as i32);
            self.push(&name, [Self::blocks(v, 8), 1, 1], 256, args);
        } else {
            self.gemm((wp, rb), output.ty, v, d, xn, logits, v, m, &mut None);
        }
        self.head_tail(logits, softcap, m);
    }

    /// The LM head's soft-cap and the greedy pick of its first row.
    pub(super) fn head_tail(&mut self, logits: CUdeviceptr, softcap: Option<f32>, m: usize) {
        let v = self.widths.vocab_size;
        let step = Self::ptr_of(&self.step_dev);
        if let Some(cap) = softcap {
            self.push("softcap", [Self::blocks(m * v, 256), 1, 1], 256, Args::new().ptr(logits).i32((m * v) as i32).f32(cap));
        }
        if m > 1 {
            // Every row's pick (`argmax_rows`): a few candidates per row, then one block per row.
            let (pv, out) = (Self::ptr_of(&self.rows_part), Self::ptr_of(&self.rows_out));
            let pi = pv + (self.max_batch * ROW_ARGMAX_PARTS * 4) as u64;
            self.push("argmax1", [ROW_ARGMAX_PARTS as u32, m as u32, 1], 256, Args::new().ptr(logits).i32(v as i32).ptr(pv).ptr(pi));
            self.push("argmax2", [m as u32, 1, 1], 256, Args::new().ptr(pv).ptr(pi).i32(ROW_ARGMAX_PARTS as i32).ptr(out).ptr(step));
        } else {
            let (pv, out) = (Self::ptr_of(&self.argmax_part), Self::ptr_of(&self.argmax_out));
            self.push("argmax1", [ARGMAX_BLOCKS as u32, 1, 1], 256, Args::new().ptr(logits).i32(v as i32).ptr(pv).ptr(pv + (ARGMAX_BLOCKS * 4) as u64));
            self.push("argmax2", [1, 1, 1], 256, Args::new().ptr(pv).ptr(pv + (ARGMAX_BLOCKS * 4) as u64).i32(ARGMAX_BLOCKS as i32).ptr(out).ptr(step));
        }
        self.head_rows = m;
        self.logits_ready = false;
    }
}
