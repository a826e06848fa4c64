//! The decoder-only transformer shared by our architecture families. Each family file
//! (`gemma3.rs`, `llama.rs`) reads its checkpoint's metadata into a [`TransformerConfig`] and
//! loads its tensors by their GGUF names; the forward pass here follows llama.cpp's graphs
//! (`llm_build_gemma3_iswa`, `llm_build_llama`, `llm_build_qwen2`) so greedy output matches it.

use crate::gguf::{GgufFile, TensorInfo};
use crate::backend::cpu::matmul::WeightData;
use crate::backend::cpu::ops::{self, RopeStyle, RopeTable};
use crate::backend::cpu::{matmul, GgmlType, QWeight};
use crate::runtime::ThreadPool;
use crate::backend::cpu::attention;
use crate::backend::cpu::ops::KvElem;
use crate::kv::{KvCache, KvRows, KvType, LayerCache};
use crate::nn::{AttentionMask, Linear, Proj};
use crate::runtime::SharedMut;
use crate::{Error, Result};
use std::sync::Arc;

/// Feed-forward activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// GELU (tanh approximation) gate: Gemma.
    GeluTanh,
    /// SiLU gate (SwiGLU): Llama, Qwen2, Mistral.
    Silu,
}

/// Everything the forward pass needs to know about an architecture instance.
#[derive(Debug, Clone)]
pub struct TransformerConfig {
    pub architecture: String,
    pub n_layer: usize,
    pub d_model: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub ff_dim: usize,
    pub vocab_size: usize,
    pub norm_eps: f32,
    pub train_context: usize,
    pub rope_base: f32,
    /// RoPE base of sliding-window layers, when it differs (Gemma 3: 10,000).
    pub rope_base_swa: Option<f32>,
    pub rope_dim: usize,
    pub rope_style: RopeStyle,
    pub rope_linear_factor: f32,
    pub sliding_window: Option<usize>,
    /// Per layer: does it use the sliding window?
    pub swa_layers: Vec<bool>,
    pub activation: Activation,
    /// Per-head RMSNorm of Q and K (Gemma 3).
    pub qk_norm: bool,
    /// RMSNorm after attention and after the FFN, before the residual add (Gemma).
    pub sandwich_norm: bool,
    /// Multiply embeddings by this (Gemma: sqrt(d_model)).
    pub embed_scale: Option<f32>,
    /// Scale applied to attention scores.
    pub attn_scale: f32,
    pub qkv_bias: bool,
    pub final_logit_softcap: Option<f32>,
}

/// One decoder block's weights, by GGUF name `blk.N.*`.
pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub wq: Linear,
    pub wk: Linear,
    pub wv: Linear,
    pub wo: Linear,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub ffn_gate: Linear,
    pub ffn_up: Linear,
    pub ffn_down: Linear,
    pub post_ffn_norm: Option<Vec<f32>>,
}

/// Reads weights out of a GGUF file, checking shapes against the config.
pub struct WeightLoader<'a> {
    pub file: &'a GgufFile,
}

