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

impl DevicePicks for CudaBackend {
    fn argmax(&mut self) -> Option<u32> {
        if self.head_rows > 1 {
            // A many-row head picks every row (`head_tail`).
            return self.argmax_rows().and_then(|r| r.first().copied());
        }
        self.flush();
        let out = Self::ptr_of(&self.argmax_out);
        let dst = self.argmax_host.as_ref()?.ptr;
        self.copy_back(dst, out, 4);
        self.sync();
        let ok = self.ok();
        match (&mut self.argmax_host, ok) {
            (Some(h), true) => Some(h.as_i32(1)[0] as u32),
            // The failure is reported by `status`.
            _ => Some(0),
        }
    }
    fn argmax_rows(&mut self) -> Option<Vec<u32>> {
        let m = self.head_rows;
        if m < 2 || self.exact {
            return None;
        }
        self.flush();
        let (out, dst) = (Self::ptr_of(&self.rows_out), self.rows_host.as_ref()?.ptr);
        self.copy_back(dst, out, m * 4);
        self.sync();
        if !self.ok() {
            // The failure is reported by `status`.
            return Some(vec![0; m]);
        }
        self.rows_host.as_mut().map(|h| h.as_i32(m).iter().map(|&i| i as u32).collect())
    }
    fn top_logits(&mut self) -> Option<Vec<(u32, f32)>> {
        self.top_lists(None, false).map(|t| t.0)
    }
    fn top_logits_norm(&mut self, drop: Option<u32>) -> Option<crate::backend::TopNorms> {
        self.top_lists(drop, true)
    }
}

impl CudaBackend {
    /// `top_logits`, after `drop`'s logit is made -inf in every row, and with `norms` each row's
    /// log-sum-exp (parts found on the device, merged here in f64).
    fn top_lists(&mut self, drop: Option<u32>, norms: bool) -> Option<crate::backend::TopNorms> {
        let (m, v) = (self.head_rows, self.widths.vocab_size);
        if m == 0 || self.exact || !self.ok() {
            return None;
        }
        let lists = v.div_ceil(TOP_SLICE);
        // One stage's lists: m × lists × TOP_LOGITS values, then as many ids; then the
        // log-sum-exp parts (max, sum) of each row.
        let half = m * lists * TOP_LOGITS;
        let parts = m * LSE_PARTS * 2;
        let (dev_bytes, host_bytes) = (4 * half * 4 + parts * 4, m * TOP_LOGITS * 8 + parts * 4);
        if self.top_dev.as_ref().is_none_or(|d| d.bytes < dev_bytes) || self.top_host.as_ref().is_none_or(|h| h.bytes < host_bytes) {
            // Sends the LM head first; captured graphs point at the buffer being replaced.
            self.flush();
            self.sync();
            self.clear_graphs();
            self.top_dev = self.alloc(dev_bytes);
            self.current();
            self.top_host = HostMem::alloc(self.api, self.ctx, host_bytes).map_err(|e| self.fail(gpu_error(&e))).ok();
            if !self.ok() {
                return None;
            }
        }
        let base = Self::ptr_of(&self.top_dev);
        let stage = |k: u64| (base + k * 2 * (half as u64) * 4, base + (k * 2 + 1) * (half as u64) * 4);
        let lse = base + 4 * (half as u64) * 4;
        let logits = Self::ptr_of(&self.logits_dev);
        if let Some(id) = drop.filter(|&id| (id as usize) < v) {
            self.push("drop_logit", [1, 1, 1], 32, Args::new().ptr(logits).i32(v as i32).i32(m as i32).i32(id as i32));
        }
        if norms {
            self.push("row_lse", [LSE_PARTS as u32, m as u32, 1], 256, Args::new().ptr(logits).i32(v as i32).ptr(lse));
        }
        let (sv, si) = stage(0);
        self.push("top1", [lists as u32, m as u32, 1], 256, Args::new().ptr(logits).i32(v as i32).ptr(sv).ptr(si));
        let (mut k, mut n) = (0, lists);
        while n > 1 {
            let groups = n.div_ceil(TOP_MERGE);
            let ((iv, ii), (ov, oi)) = (stage(k), stage(k ^ 1));
            self.push("top2", [groups as u32, m as u32, 1], 256, Args::new().ptr(iv).ptr(ii).i32(n as i32).ptr(ov).ptr(oi));
            (k, n) = (k ^ 1, groups);
        }
        self.flush();
        let (rv, ri) = stage(k);
        let dst = self.top_host.as_ref()?.ptr;
        let at = |bytes: usize| (dst as *mut u8).wrapping_add(bytes) as *mut c_void;
        self.copy_back(dst, rv, m * TOP_LOGITS * 4);
        self.copy_back(at(m * TOP_LOGITS * 4), ri, m * TOP_LOGITS * 4);
        if norms {
            self.copy_back(at(m * TOP_LOGITS * 8), lse, parts * 4);
        }
        self.sync();
        if !self.ok() {
            return None;
        }
        let h = self.top_host.as_mut()?.as_f32(2 * m * TOP_LOGITS + parts);
        let (vals, rest) = h.split_at(m * TOP_LOGITS);
        let (ids, lse) = rest.split_at(m * TOP_LOGITS);
        let top = ids.iter().zip(vals).map(|(&i, &l)| (i.to_bits(), l)).collect();
        let norms = if norms { lse.chunks_exact(LSE_PARTS * 2).map(merge_lse).collect() } else { Vec::new() };
        Some((top, norms))
    }
}

