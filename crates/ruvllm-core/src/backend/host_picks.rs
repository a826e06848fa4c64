//! A [`PickQueue`] over a backend whose logits are on the host (the CPU), so that the engine's
//! run-ahead decoding, written for a GPU (which sends a token's pass before the host has read
//! the previous pick), runs and is tested without one. The engine wraps the CPU backend in it
//! under `RUVLLM_CPU_AHEAD=1`; off by default: a CPU pass runs when it is sent, so there is
//! nothing to overlap, and a pass sent ahead of a final token is wasted.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{
    Activation, AttentionMask, AttnShape, Backend, Buf, BufWidths, KvType, LayerCache, LowRankTerms, Memory, PickQueue, QWeight, QkNorms, RopeTable, Span,
};

/// Greedy picks queued by [`HostPicks`] in this process (so a test can tell that run-ahead
/// decoding ran).
pub static QUEUED_PICKS: AtomicUsize = AtomicUsize::new(0);

/// `inner` with a queue of greedy picks taken from its logits. It offers no head screening
/// (run-ahead decoding queues its picks from the logits) and no device picks.
pub struct HostPicks<B> {
    inner: B,
    vocab: usize,
    picks: VecDeque<u32>,
    embed_pick: bool,
}

impl<B> HostPicks<B> {
    pub fn new(inner: B) -> Self {
        HostPicks { inner, vocab: 0, picks: VecDeque::new(), embed_pick: false }
    }
}

impl<B: Memory> Memory for HostPicks<B> {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn threads(&self) -> usize {
        self.inner.threads()
    }
    fn prepare_weight(&mut self, w: &QWeight) {
        self.inner.prepare_weight(w)
    }
    fn prepare_head(&mut self, w: &QWeight) {
        self.inner.prepare_head(w)
    }
    fn reserve(&mut self, widths: BufWidths, max_batch: usize) {
        self.vocab = widths.vocab_size;
        self.inner.reserve(widths, max_batch)
    }
    fn max_batch(&self) -> usize {
        self.inner.max_batch()
    }
    fn prefers_merged_adapters(&self) -> bool {
        self.inner.prefers_merged_adapters()
    }
    fn new_layer_cache(&self, capacity: usize, row: usize, ty: KvType) -> LayerCache {
        self.inner.new_layer_cache(capacity, row, ty)
    }
    fn finish(&mut self) {
        self.inner.finish()
    }
    fn status(&mut self) -> crate::Result<()> {
        self.inner.status()
    }
}