impl<'a> WeightLoader<'a> {
    fn info(&self, name: &str) -> Result<&'a TensorInfo> {
        self.file
            .tensor(name)
            .ok_or_else(|| Error::gguf(&self.file.path, format!("missing tensor '{name}'")))
    }

    pub fn has(&self, name: &str) -> bool {
        self.file.tensor(name).is_some()
    }

    /// A `rows × cols` matrix (GGUF dims `[cols, rows]`), kept in its quantized form.
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<QWeight> {
        let info = self.info(name)?;
        if info.dims != [cols as u64, rows as u64] {
            return Err(Error::gguf(
                &self.file.path,
                format!("tensor '{name}' has shape {:?}, expected [{cols}, {rows}]", info.dims),
            ));
        }
        if !info.dtype.is_supported_weight() {
            return Err(Error::unsupported(
                &self.file.path,
                format!("tensor '{name}' has type {}, which ruvllm cannot run yet", info.dtype.name()),
            ));
        }
        let data = WeightData::Mapped {
            storage: self.file.storage(),
            offset: info.offset as usize,
            len: info.size as usize,
        };
        QWeight::new(info.dtype, rows, cols, data).map_err(|m| Error::gguf(&self.file.path, format!("tensor '{name}': {m}")))
    }

    /// A 1-D tensor of length `len`, as f32.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let info = self.info(name)?;
        if info.dims != [len as u64] {
            return Err(Error::gguf(
                &self.file.path,
                format!("tensor '{name}' has shape {:?}, expected [{len}]", info.dims),
            ));
        }
        if !matches!(info.dtype, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            return Err(Error::unsupported(
                &self.file.path,
                format!("1-D tensor '{name}' has type {}; expected F32, F16 or BF16", info.dtype.name()),
            ));
        }
        let mut out = vec![0.0; len];
        crate::backend::cpu::quant::dequantize(info.dtype, self.file.tensor_bytes(info), &mut out);
        Ok(out)
    }

    pub fn optional_vector(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        if self.has(name) {
            self.vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    }
}

impl Layer {
    /// Loads block `i` (`blk.{i}.*`).
    pub fn load(w: &WeightLoader, cfg: &TransformerConfig, i: usize) -> Result<Self> {
        let p = |n: &str| format!("blk.{i}.{n}");
        let (d, q_dim, kv_dim) = (cfg.d_model, cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim);
        let bias = |n: &str, len| if cfg.qkv_bias { w.optional_vector(&p(n), len) } else { Ok(None) };
        let norm = |n: &str, len| if w.has(&p(n)) { w.vector(&p(n), len).map(Some) } else { Ok(None) };
        let lin = |pr: Proj, rows, cols, b: Option<Vec<f32>>| -> Result<Linear> {
            Ok(Linear::new(w.matrix(&p(&format!("{}.weight", pr.gguf_name())), rows, cols)?, b, i, pr))
        };
        let layer = Layer {
            attn_norm: w.vector(&p("attn_norm.weight"), d)?,
            wq: lin(Proj::Q, q_dim, d, bias("attn_q.bias", q_dim)?)?,
            wk: lin(Proj::K, kv_dim, d, bias("attn_k.bias", kv_dim)?)?,
            wv: lin(Proj::V, kv_dim, d, bias("attn_v.bias", kv_dim)?)?,
            wo: lin(Proj::O, d, q_dim, None)?,
            q_norm: if cfg.qk_norm { Some(w.vector(&p("attn_q_norm.weight"), cfg.head_dim)?) } else { None },
            k_norm: if cfg.qk_norm { Some(w.vector(&p("attn_k_norm.weight"), cfg.head_dim)?) } else { None },
            post_attn_norm: if cfg.sandwich_norm { Some(w.vector(&p("post_attention_norm.weight"), d)?) } else { norm("post_attention_norm.weight", d)? },
            ffn_norm: w.vector(&p("ffn_norm.weight"), d)?,
            ffn_gate: lin(Proj::Gate, cfg.ff_dim, d, None)?,
            ffn_up: lin(Proj::Up, cfg.ff_dim, d, None)?,
            ffn_down: lin(Proj::Down, d, cfg.ff_dim, None)?,
            post_ffn_norm: if cfg.sandwich_norm { Some(w.vector(&p("post_ffw_norm.weight"), d)?) } else { None },
        };
        Ok(layer)
    }
}

/// Reusable activation buffers for up to `max_batch` tokens: nothing is allocated per token.
pub struct Scratch {
    pub max_batch: usize,
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    pub logits: Vec<f32>,
    /// Logits of several tokens at once ([`Transformer::forward_each_logits`]), grown on use.
    head_logits: Vec<f32>,
    /// Attention scores of the split decode path ([`Transformer::attention_split`]), grown on use.
    att_scores: Vec<f32>,
}