/// A row's log-sum-exp from its parts' (max, sum of exp(x - max)) pairs (`row_lse`).
fn merge_lse(parts: &[f32]) -> f64 {
    let top = parts.chunks_exact(2).map(|p| p[0]).fold(f32::NEG_INFINITY, f32::max);
    if top == f32::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    let sum: f64 = parts.chunks_exact(2).filter(|p| p[0] > f32::NEG_INFINITY).map(|p| p[1] as f64 * (p[0] as f64 - top as f64).exp()).sum();
    top as f64 + sum.ln()
}

impl PickQueue for CudaBackend {
    fn queue_pick(&mut self) -> bool {
        if !self.ahead_on || self.picks.len() >= 2 || self.argmax_host.is_none() {
            return false;
        }
        // The LM head still to be sent keeps its own pick (the step block goes with it);
        // otherwise a device copy does.
        let keep = self.pick_kernel && !self.pending.is_empty();
        if keep {
            self.step[3] |= STEP_KEEP_PICK;
        }
        self.flush();
        self.step[3] &= !STEP_KEEP_PICK;
        if !self.ok() {
            return false;
        }
        let slot = if self.picks.back() == Some(&1) { 2 } else { 1 };
        let out = Self::ptr_of(&self.argmax_out);
        let dst = self.argmax_host.as_ref().map_or(std::ptr::null_mut(), |h| (h.ptr as *mut i32).wrapping_add(slot) as *mut c_void);
        let (api, stream, ev) = (self.api, self.stream, self.pick_ev[slot - 1]);
        self.current();
        // SAFETY: device and page-locked host buffers of 16 bytes; our stream and event. The
        // pick is kept on the device too (for a pass that takes it as its token: a later LM
        // head of another request may rewrite `argmax_out` first).
        let r = unsafe {
            (if keep { Ok(()) } else { check(api, "cuMemcpyDtoDAsync", (api.memcpy_dtod_async)(out + PICK_OFFSET, out, 4, stream)) })
                .and_then(|_| check(api, "cuMemcpyDtoHAsync", (api.memcpy_dtoh_async)(dst, out, 4, stream)))
                .and_then(|_| check(api, "cuEventRecord", (api.event_record)(ev, stream)))
        };
        if let Err(e) = r {
            self.fail(gpu_error(&e));
            return false;
        }
        self.picks.push_back(slot);
        true
    }
    fn next_pick(&mut self) -> Option<u32> {
        let slot = self.picks.pop_front()?;
        if self.ok() {
            self.current();
            // SAFETY: an event recorded on our stream.
            let r = unsafe { (self.api.event_synchronize)(self.pick_ev[slot - 1]) };
            if let Err(e) = check(self.api, "cuEventSynchronize", r) {
                self.fail(gpu_error(&e));
            }
        }
        match (&mut self.argmax_host, self.error.is_none()) {
            (Some(h), true) => Some(h.as_i32(4)[slot] as u32),
            // The failure is reported by `status`.
            _ => Some(0),
        }
    }
    fn drop_picks(&mut self) {
        self.flush();
        self.sync();
        self.picks.clear();
        self.embed_pick = false;
        self.pass_pick = false;
        if let Some(f) = self.step.get_mut(3) {
            *f = 0;
        }
    }
    fn embed_last_pick(&mut self, on: bool) {
        self.embed_pick = on;
    }
}
