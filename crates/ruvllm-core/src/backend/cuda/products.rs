//! The products: weights grouped into launches of up to three, on the one-row kernels (`mmv*`),
//! the decode-batch `mmvq*`, the MMQ tiles or the FP32 tiles, with the activations quantized once
//! per input.

use super::*;

impl CudaBackend {
    /// `dsts[k] = ws[k]·src` for `n` rows: weights grouped by type into three-way launches.
    pub(super) fn products(&mut self, ws: &[&QWeight], src: Buf, dsts: &[Buf], n: usize) {
        let cols = ws[0].cols;
        let x = self.buf(src);
        if self.exact {
            for (w, &d) in ws.iter().zip(dsts) {
                let y = self.buf(d);
                self.ref_product(w, x, y, n);
            }
            return;
        }
        let mut up = Vec::with_capacity(ws.len());
        for w in ws {
            match self.weight(w) {
                Some(d) => up.push(d),
                None => return,
            }
        }
        if n <= self.mmv_max {
            let nt = Self::mmv_tokens(n);
            let mut i = 0;
            let mut rounded: Option<&str> = None;
            while i < ws.len() {
                let ty = ws[i].ty;
                let (j, words, rows) = self.group3(ws, &up, dsts, i, cols);
                if n == 1 && self.one_token_mmvq(ty, cols) {
                    self.settle();
                    self.mmq_launch(ty, words, rows, cols, x, n, &mut rounded);
                    i = j;
                    continue;
                }
                let total: usize = rows.iter().map(|&r| r as usize).sum();
                let suffix = type_suffix(ty).unwrap_or("f32");
                let args = Args::new().words(&words).ptr(x).i32(cols as i32);
                if n == 1 && cols <= MMV1_MAX_COLS {
                    let res = self.take_res(src, cols);
                    self.push(&format!("mmv1s_{suffix}"), [Self::blocks(total, 8), 1, 1], 256, args.words(&res));
                } else {
                    self.push(&format!("mmv{nt}_{suffix}"), [Self::blocks(total, 8), 1, 1], 256, args.i32(n as i32));
                }
                i = j;
            }
        } else {
            let mut rounded: Option<&str> = None;
            let mut i = 0;
            while i < ws.len() {
                let (ty, cols) = (ws[i].ty, ws[i].cols);
                if self.mmq_on(ty, cols) {
                    // Up to three weights of one type in one launch.
                    let (j, words, rows) = self.group3(ws, &up, dsts, i, cols);
                    self.mmq_launch(ty, words, rows, cols, x, n, &mut rounded);
                    i = j;
                } else {
                    let y = self.buf(dsts[i]);
                    self.gemm(up[i], ty, ws[i].rows, cols, x, y, ws[i].rows, n, &mut rounded);
                    i += 1;
                }
            }
        }
    }

    /// Weights `i..j` (at most three, all of `ws[i]`'s type and `cols` wide) as one launch's
    /// `Mmv3` words, with their row counts; returns `j` too.
    pub(super) fn group3(&self, ws: &[&QWeight], up: &[(CUdeviceptr, usize)], dsts: &[Buf], i: usize, cols: usize) -> (usize, [u64; 11], [i32; 3]) {
        let ty = ws[i].ty;
        let mut j = i + 1;
        while j < ws.len() && j - i < 3 && ws[j].ty == ty && ws[j].cols == cols {
            j += 1;
        }
        let (mut wp, mut rb, mut rows, mut yp) = ([0; 3], [0i64; 3], [0i32; 3], [0; 3]);
        for k in i..j {
            wp[k - i] = up[k].0;
            rb[k - i] = up[k].1 as i64;
            rows[k - i] = ws[k].rows as i32;
            yp[k - i] = self.buf(dsts[k]);
        }
        (j, mmv3_words(wp, rb, rows, yp), rows)
    }

    /// Whether a one-token product of this type runs on `mmvq` (int8 activations, no folded
    /// residual step) instead of `mmv1s`: in models at least `mmvq1_width` wide.
    pub(super) fn one_token_mmvq(&self, ty: GgmlType, cols: usize) -> bool {
        self.mmvq1_width > 0 && self.widths.d_model >= self.mmvq1_width && self.mmvq && self.mmq_on(ty, cols)
    }

    /// Whether a many-token product of this weight type and width runs on the MMQ kernels.
    pub(super) fn mmq_on(&self, ty: GgmlType, cols: usize) -> bool {
        self.mmq
            && cols.is_multiple_of(32)
            && matches!(ty, GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q4_0 | GgmlType::Q4_K | GgmlType::Q6_K)
            && self.mmq_types.as_deref().is_none_or(|l| l.split(',').any(|t| Some(t.trim()) == type_suffix(ty)))
    }

