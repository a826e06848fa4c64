//! Attention: the QK-norm/RoPE/KV-store and attention launches for one sequence, or for every
//! sequence of a multi-sequence pass at once (their rows and caches in the step block).

use super::*;

impl CudaBackend {
    /// A layer's KV rows as the kernels take them (recording the failure when they are not on
    /// the device).
    pub(super) fn kv_ref(&mut self, cache: &LayerCache) -> Option<KvRef> {
        let capacity = cache.capacity;
        self.device_rows(cache).map(|d| KvRef { k: d.k, v: d.v, f16: d.elem == 2, capacity })
    }

    /// The attention kernel over `cache`; `fuse`: the `AttFuse` argument (all zero: off).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_launch(
        &mut self,
        cache: &LayerCache,
        shape: AttnShape,
        mask: AttentionMask,
        window: Option<usize>,
        pos0: usize,
        n: usize,
        fuse: [u64; 8],
    ) {
        self.begin_pass(pos0, n);
        if self.exact {
            return self.ref_attention(cache, shape, mask, window, pos0, n);
        }
        let Some(kv) = self.kv_ref(cache) else { return };
        self.attention_kernel(kv, shape, mask, window, n, pos0 + n, n <= GRAPH_ROWS, fuse, [0, 0]);
    }

    /// The attention kernel for `n` rows whose spans end at most at `end`; `decode`: one token
    /// per sequence (a fixed split count, so the step's launches stay the same as spans grow);
    /// `seg`: the step block's row and `SegKv` tables of a multi-sequence pass (zero: one
    /// sequence, in `kv`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_kernel(
        &mut self,
        kv: KvRef,
        shape: AttnShape,
        mask: AttentionMask,
        window: Option<usize>,
        n: usize,
        end: usize,
        decode: bool,
        fuse: [u64; 8],
        seg: [u64; 2],
    ) {
        if let Err(why) = attention_fits(shape) {
            self.fail(Error::Gpu { code: "ERR_GPU", msg: why });
            return;
        }
        let g = shape.n_head / shape.n_kv_head.max(1);
        // Decode: a fixed split count over the span (one graph for every step); many tokens:
        // splits only while the queries alone leave the GPU short of blocks (more splits at
        // 512 tokens only add combining work), each at least ATT_MIN_CHUNK positions.
        let splits = if decode {
            DECODE_SPLITS
        } else {
            let most = self.prefill_splits.unwrap_or_else(|| ATT_FILL_BLOCKS.div_ceil(n * shape.n_kv_head.max(1)).min(PREFILL_SPLITS));
            end.div_ceil(ATT_MIN_CHUNK).clamp(1, most.max(1))
        };
        let need = n * shape.n_kv_head * splits * g * (shape.head_dim + 2) * 4;
        if self.att_part.as_ref().is_none_or(|p| p.bytes < need) {
            self.flush();
            self.sync();
            self.clear_graphs();
            self.att_part = self.alloc(need);
        }
        let counters = n * shape.n_kv_head;
        if self.att_counters.as_ref().is_none_or(|p| p.bytes < counters * 4) {
            self.flush();
            self.sync();
            self.clear_graphs();
            self.att_counters = self.alloc(counters * 4);
            if let Some(c) = &self.att_counters {
                // SAFETY: zero fresh counters.
                unsafe { (self.api.memset_d8)(c.ptr, 0, counters * 4) };
            }
        }
        let (mk, block) = match mask {
            AttentionMask::Causal => (0, 1),
            AttentionMask::Bidirectional => (1, 1),
            AttentionMask::BlockCausal { block } => (2, block.max(1)),
        };
        let step = Self::ptr_of(&self.step_dev);
        let args = Args::new()
            .ptr(self.buf(Buf::Q))
            .ptr(self.buf(Buf::Attn))
            .ptr(kv.k)
            .ptr(kv.v)
            .i32(i32::from(kv.f16))
            .i32(kv.capacity as i32)
            .i32(shape.n_head as i32)
            .i32(shape.n_kv_head as i32)
            .i32(shape.head_dim as i32)
            .f32(shape.scale)
            .i32(mk)
            .i32(block as i32)
            .i32(window.unwrap_or(0) as i32)
            .ptr(step)
            .i32(n as i32)
            .ptr(Self::ptr_of(&self.att_part))
            .ptr(Self::ptr_of(&self.att_counters))
            .i32(splits as i32)
            .i32(if decode { self.att_chunk } else { ATT_MIN_CHUNK } as i32);
        // Many tokens: the instance without the folding, lean enough for two blocks per
        // multiprocessor (a 512-token prefill runs thousands of blocks).
        // More than four query heads per KV head (Qwen2.5's 6-7) without the folding: the
        // instance without it (fewer registers).
        let name = match (g <= 4, n > MMV_MAX) {
            (true, true) => "attention_g4n",
            (true, false) => "attention_g4",
            (false, _) if fuse == [0; 8] && self.att_g8n => "attention_g8n",
            _ => "attention",
        };
        self.push(name, [splits as u32, shape.n_kv_head as u32, n as u32], 256, args.words(&fuse).ptr(seg[0]).ptr(seg[1]));
    }

    /// QK-norm, RoPE and the KV store of `n` rows (`qk_rope_store`); `seg` as in
    /// [`attention_kernel`](Self::attention_kernel).
    pub(super) fn qk_kernel(&mut self, norms: QkNorms, rope: &RopeTable, head_dim: usize, kv: KvRef, n: usize, seg: [u64; 2]) {
        let qn = norms.q.map_or(0, |w| self.vector(w));
        let kn = norms.k.map_or(0, |w| self.vector(w));
        let (c, s) = rope.cos_sin();
        let (cp, sp) = (self.vector(c), self.vector(s));
        let style = i32::from(rope.style == RopeStyle::Neox);
        let (n_head, n_kv) = (self.widths.q_dim / head_dim, self.widths.kv_dim / head_dim);
        let step = Self::ptr_of(&self.step_dev);
        let args = Args::new()
            .ptr(self.buf(Buf::Q))
            .ptr(self.buf(Buf::K))
            .ptr(self.buf(Buf::V))
            .ptr(qn)
            .ptr(kn)
            .f32(norms.eps)
            .ptr(cp)
            .ptr(sp)
            .i32(rope.rot_dim as i32)
            .i32(style)
            .i32(n_head as i32)
            .i32(n_kv as i32)
            .i32(head_dim as i32)
            .ptr(kv.k)
            .ptr(kv.v)
            .i32(kv.capacity as i32)
            .i32(i32::from(kv.f16))
            .ptr(step)
            .ptr(seg[0])
            .ptr(seg[1]);
        self.push("qk_rope_store", [(n_head + n_kv) as u32, n as u32, 1], head_dim as u32, args);
    }

    /// `segment_attention` in a multi-sequence pass: records this sequence's cache for the
    /// layer; at the layer's last sequence, one QK/RoPE/store launch and one attention launch
    /// over every row of the pass.
    pub(super) fn segment_attention_batched(&mut self, norms: QkNorms, rope: &RopeTable, cache: &LayerCache, shape: AttnShape, span: Span) {
        let Some(kv) = self.kv_ref(cache) else { return };
        let Some(p) = self.segs.as_mut() else { return };
        let (layer, s) = (p.calls / p.segs, p.calls % p.segs);
        p.calls += 1;
        let p = *p;
        if layer >= p.layers || span.mask != AttentionMask::Causal {
            self.fail(Error::Internal(format!("a multi-sequence pass ran attention for layer {layer} of {} under {:?}", p.layers, span.mask)));
            return;
        }
        let mb = self.max_batch;
        let table = 4 + 4 * mb + layer * p.segs * SEG_KV_WORDS;
        let at = table + s * SEG_KV_WORDS;
        let words = [kv.k as u32 as i32, (kv.k >> 32) as i32, kv.v as u32 as i32, (kv.v >> 32) as i32, kv.capacity as i32, i32::from(kv.f16)];
        self.step[at..at + SEG_KV_WORDS].copy_from_slice(&words);
        if s + 1 < p.segs {
            return;
        }
        let step = Self::ptr_of(&self.step_dev);
        let seg = [step + ((4 + 2 * mb) * 4) as u64, step + (table * 4) as u64];
        // The kernels read each row's cache from the table: the launches name no cache, so a
        // captured step serves whichever sequences the next step carries.
        let kv = KvRef { k: 0, v: 0, f16: kv.f16, capacity: 0 };
        self.qk_kernel(norms, rope, shape.head_dim, kv, p.rows, seg);
        self.attention_kernel(kv, shape, span.mask, span.window, p.rows, p.end, p.decode, [0; 8], seg);
    }
}