impl<B: Backend> Backend for HostPicks<B> {
    fn embed(&mut self, table: &QWeight, tokens: &[u32], scale: Option<f32>, replace: Option<(u32, &[f32])>) {
        match (self.embed_pick, tokens, self.picks.back()) {
            (true, [_], Some(&p)) => self.inner.embed(table, &[p], scale, replace),
            _ => self.inner.embed(table, tokens, scale, replace),
        }
    }
    fn rms_norm(&mut self, src: Buf, dst: Buf, w: &[f32], eps: f32, n: usize) {
        self.inner.rms_norm(src, dst, w, eps, n)
    }
    fn matmul(&mut self, w: &QWeight, src: Buf, dst: Buf, n: usize) {
        self.inner.matmul(w, src, dst, n)
    }
    fn matmul_fused(&mut self, ws: &[&QWeight], src: Buf, dsts: &[Buf], n: usize) {
        self.inner.matmul_fused(ws, src, dsts, n)
    }
    fn matmul_gated(&mut self, gate: &QWeight, up: &QWeight, act: Activation, n: usize) -> bool {
        self.inner.matmul_gated(gate, up, act, n)
    }
    fn add_bias(&mut self, dst: Buf, bias: &[f32], n: usize) {
        self.inner.add_bias(dst, bias, n)
    }
    fn add_biases(&mut self, items: &[(Buf, &[f32])], n: usize) {
        self.inner.add_biases(items, n)
    }
    fn add_low_rank(&mut self, terms: &LowRankTerms, src: Buf, dsts: &[Buf], n: usize) {
        self.inner.add_low_rank(terms, src, dsts, n)
    }
    fn rope(&mut self, table: &RopeTable, buf: Buf, head_dim: usize, pos0: usize, n: usize) {
        self.inner.rope(table, buf, head_dim, pos0, n)
    }
    fn store_kv(&mut self, cache: &mut LayerCache, pos0: usize, n: usize) {
        self.inner.store_kv(cache, pos0, n)
    }
    fn attention(&mut self, cache: &LayerCache, shape: AttnShape, mask: AttentionMask, window: Option<usize>, pos0: usize, n: usize) {
        self.inner.attention(cache, shape, mask, window, pos0, n)
    }
    fn add(&mut self, dst: Buf, src: Buf, n: usize) {
        self.inner.add(dst, src, n)
    }
    fn gated_activation(&mut self, act: Activation, n: usize) {
        self.inner.gated_activation(act, n)
    }
    fn lm_head(&mut self, output: &QWeight, norm: &[f32], eps: f32, softcap: Option<f32>, rows: &[usize]) -> &mut [f32] {
        self.inner.lm_head(output, norm, eps, softcap, rows)
    }
    fn lm_head_deferred(&mut self, output: &QWeight, norm: &[f32], eps: f32, softcap: Option<f32>, rows: &[usize]) {
        self.inner.lm_head_deferred(output, norm, eps, softcap, rows)
    }
    fn final_hidden(&mut self, norm: &[f32], eps: f32, n: usize) -> &[f32] {
        self.inner.final_hidden(norm, eps, n)
    }
    fn logits(&mut self) -> &mut [f32] {
        self.inner.logits()
    }
    fn residual_norm(&mut self, post: Option<&[f32]>, next: Option<&[f32]>, eps: f32, n: usize) {
        self.inner.residual_norm(post, next, eps, n)
    }
    fn qk_rope_store(
        &mut self,
        q_norm: Option<&[f32]>,
        k_norm: Option<&[f32]>,
        eps: f32,
        rope: &RopeTable,
        head_dim: usize,
        cache: &mut LayerCache,
        pos0: usize,
        n: usize,
    ) {
        self.inner.qk_rope_store(q_norm, k_norm, eps, rope, head_dim, cache, pos0, n)
    }
    fn runs_segments(&self) -> bool {
        self.inner.runs_segments()
    }
    fn begin_segments(&mut self, segs: &[(usize, usize)], layers: usize, mask: AttentionMask) {
        self.inner.begin_segments(segs, layers, mask)
    }
    fn segment_attention(
        &mut self,
        norms: QkNorms,
        rope: &RopeTable,
        cache: &mut LayerCache,
        shape: AttnShape,
        span: Span,
        row0: usize,
        pos0: usize,
        n: usize,
    ) {
        self.inner.segment_attention(norms, rope, cache, shape, span, row0, pos0, n)
    }
    fn pick_queue(&mut self) -> Option<&mut dyn PickQueue> {
        Some(self)
    }
}

impl<B: Backend> PickQueue for HostPicks<B> {
    fn queue_pick(&mut self) -> bool {
        let v = self.vocab;
        if self.picks.len() >= 2 || v == 0 {
            return false;
        }
        let logits = self.inner.logits();
        if logits.len() < v {
            return false;
        }
        self.picks.push_back(crate::sampling::argmax(&logits[..v]));
        QUEUED_PICKS.fetch_add(1, Ordering::Relaxed);
        true
    }
    fn next_pick(&mut self) -> Option<u32> {
        self.picks.pop_front()
    }
    fn drop_picks(&mut self) {
        self.picks.clear();
        self.embed_pick = false;
    }
    fn embed_last_pick(&mut self, on: bool) {
        self.embed_pick = on;
    }
}