    /// The MMQ product of up to three weights of type `ty` (`a`: `Mmv3` words, `rows` their
    /// row counts) by `x` (n × cols): quantizes `x` into the activation buffer unless `rounded`
    /// says it holds that already (quants n × cols bytes, then the 32-block scales and the
    /// scaled quant sums, n × cols/32 floats each), then one launch of 64-row tiles × 64 (32
    /// where that leaves under 64 blocks) tokens. Outputs `Y[t·rows + r]`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mmq_launch(&mut self, ty: GgmlType, a: [u64; 11], rows: [i32; 3], cols: usize, x: CUdeviceptr, n: usize, rounded: &mut Option<&'static str>) {
        let act = if matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) { "act_mq_q8_k" } else { "act_mq_q8_0" };
        let span = (self.max_batch * self.widest()) as u64;
        let q = Self::ptr_of(&self.act_buf);
        let (d, m) = (q + span, q + span + span / 8);
        if *rounded != Some(act) {
            let warps = cols.div_ceil(256) * n;
            self.push(act, [Self::blocks(warps, 8), 1, 1], 256, Args::new().ptr(x).ptr(q).ptr(d).ptr(m).i32(cols as i32).i32(n as i32));
            *rounded = Some(act);
        }
        let tiles: usize = rows.iter().map(|&r| (r as usize).div_ceil(64)).sum();
        let suffix = type_suffix(ty).unwrap_or("f32");
        if n <= MMVQ_MAX && (tiles < MMQ_FEW_BLOCKS || (n <= 4 && tiles < MMVQ_TILES)) && self.mmvq {
            // A decode-size batch: one warp per row (`mmvq*`) keeps every multiprocessor busy
            // where MMQ would run fewer tiles than there are multiprocessors (or, for a few
            // tokens, where reading the int8 activations once per row stays cheap).
            let total: usize = rows.iter().map(|&r| r as usize).sum();
            let nt = if n <= 4 {
                4
            } else if n <= 8 {
                8
            } else {
                16
            };
            let args = Args::new().words(&a).ptr(q).ptr(d).ptr(m).i32(cols as i32).i32(n as i32);
            self.push(&format!("mmvq{nt}_{suffix}"), [Self::blocks(total, 8), 1, 1], 256, args);
            return;
        }
        let bn = if tiles * n.div_ceil(64) < 64 { 32 } else { 64 };
        // A grid that leaves multiprocessors idle (an H100/H200 has 132) gets two warp groups
        // per tile; larger grids are as fast or a little slower with them.
        let (k2, threads) = if tiles * n.div_ceil(bn) <= MMQ_FEW_BLOCKS { ("k2", 256) } else { ("", 128) };
        let args = Args::new().words(&a).ptr(q).ptr(d).ptr(m).i32(cols as i32).i32(n as i32);
        self.push(&format!("mmq{bn}{k2}_{suffix}"), [tiles as u32, Self::blocks(n, bn), 1], threads, args);
    }

    /// `Y[t·ldy + r] = W[r]·x[t]` for `n` tokens (`w`: the uploaded weight and its row bytes):
    /// by the MMQ kernels where `mmq_on` says so, else on the int8 tensor cores (WMMA) for
    /// weights in symmetric 32-blocks with `RUVLLM_CUDA_MMA=1`, else the FP32 tiles. `rounded`: which rounding of `x` the activation buffer holds.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemm(
        &mut self,
        w: (CUdeviceptr, usize),
        ty: GgmlType,
        rows: usize,
        cols: usize,
        x: CUdeviceptr,
        y: CUdeviceptr,
        ldy: usize,
        n: usize,
        rounded: &mut Option<&'static str>,
    ) {
        if ldy == rows && self.mmq_on(ty, cols) {
            self.mmq_launch(ty, mmv3_words([w.0, 0, 0], [w.1 as i64, 0, 0], [rows as i32, 0, 0], [y, 0, 0]), [rows as i32, 0, 0], cols, x, n, rounded);
            return;
        }
        let suffix = type_suffix(ty).unwrap_or("f32");
        let grid = [Self::blocks(rows, 64), Self::blocks(n, 64), 1];
        let mma = self.mma && cols.is_multiple_of(32) && matches!(ty, GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0);
        if mma {
            // Quants (n × cols bytes) then scales (n × cols/32 floats), in the activation buffer.
            let (q, d) = (Self::ptr_of(&self.act_buf), Self::ptr_of(&self.act_buf) + (self.max_batch * self.widest()) as u64);
            if *rounded != Some("act_q8_0_i8") {
                let warps = cols.div_ceil(256) * n;
                self.push("act_q8_0_i8", [Self::blocks(warps, 8), 1, 1], 256, Args::new().ptr(x).ptr(q).ptr(d).i32(cols as i32).i32(n as i32));
                *rounded = Some("act_q8_0_i8");
            }
            let args = Args::new().ptr(w.0).i64(w.1 as i64).i32(rows as i32).ptr(q).ptr(d).i32(cols as i32).ptr(y).i32(ldy as i32).i32(n as i32);
            self.push(&format!("gemm_mma_{suffix}"), grid, 256, args);
            return;
        }
        let input = match act_kernel(ty) {
            Some(act) => {
                if *rounded != Some(act) {
                    self.act_round(act, x, cols, n);
                    *rounded = Some(act);
                }
                Self::ptr_of(&self.act_buf)
            }
            None => x,
        };
        let args = Args::new().ptr(w.0).i64(w.1 as i64).i32(rows as i32).ptr(input).i32(cols as i32).ptr(y).i32(ldy as i32).i32(n as i32);
        self.push(&format!("gemm_{suffix}"), grid, 256, args);
    }

    /// `act_buf` = the activations `x` (n × cols) rounded as `act` does.
    pub(super) fn act_round(&mut self, act: &str, x: CUdeviceptr, cols: usize, n: usize) {
        let out = Self::ptr_of(&self.act_buf);
        let warps = cols.div_ceil(256) * n;
        self.push(act, [Self::blocks(warps, 8), 1, 1], 256, Args::new().ptr(x).ptr(out).i32(cols as i32).i32(n as i32));
    }
}