/// A loaded decoder-only transformer.
pub struct Transformer {
    pub cfg: TransformerConfig,
    pub embed: QWeight,
    pub layers: Vec<Layer>,
    pub output_norm: Vec<f32>,
    /// The LM head; the same bytes as `embed` when the embeddings are tied.
    pub output: QWeight,
    rope: Arc<RopeTable>,
    rope_swa: Arc<RopeTable>,
}

thread_local! {
    /// Per-thread attention score row and the key/value row offsets of its positions, grown to
    /// the longest span seen (no per-token allocation).
    static SCORES: std::cell::RefCell<(Vec<f32>, Vec<usize>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

impl Transformer {
    /// Builds the model from a config and the file's tensors. RoPE tables are sized to
    /// `context` (not the model's maximum) and shared by all layers with the same base.
    pub fn load(w: &WeightLoader, cfg: TransformerConfig, context: usize) -> Result<Self> {
        let embed = w.matrix("token_embd.weight", cfg.vocab_size, cfg.d_model)?;
        // The LM head is the largest weight and every decoded token streams all of it. Where
        // `prepare` will pack it for the tile GEMM (on huge pages), it stays mapped until then;
        // otherwise the per-row kernels read a copy on huge pages (kernels::mem), which a tied
        // embedding shares for its row gathers.
        let tied = !w.has("output.weight");
        let output = if tied { embed.clone() } else { w.matrix("output.weight", cfg.vocab_size, cfg.d_model)? };
        let output = if output.packs() { output } else { output.to_huge() };
        let embed = if tied { output.clone() } else { embed };
        let layers = (0..cfg.n_layer).map(|i| Layer::load(w, &cfg, i)).collect::<Result<Vec<_>>>()?;
        let output_norm = w.vector("output_norm.weight", cfg.d_model)?;
        let rope = Arc::new(RopeTable::new(cfg.rope_dim, cfg.rope_base, cfg.rope_linear_factor, context, cfg.rope_style));
        let rope_swa = match cfg.rope_base_swa {
            Some(b) if b != cfg.rope_base => Arc::new(RopeTable::new(cfg.rope_dim, b, 1.0, context, cfg.rope_style)),
            _ => rope.clone(),
        };
        Ok(Transformer { cfg, embed, layers, output_norm, output, rope, rope_swa })
    }

    /// Prepares the weights: packs the layer weights and the LM head for the tile GEMM where the
    /// CPU has one (the file's pages of a tied embedding are then read back only for the rows
    /// the embedding gathers).
    pub fn prepare(&self, pool: &ThreadPool) {
        for l in &self.layers {
            for w in [&l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_gate, &l.ffn_up, &l.ffn_down] {
                w.weight.prepare(pool);
            }
        }
        self.output.prepare(pool);
    }

    /// A KV cache for `context` positions with ring buffers for sliding-window layers, f16.
    pub fn new_cache(&self, context: usize, max_batch: usize) -> KvCache {
        self.new_cache_typed(context, max_batch, KvType::F16)
    }

    /// [`Self::new_cache`] with keys and values stored as `ty`.
    pub fn new_cache_typed(&self, context: usize, max_batch: usize, ty: KvType) -> KvCache {
        let caps: Vec<usize> = (0..self.cfg.n_layer)
            .map(|l| match (self.cfg.sliding_window, self.cfg.swa_layers[l]) {
                (Some(w), true) => context.min(w + max_batch),
                _ => context,
            })
            .collect();
        KvCache::with_type(&caps, self.cfg.n_kv_head * self.cfg.head_dim, ty)
    }

    pub fn new_scratch(&self, max_batch: usize) -> Scratch {
        let c = &self.cfg;
        let (q_dim, kv_dim) = (c.n_head * c.head_dim, c.n_kv_head * c.head_dim);
        Scratch {
            max_batch,
            x: vec![0.0; max_batch * c.d_model],
            xn: vec![0.0; max_batch * c.d_model],
            q: vec![0.0; max_batch * q_dim],
            k: vec![0.0; max_batch * kv_dim],
            v: vec![0.0; max_batch * kv_dim],
            attn: vec![0.0; max_batch * q_dim],
            proj: vec![0.0; max_batch * c.d_model],
            gate: vec![0.0; max_batch * c.ff_dim],
            up: vec![0.0; max_batch * c.ff_dim],
            logits: vec![0.0; c.vocab_size],
            head_logits: Vec::new(),
            att_scores: Vec::new(),
        }
    }

    /// Runs `tokens` (at most `scratch.max_batch`) at positions `pos0..`, appending their keys
    /// and values to `cache`, and leaves the logits of the last token in `scratch.logits`.
    pub fn forward(&self, tokens: &[u32], pos0: usize, cache: &mut KvCache, s: &mut Scratch, pool: &ThreadPool) -> Result<()> {
        self.forward_hidden(tokens, pos0, AttentionMask::Causal, cache, s, pool)?;
        let d = self.cfg.d_model;
        let n = tokens.len();
        let (x, xn, logits) = (&s.x, &mut s.xn, &mut s.logits);
        self.head(&x[(n - 1) * d..n * d], 1, &mut xn[..d], logits, pool);
        Ok(())
    }

    /// Like [`forward`](Self::forward) under attention `mask`, then calls `each(t, logits)` with
    /// the logits of every token `t` of `tokens` in order (the LM head runs on a few tokens at a
    /// time, so memory stays at a few vocabulary rows). `scratch.logits` is left unspecified.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_each_logits(
        &self,
        tokens: &[u32],
        pos0: usize,
        mask: AttentionMask,
        cache: &mut KvCache,
        s: &mut Scratch,
        pool: &ThreadPool,
        each: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<()> {
        const HEAD_BATCH: usize = 8;
        self.forward_hidden(tokens, pos0, mask, cache, s, pool)?;
        let (d, v, n) = (self.cfg.d_model, self.cfg.vocab_size, tokens.len());
        if s.head_logits.len() < HEAD_BATCH.min(n) * v {
            s.head_logits.resize(HEAD_BATCH.min(n) * v, 0.0);
        }
        let mut t0 = 0;
        while t0 < n {
            let m = HEAD_BATCH.min(n - t0);
            let (x, xn, out) = (&s.x, &mut s.xn, &mut s.head_logits);
            self.head(&x[t0 * d..(t0 + m) * d], m, &mut xn[..m * d], &mut out[..m * v], pool);
            for i in 0..m {
                each(t0 + i, &out[i * v..(i + 1) * v]);
            }
            t0 += m;
        }
        Ok(())
    }

    /// Like [`forward`](Self::forward) under attention `mask`, then calls `each(t, h)` with the
    /// final hidden state of every token `t` of `tokens` after the output norm: the vector the
    /// LM head multiplies (and what llama.cpp's embedding mode pools). The LM head does not run.
    /// `scratch.logits` is left unspecified.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_each_hidden(
        &self,
        tokens: &[u32],
        pos0: usize,
        mask: AttentionMask,
        cache: &mut KvCache,
        s: &mut Scratch,
        pool: &ThreadPool,
        each: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<()> {
        self.forward_hidden(tokens, pos0, mask, cache, s, pool)?;
        let (d, n) = (self.cfg.d_model, tokens.len());
        self.output_norm_rows(&s.x[..n * d], &mut s.xn[..n * d]);
        for t in 0..n {
            each(t, &s.xn[t * d..(t + 1) * d]);
        }
        Ok(())
    }

    /// The final (output) norm of each hidden row of `x` into `xn`.
    fn output_norm_rows(&self, x: &[f32], xn: &mut [f32]) {
        let d = self.cfg.d_model;
        for (row, out) in x.chunks_exact(d).zip(xn.chunks_exact_mut(d)) {
            ops::rms_norm(row, &self.output_norm, self.cfg.norm_eps, out);
        }
    }

    /// Final norm, LM head and soft-capping for `m` hidden rows `x`.
    fn head(&self, x: &[f32], m: usize, xn: &mut [f32], logits: &mut [f32], pool: &ThreadPool) {
        let c = &self.cfg;
        let d = c.d_model;
        self.output_norm_rows(&x[..m * d], &mut xn[..m * d]);
        matmul(pool, &self.output, &xn[..m * d], m, &mut logits[..m * c.vocab_size]);
        if let Some(cap) = c.final_logit_softcap {
            logits[..m * c.vocab_size].iter_mut().for_each(|v| *v = (*v / cap).tanh() * cap);
        }
    }

    /// The layers: leaves the final hidden state of every token in `s.x`.
    fn forward_hidden(&self, tokens: &[u32], pos0: usize, mask: AttentionMask, cache: &mut KvCache, s: &mut Scratch, pool: &ThreadPool) -> Result<()> {
        let c = &self.cfg;
        let n = tokens.len();
        if n == 0 || n > s.max_batch {
            return Err(Error::Internal(format!("forward called with {n} tokens (max {})", s.max_batch)));
        }
        if pos0 + n > self.rope.max_pos() {
            return Err(Error::ContextOverflow { tokens: pos0 + n, context: self.rope.max_pos() });
        }
        let d = c.d_model;
        let (q_dim, kv_dim) = (c.n_head * c.head_dim, c.n_kv_head * c.head_dim);
        for (t, &tok) in tokens.iter().enumerate() {
            if tok as usize >= c.vocab_size {
                return Err(Error::InvalidArg(format!("token id {tok} is outside the vocabulary ({})", c.vocab_size)));
            }
            let row = &mut s.x[t * d..(t + 1) * d];
            self.embed.dequantize_row(tok as usize, row);
            if let Some(scale) = c.embed_scale {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
        // The request's adapters, which the cached keys and values are computed with; taken out
        // of the cache for the pass (no copy) and put back after it (nothing below returns early).
        let lora = std::mem::take(&mut cache.adapters);
        for (l, layer) in self.layers.iter().enumerate() {
            let swa = c.swa_layers[l];
            let rope = if swa { &self.rope_swa } else { &self.rope };
            // Attention block.
            for t in 0..n {
                ops::rms_norm(&s.x[t * d..(t + 1) * d], &layer.attn_norm, c.norm_eps, &mut s.xn[t * d..(t + 1) * d]);
            }
            let xn = &s.xn[..n * d];
            Linear::forward_fused(pool, [&layer.wq, &layer.wk, &layer.wv], xn, n, &mut [&mut s.q[..n * q_dim], &mut s.k[..n * kv_dim], &mut s.v[..n * kv_dim]], &lora);
            for t in 0..n {
                let q = &mut s.q[t * q_dim..(t + 1) * q_dim];
                let k = &mut s.k[t * kv_dim..(t + 1) * kv_dim];
                let v = &s.v[t * kv_dim..(t + 1) * kv_dim];
                if let Some(w) = &layer.q_norm {
                    ops::rms_norm_chunks_inplace(q, w, c.norm_eps);
                }
                if let Some(w) = &layer.k_norm {
                    ops::rms_norm_chunks_inplace(k, w, c.norm_eps);
                }
                rope.apply(q, c.head_dim, pos0 + t);
                rope.apply(k, c.head_dim, pos0 + t);
                cache.layers[l].store(pos0 + t, k, v);
            }
            let window = if swa { c.sliding_window } else { None };
            self.attention(&cache.layers[l], n, pos0, Span { mask, window }, s, pool);
            layer.wo.forward(pool, &s.attn[..n * q_dim], n, &mut s.proj[..n * d], &lora);
            for t in 0..n {
                let proj = &mut s.proj[t * d..(t + 1) * d];
                if let Some(w) = &layer.post_attn_norm {
                    ops::rms_norm_chunks_inplace(proj, w, c.norm_eps);
                }
                ops::add_inplace(&mut s.x[t * d..(t + 1) * d], proj);
            }
            // Feed-forward block.
            for t in 0..n {
                ops::rms_norm(&s.x[t * d..(t + 1) * d], &layer.ffn_norm, c.norm_eps, &mut s.xn[t * d..(t + 1) * d]);
            }
            let xn = &s.xn[..n * d];
            let ff = c.ff_dim;
            Linear::forward_fused(pool, [&layer.ffn_gate, &layer.ffn_up], xn, n, &mut [&mut s.gate[..n * ff], &mut s.up[..n * ff]], &lora);
            match c.activation {
                Activation::GeluTanh => ops::gelu_tanh_mul(&mut s.gate[..n * ff], &s.up[..n * ff]),
                Activation::Silu => ops::silu_mul(&mut s.gate[..n * ff], &s.up[..n * ff]),
            }
            layer.ffn_down.forward(pool, &s.gate[..n * ff], n, &mut s.proj[..n * d], &lora);
            for t in 0..n {
                let proj = &mut s.proj[t * d..(t + 1) * d];
                if let Some(w) = &layer.post_ffn_norm {
                    ops::rms_norm_chunks_inplace(proj, w, c.norm_eps);
                }
                ops::add_inplace(&mut s.x[t * d..(t + 1) * d], proj);
            }
        }
        cache.adapters = lora;
        cache.tokens.truncate(pos0);
        cache.tokens.extend_from_slice(tokens);
        Ok(())
    }

    /// Attention of the `n` new queries over the cache, each seeing the positions `span` gives it.
    fn attention(&self, cache: &LayerCache, n: usize, pos0: usize, span: Span, s: &mut Scratch, pool: &ThreadPool) {
        match &cache.rows {
            KvRows::F16 { k, v } => self.attention_rows(cache, k, v, n, pos0, span, s, pool),
            KvRows::F32 { k, v } => self.attention_rows(cache, k, v, n, pos0, span, s, pool),
        }
    }

    /// [`Self::attention`] over key and value rows `kc`, `vc` of the cache's element type.
    #[allow(clippy::too_many_arguments)]
    fn attention_rows<T: KvElem>(&self, cache: &LayerCache, kc: &[T], vc: &[T], n: usize, pos0: usize, span: Span, s: &mut Scratch, pool: &ThreadPool) {
        let c = &self.cfg;
        let (hd, n_head) = (c.head_dim, c.n_head);
        let group = n_head / c.n_kv_head;
        let q_dim = n_head * hd;
        let kv_row = c.n_kv_head * hd;
        let attn = SharedMut(s.attn.as_mut_ptr());
        let q_all = &s.q;
        let scale = c.attn_scale;
        // One task per (token, KV head, sub-group of the query heads sharing it): the task
        // passes over the key and value rows once per four of its heads
        // (`attention::scores_heads`/`attention::weighted_sum_heads`: per head the operations of
        // `attention::scores`/`attention::weighted_sum`, identical whatever the grouping).
        // Sub-groups are as large as keeps every thread busy: decode with one KV head on two
        // threads runs two tasks of half the heads.
        let n_kv = c.n_kv_head;
        // Decode (fewer query/KV-head pairs than threads) over a long span: split the positions
        // and the value dimensions over the threads instead, so each thread reads its share of
        // the keys and values rather than all of them.
        let stored = pos0 + n;
        if n * n_kv < pool.threads() && span.of(pos0 + n - 1, stored).1 >= SPLIT_MIN_SPAN && hd.is_multiple_of(16 * pool.threads()) {
            return self.attention_split(cache, kc, vc, n, pos0, span, s, pool);
        }
        let mut hs = group;
        while hs > 1 && hs.is_multiple_of(2) && n * n_kv * (group / hs) < pool.threads() {
            hs /= 2;
        }
        let subs = group / hs;
        let grouped = |i: usize| {
            let (t, g, sub) = (i / (n_kv * subs), (i / subs) % n_kv, i % subs);
            let (lo, span) = span.of(pos0 + t, stored);
            let h0 = g * group + sub * hs;
            let q = &q_all[t * q_dim + h0 * hd..t * q_dim + (h0 + hs) * hd];
            // SAFETY: task i owns attn[t*q_dim + h0*hd ..][..hs*hd]: disjoint across tasks.
            let out = unsafe { std::slice::from_raw_parts_mut(attn.ptr().add(t * q_dim + h0 * hd), hs * hd) };
            SCORES.with(|cell| {
                let (buf, offs) = &mut *cell.borrow_mut();
                if buf.len() < hs * span {
                    buf.resize(hs * span, 0.0);
                }
                // Where each visible position's key and value rows start.
                offs.clear();
                offs.extend((lo..lo + span).map(|p| cache.slot(p) * kv_row + g * hd));
                // Up to four heads at a time over the same key and value rows.
                for (h0, hn) in head_chunks(0, hs) {
                    let sc = &mut buf[h0 * span..(h0 + hn) * span];
                    let qs = up_to_four(q[h0 * hd..(h0 + hn) * hd].chunks(hd));
                    attention::scores_heads(&qs[..hn], kc, offs, scale, &mut up_to_four_mut(sc.chunks_mut(span))[..hn]);
                    sc.chunks_mut(span).for_each(ops::softmax_inplace);
                    let ws = up_to_four(sc.chunks(span));
                    attention::weighted_sum_heads(&ws[..hn], vc, offs, &mut up_to_four_mut(out[h0 * hd..(h0 + hn) * hd].chunks_mut(hd))[..hn]);
                }
            });
        };
        pool.for_each(n * n_kv * subs, &grouped);
    }

    /// [`Self::attention`] for few queries over many positions, with the work split so that
    /// each thread reads a share of the keys and values: (1) scores, positions split over the
    /// tasks (each task scores its positions for every head of the group, four heads per pass
    /// over a block of rows); (2) softmax, one task per head; (3) value sums, the head
    /// dimension split over the tasks. Every score, softmax and output element is computed by
    /// the same operations in the same order as in `attention`, so the result is identical.
    #[allow(clippy::too_many_arguments)]
    fn attention_split<T: KvElem>(&self, cache: &LayerCache, kc: &[T], vc: &[T], n: usize, pos0: usize, span: Span, s: &mut Scratch, pool: &ThreadPool) {
        let c = &self.cfg;
        let (hd, n_head, n_kv) = (c.head_dim, c.n_head, c.n_kv_head);
        let group = n_head / n_kv;
        let (q_dim, kv_row, scale) = (n_head * hd, n_kv * hd, c.attn_scale);
        let span_of = |t: usize| span.of(pos0 + t, pos0 + n);
        let stride = (0..n).map(|t| span_of(t).1).max().unwrap_or(0);
        // Scores of (token t, head h) at row t * n_head + h.
        if s.att_scores.len() < n * n_head * stride {
            s.att_scores.resize(n * n_head * stride, 0.0);
        }
        let sc = SharedMut(s.att_scores.as_mut_ptr());
        let parts = pool.threads();
        let q_all = &s.q;
        pool.for_each(parts, &|i| {
            SCORES.with(|cell| {
                let offs = &mut cell.borrow_mut().1;
                for t in 0..n {
                    let (lo, span) = span_of(t);
                    let (a, b) = (i * span / parts, (i + 1) * span / parts);
                    for g in 0..n_kv {
                        for blk in (a..b).step_by(SPLIT_BLOCK) {
                            let e = (blk + SPLIT_BLOCK).min(b);
                            offs.clear();
                            offs.extend((lo + blk..lo + e).map(|p| cache.slot(p) * kv_row + g * hd));
                            for (h0, hn) in head_chunks(g * group, (g + 1) * group) {
                                let qs = up_to_four(q_all[t * q_dim + h0 * hd..t * q_dim + (h0 + hn) * hd].chunks(hd));
                                // SAFETY: task i owns positions a..b of every score row.
                                let mut outs = up_to_four_mut((h0..h0 + hn).map(|h| unsafe { std::slice::from_raw_parts_mut(sc.ptr().add((t * n_head + h) * stride + blk), e - blk) }));
                                attention::scores_heads(&qs[..hn], kc, offs, scale, &mut outs[..hn]);
                            }
                        }
                    }
                }
            });
        });
        pool.for_each(n * n_head, &|r| {
            // SAFETY: task r owns score row r.
            let row = unsafe { std::slice::from_raw_parts_mut(sc.ptr().add(r * stride), span_of(r / n_head).1) };
            ops::softmax_inplace(row);
        });
        let attn = SharedMut(s.attn.as_mut_ptr());
        let scores = &s.att_scores;
        let width = hd / parts;
        pool.for_each(parts, &|i| {
            let d0 = i * width;
            SCORES.with(|cell| {
                let offs = &mut cell.borrow_mut().1;
                for t in 0..n {
                    let (lo, span) = span_of(t);
                    for g in 0..n_kv {
                        offs.clear();
                        offs.extend((lo..lo + span).map(|p| cache.slot(p) * kv_row + g * hd + d0));
                        for (h0, hn) in head_chunks(g * group, (g + 1) * group) {
                            let ws = up_to_four((h0..h0 + hn).map(|h| &scores[(t * n_head + h) * stride..][..span]));
                            // SAFETY: task i owns columns d0..d0 + width of every head's output.
                            let mut outs = up_to_four_mut((h0..h0 + hn).map(|h| unsafe { std::slice::from_raw_parts_mut(attn.ptr().add(t * q_dim + h * hd + d0), width) }));
                            attention::weighted_sum_heads(&ws[..hn], vc, offs, &mut outs[..hn]);
                        }
                    }
                }
            });
        });
    }
}

/// What one layer's queries see: the call's mask, within the layer's sliding window.
#[derive(Clone, Copy)]
struct Span {
    mask: AttentionMask,
    window: Option<usize>,
}

impl Span {
    /// (first position, count) for the query at `pos` with `0..stored` in the cache.
    fn of(self, pos: usize, stored: usize) -> (usize, usize) {
        self.mask.visible(pos, stored, self.window)
    }
}

/// Query heads the attention kernels serve per pass over a KV head's rows
/// ([`attention::scores_heads`], [`attention::weighted_sum_heads`]).
const HEADS_AT_ONCE: usize = 4;

/// Heads `lo..hi` as (first head, count) chunks of at most [`HEADS_AT_ONCE`].
fn head_chunks(lo: usize, hi: usize) -> impl Iterator<Item = (usize, usize)> {
    (lo..hi).step_by(HEADS_AT_ONCE).map(move |h0| (h0, (hi - h0).min(HEADS_AT_ONCE)))
}

/// The first four items of `it` (empty slices after it ends), for the multi-head kernels
/// without allocating.
fn up_to_four<'a>(mut it: impl Iterator<Item = &'a [f32]>) -> [&'a [f32]; HEADS_AT_ONCE] {
    std::array::from_fn(|_| it.next().unwrap_or(&[]))
}

/// [`up_to_four`] for mutable rows.
fn up_to_four_mut<'a>(mut it: impl Iterator<Item = &'a mut [f32]>) -> [&'a mut [f32]; HEADS_AT_ONCE] {
    std::array::from_fn(|_| it.next().unwrap_or(&mut []))
}

/// Shortest span for [`Transformer::attention_split`] (shorter ones keep one task per head
/// group: the extra pool jobs would cost more than the split saves).
const SPLIT_MIN_SPAN: usize = 64;
/// Positions per block in the split score pass (128 key rows of 256 f16: 64 KB, in L2 while
/// the heads of a group beyond the first four score them again).
const SPLIT_BLOCK: usize = 128;
