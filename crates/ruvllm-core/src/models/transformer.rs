//! The decoder-only transformer shared by our architecture families. Each family file
//! (`gemma3.rs`, `llama.rs`) reads its checkpoint's metadata into a [`TransformerConfig`] and
//! loads its tensors by their GGUF names; the forward pass here follows llama.cpp's graphs
//! (`llm_build_gemma3_iswa`, `llm_build_llama`, `llm_build_qwen2`) so greedy output matches it.

use std::sync::Arc;

pub use crate::backend::Activation;
use crate::backend::{AttnShape, Backend, Buf, BufWidths, QWeight, QkNorms, RopeScaling, RopeStyle, RopeTable, Span, WeightData};
use crate::gguf::{GgmlType, GgufFile, TensorInfo};
use crate::kv::{KvCache, KvType};
use crate::nn::{AttentionMask, Linear, LoraAdapter, Proj};
use crate::{Error, Result};

/// What [`Transformer::forward_each`] hands back per token.
#[derive(Debug, Clone, Copy)]
pub enum Outputs<'r> {
    /// The logits of every token (after soft-capping).
    Logits,
    /// The logits of the tokens at these offsets only (any order, each at most once).
    LogitsOf(&'r [usize]),
    /// The final hidden state after the output norm: the vector the LM head multiplies (and
    /// what llama.cpp's embedding mode pools). The LM head does not run.
    Hidden,
}

/// One sequence's rows in a pass of [`Transformer::forward_segments`]: its tokens at positions
/// `pos0..` of its cache.
pub struct Segment<'a> {
    pub tokens: &'a [u32],
    pub pos0: usize,
    pub cache: &'a mut KvCache,
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
    /// Attention-score soft-capping, `cap · tanh(s / cap)` before the softmax (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// RoPE frequency factors and attention factor (Llama 3.1's `rope_freqs`, Phi-3's LongRoPE).
    pub rope_factors: RopeFactors,
}

/// Per-frequency RoPE divisors a checkpoint ships as tensors.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum RopeFactors {
    #[default]
    None,
    /// One set for every context (`rope_freqs.weight`, Llama 3.1/3.2's `rope_scaling: llama3`).
    Fixed(Vec<f32>),
    /// LongRoPE (Phi-3): the long factors for a context longer than the training context
    /// `original`, else the short ones, as llama.cpp chooses them (`get_rope_factors`); both
    /// with cos and sin multiplied by `attn_factor`.
    LongShort { original: usize, short: Vec<f32>, long: Vec<f32>, attn_factor: f32 },
}

impl RopeFactors {
    /// The table scaling for a cache of `context` positions.
    pub fn scaling(&self, context: usize) -> RopeScaling {
        match self {
            RopeFactors::None => RopeScaling::default(),
            RopeFactors::Fixed(f) => RopeScaling { freq_factors: Some(f.clone()), attn_factor: 1.0 },
            RopeFactors::LongShort { original, short, long, attn_factor } => {
                RopeScaling { freq_factors: Some(if context > *original { long.clone() } else { short.clone() }), attn_factor: *attn_factor }
            }
        }
    }

    /// Reads `rope_freqs.weight`, or LongRoPE's `rope_factors_long/short.weight` with the
    /// training context `original` and `attn_factor`, each `rope_dim / 2` long.
    pub fn load(w: &WeightLoader, rope_dim: usize, original: usize, attn_factor: f32) -> Result<Self> {
        let half = rope_dim / 2;
        if let Some(f) = w.optional_vector("rope_freqs.weight", half)? {
            return Ok(RopeFactors::Fixed(f));
        }
        match (w.optional_vector("rope_factors_short.weight", half)?, w.optional_vector("rope_factors_long.weight", half)?) {
            (Some(short), Some(long)) => Ok(RopeFactors::LongShort { original, short, long, attn_factor }),
            (None, None) => Ok(RopeFactors::None),
            _ => Err(Error::gguf(&w.file.path, "the file has only one of rope_factors_short.weight and rope_factors_long.weight")),
        }
    }
}

/// One decoder block's weights, by GGUF name `blk.N.*`.
#[derive(Clone)]
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
        self.file.tensor(name).ok_or_else(|| Error::gguf(&self.file.path, format!("missing tensor '{name}'")))
    }

    pub fn has(&self, name: &str) -> bool {
        self.file.tensor(name).is_some()
    }

    /// A `rows × cols` matrix (GGUF dims `[cols, rows]`), kept in its quantized form.
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<QWeight> {
        self.matrix_rows(name, rows, cols, 0, rows)
    }

    /// Rows `row0..row0 + rows` of the `total × cols` matrix `name`: a view of the file's bytes
    /// (a fused weight taken apart by rows, as Phi-3's `attn_qkv` and `ffn_up`).
    pub fn matrix_rows(&self, name: &str, total: usize, cols: usize, row0: usize, rows: usize) -> Result<QWeight> {
        let info = self.info(name)?;
        if info.dims != [cols as u64, total as u64] {
            return Err(Error::gguf(&self.file.path, format!("tensor '{name}' has shape {:?}, expected [{cols}, {total}]", info.dims)));
        }
        if !info.dtype.is_supported_weight() {
            return Err(Error::unsupported(&self.file.path, format!("tensor '{name}' has type {}, which ruvllm cannot run yet", info.dtype.name())));
        }
        let row_bytes = info
            .dtype
            .bytes_for(cols as u64)
            .ok_or_else(|| Error::gguf(&self.file.path, format!("tensor '{name}': {cols} columns do not fill whole blocks of {}", info.dtype.name())))?
            as usize;
        debug_assert!(row0 + rows <= total);
        let data = WeightData::Mapped { storage: self.file.storage(), offset: info.offset as usize + row0 * row_bytes, len: rows * row_bytes };
        QWeight::new(info.dtype, rows, cols, data).map_err(|m| Error::gguf(&self.file.path, format!("tensor '{name}': {m}")))
    }

    /// A 1-D tensor of length `len`, as f32.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let info = self.info(name)?;
        if info.dims != [len as u64] {
            return Err(Error::gguf(&self.file.path, format!("tensor '{name}' has shape {:?}, expected [{len}]", info.dims)));
        }
        if !matches!(info.dtype, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            return Err(Error::unsupported(&self.file.path, format!("1-D tensor '{name}' has type {}; expected F32, F16 or BF16", info.dtype.name())));
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
        // Phi-3 fuses Q, K and V into `attn_qkv` and the FFN's gate and up (gate first) into
        // `ffn_up`: each part is a view of its rows.
        let qkv = p("attn_qkv.weight");
        let (wq, wk, wv) = if w.has(&qkv) {
            let part = |row0, rows, pr| -> Result<Linear> { Ok(Linear::new(w.matrix_rows(&qkv, q_dim + 2 * kv_dim, d, row0, rows)?, None, i, pr)) };
            (part(0, q_dim, Proj::Q)?, part(q_dim, kv_dim, Proj::K)?, part(q_dim + kv_dim, kv_dim, Proj::V)?)
        } else {
            (
                lin(Proj::Q, q_dim, d, bias("attn_q.bias", q_dim)?)?,
                lin(Proj::K, kv_dim, d, bias("attn_k.bias", kv_dim)?)?,
                lin(Proj::V, kv_dim, d, bias("attn_v.bias", kv_dim)?)?,
            )
        };
        let (up, ff) = (p("ffn_up.weight"), cfg.ff_dim);
        let (ffn_gate, ffn_up) = if w.has(&p("ffn_gate.weight")) {
            (lin(Proj::Gate, ff, d, None)?, lin(Proj::Up, ff, d, None)?)
        } else {
            (Linear::new(w.matrix_rows(&up, 2 * ff, d, 0, ff)?, None, i, Proj::Gate), Linear::new(w.matrix_rows(&up, 2 * ff, d, ff, ff)?, None, i, Proj::Up))
        };
        let layer = Layer {
            attn_norm: w.vector(&p("attn_norm.weight"), d)?,
            wq,
            wk,
            wv,
            wo: lin(Proj::O, d, q_dim, None)?,
            q_norm: if cfg.qk_norm { Some(w.vector(&p("attn_q_norm.weight"), cfg.head_dim)?) } else { None },
            k_norm: if cfg.qk_norm { Some(w.vector(&p("attn_k_norm.weight"), cfg.head_dim)?) } else { None },
            post_attn_norm: if cfg.sandwich_norm { Some(w.vector(&p("post_attention_norm.weight"), d)?) } else { norm("post_attention_norm.weight", d)? },
            ffn_norm: w.vector(&p("ffn_norm.weight"), d)?,
            ffn_gate,
            ffn_up,
            ffn_down: lin(Proj::Down, d, cfg.ff_dim, None)?,
            post_ffn_norm: if cfg.sandwich_norm { Some(w.vector(&p("post_ffw_norm.weight"), d)?) } else { None },
        };
        Ok(layer)
    }
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
        let scaling = cfg.rope_factors.scaling(context);
        let rope = Arc::new(RopeTable::scaled(cfg.rope_dim, cfg.rope_base, cfg.rope_linear_factor, &scaling, context, cfg.rope_style));
        let rope_swa = match cfg.rope_base_swa {
            Some(b) if b != cfg.rope_base => Arc::new(RopeTable::scaled(cfg.rope_dim, b, 1.0, &scaling, context, cfg.rope_style)),
            _ => rope.clone(),
        };
        Ok(Transformer { cfg, embed, layers, output_norm, output, rope, rope_swa })
    }

    /// This model with `adapter`'s factors at `scale` folded into the projections it changes
    /// ([`Linear::merged`]); everything else is shared. The layers are merged on up to
    /// `threads` threads (a rank-48 adapter of Gemma 3 270M: about 5 GFLOP).
    pub fn merged(&self, adapter: &LoraAdapter, scale: f32, threads: usize) -> Result<Transformer> {
        let s = scale * adapter.base_scale;
        let merge_layer = |l: usize| -> Result<Layer> {
            let mut layer = self.layers[l].clone();
            for lin in [&mut layer.wq, &mut layer.wk, &mut layer.wv, &mut layer.wo, &mut layer.ffn_gate, &mut layer.ffn_up, &mut layer.ffn_down] {
                if let Some(pair) = adapter.pair(l, lin.proj) {
                    *lin = lin.merged(pair, s)?;
                }
            }
            Ok(layer)
        };
        let n = self.layers.len();
        let threads = threads.clamp(1, n.max(1));
        // A thread that panicked hands back nothing: its layers are missing below.
        let mut done: Vec<(usize, Result<Layer>)> = std::thread::scope(|sc| {
            let handles: Vec<_> = (0..threads).map(|t| sc.spawn(move || (t..n).step_by(threads).map(|l| (l, merge_layer(l))).collect::<Vec<_>>())).collect();
            handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
        });
        if done.len() != n {
            return Err(Error::Internal("a merging thread failed".into()));
        }
        done.sort_by_key(|d| d.0);
        let layers = done.into_iter().map(|d| d.1).collect::<Result<Vec<_>>>()?;
        Ok(Transformer {
            cfg: self.cfg.clone(),
            embed: self.embed.clone(),
            layers,
            output_norm: self.output_norm.clone(),
            output: self.output.clone(),
            rope: self.rope.clone(),
            rope_swa: self.rope_swa.clone(),
        })
    }

    /// The RoPE table layer `l` uses.
    pub fn rope_for(&self, l: usize) -> &RopeTable {
        if self.cfg.swa_layers[l] {
            &self.rope_swa
        } else {
            &self.rope
        }
    }

    /// Prepares `be` to run this model on up to `max_batch` tokens per pass: the weights
    /// (the CPU packs the layer weights and the LM head for its tile GEMM, after which the
    /// file's pages of a tied embedding are read back only for the rows the embedding gathers)
    /// and the activation buffers.
    pub fn prepare(&self, be: &mut dyn Backend, max_batch: usize) {
        for w in self.layer_weights() {
            be.prepare_weight(w);
        }
        be.prepare_head(&self.output);
        self.reserve(be, max_batch);
    }

    /// The seven projection weights of every block, in order.
    pub fn layer_weights(&self) -> impl Iterator<Item = &QWeight> {
        self.layers.iter().flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_gate, &l.ffn_up, &l.ffn_down].map(|x| &x.weight))
    }

    /// Sizes `be`'s activation buffers for up to `max_batch` tokens per pass.
    pub fn reserve(&self, be: &mut dyn Backend, max_batch: usize) {
        let c = &self.cfg;
        let widths =
            BufWidths { d_model: c.d_model, q_dim: c.n_head * c.head_dim, kv_dim: c.n_kv_head * c.head_dim, ff_dim: c.ff_dim, vocab_size: c.vocab_size };
        be.reserve(widths, max_batch);
    }

    /// Slots per layer of a cache for `context` positions: sliding-window layers keep a ring
    /// of their window and one batch.
    fn cache_capacities(&self, context: usize, max_batch: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.cfg.n_layer).map(move |l| match (self.cfg.sliding_window, self.cfg.swa_layers[l]) {
            (Some(w), true) => context.min(w + max_batch),
            _ => context,
        })
    }

    /// Bytes of keys and values in [`Self::new_cache_typed`]'s cache.
    pub fn cache_bytes(&self, context: usize, max_batch: usize, ty: KvType) -> usize {
        let row = self.cfg.n_kv_head * self.cfg.head_dim;
        self.cache_capacities(context, max_batch).map(|cap| 2 * ty.bytes(cap * row)).sum()
    }

    /// A KV cache for `context` positions with ring buffers for sliding-window layers, f16.
    pub fn new_cache(&self, be: &dyn Backend, context: usize, max_batch: usize) -> KvCache {
        self.new_cache_typed(be, context, max_batch, KvType::F16)
    }

    /// [`Self::new_cache`] with keys and values stored as `ty`.
    pub fn new_cache_typed(&self, be: &dyn Backend, context: usize, max_batch: usize, ty: KvType) -> KvCache {
        let row = self.cfg.n_kv_head * self.cfg.head_dim;
        let layers = self.cache_capacities(context, max_batch).map(|cap| be.new_layer_cache(cap, row, ty)).collect();
        KvCache::from_layers(layers, row)
    }

    /// Runs `tokens` (at most `be.max_batch()`) at positions `pos0..`, appending their keys
    /// and values to `cache`, and leaves the logits of the last token in `be.logits()`.
    pub fn forward(&self, tokens: &[u32], pos0: usize, cache: &mut KvCache, be: &mut dyn Backend) -> Result<()> {
        self.forward_hidden(tokens, pos0, AttentionMask::Causal, cache, be)?;
        let n = tokens.len();
        be.lm_head_deferred(&self.output, &self.output_norm, self.cfg.norm_eps, self.cfg.final_logit_softcap, &[n - 1]);
        be.status()
    }

    /// Like [`forward`](Self::forward) under attention `mask`, then calls `each(i, row)` with
    /// what `outputs` asks for: the logits of every token (`i` its offset in `tokens`), of the
    /// tokens at some offsets only (`i` the index into that list; the LM head runs only on
    /// those rows: a diffusion step needs the logits of its masked positions alone), or every
    /// token's final hidden state. The LM head runs on a few tokens at a time, so memory stays
    /// at a few vocabulary rows. `be.logits()` is left unspecified.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_each(
        &self,
        tokens: &[u32],
        pos0: usize,
        mask: AttentionMask,
        cache: &mut KvCache,
        be: &mut dyn Backend,
        outputs: Outputs<'_>,
        each: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<()> {
        const HEAD_BATCH: usize = 8;
        let all: Vec<usize>;
        let rows = match outputs {
            Outputs::Hidden => return self.each_hidden(tokens, pos0, mask, cache, be, each),
            Outputs::Logits => {
                all = (0..tokens.len()).collect();
                &all[..]
            }
            Outputs::LogitsOf(rows) => rows,
        };
        if let Some(&r) = rows.iter().find(|&&r| r >= tokens.len()) {
            return Err(Error::Internal(format!("logits asked for row {r} of a {}-token call", tokens.len())));
        }
        self.forward_hidden(tokens, pos0, mask, cache, be)?;
        let v = self.cfg.vocab_size;
        for (c, chunk) in rows.chunks(HEAD_BATCH).enumerate() {
            self.head(be, chunk);
            be.status()?;
            let out = be.logits();
            for i in 0..chunk.len() {
                each(c * HEAD_BATCH + i, &out[i * v..(i + 1) * v]);
            }
        }
        Ok(())
    }

    /// [`forward_each`](Self::forward_each) for [`Outputs::Hidden`].
    fn each_hidden(
        &self,
        tokens: &[u32],
        pos0: usize,
        mask: AttentionMask,
        cache: &mut KvCache,
        be: &mut dyn Backend,
        each: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<()> {
        self.forward_hidden(tokens, pos0, mask, cache, be)?;
        let (d, n) = (self.cfg.d_model, tokens.len());
        let h = be.final_hidden(&self.output_norm, self.cfg.norm_eps, n);
        if h.len() < n * d {
            // A GPU backend that failed hands back nothing.
            let got = h.len();
            be.status()?;
            return Err(Error::Internal(format!("final_hidden gave {got} values for {n} tokens")));
        }
        for t in 0..n {
            each(t, &h[t * d..(t + 1) * d]);
        }
        Ok(())
    }

    /// Final norm, LM head and soft-capping for rows `rows` of the hidden state.
    fn head<'b>(&self, be: &'b mut dyn Backend, rows: &[usize]) -> &'b mut [f32] {
        be.lm_head(&self.output, &self.output_norm, self.cfg.norm_eps, self.cfg.final_logit_softcap, rows)
    }

    /// The layers: leaves the final hidden state of every token in `X`.
    fn forward_hidden(&self, tokens: &[u32], pos0: usize, mask: AttentionMask, cache: &mut KvCache, be: &mut dyn Backend) -> Result<()> {
        self.forward_segments(&mut [Segment { tokens, pos0, cache }], mask, be)
    }

    /// Runs several sequences in one pass: the rows of `segs` one after another (at most
    /// `be.max_batch()` tokens in all), the products over all of them (each weight read once
    /// for every sequence), RoPE, the KV store and attention per sequence at its own positions
    /// in its own cache. Leaves the final hidden state of every row in `X`, in the order of
    /// `segs`: the LM head then takes the rows it wants ([`Self::heads_deferred`]). All segments
    /// run under the first one's adapters (the caller groups sequences by adapter set), and
    /// more than one segment needs a backend that [runs segments](Backend::runs_segments).
    pub fn forward_segments(&self, segs: &mut [Segment<'_>], mask: AttentionMask, be: &mut dyn Backend) -> Result<()> {
        let c = &self.cfg;
        let n: usize = segs.iter().map(|s| s.tokens.len()).sum();
        if n == 0 || n > be.max_batch() || segs.iter().any(|s| s.tokens.is_empty()) {
            return Err(Error::Internal(format!("forward called with {n} tokens in {} segments (max {})", segs.len(), be.max_batch())));
        }
        if segs.len() > 1 && !be.runs_segments() {
            return Err(Error::Internal("this backend runs one sequence per pass".into()));
        }
        if segs.iter().skip(1).any(|s| !s.cache.adapters.same_as(&segs[0].cache.adapters)) {
            return Err(Error::Internal("the sequences of one pass must share their adapters".into()));
        }
        for s in segs.iter() {
            if s.pos0 + s.tokens.len() > self.rope.max_pos() {
                return Err(Error::ContextOverflow { tokens: s.pos0 + s.tokens.len(), context: self.rope.max_pos() });
            }
            if let Some(&tok) = s.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
                return Err(Error::InvalidArg(format!("token id {tok} is outside the vocabulary ({})", c.vocab_size)));
            }
        }
        let all: Vec<u32>;
        let tokens = match segs {
            [one] => one.tokens,
            _ => {
                all = segs.iter().flat_map(|s| s.tokens.iter().copied()).collect();
                &all
            }
        };
        let spans: Vec<(usize, usize)> = segs.iter().map(|s| (s.pos0, s.tokens.len())).collect();
        be.begin_segments(&spans, self.layers.len(), mask);
        be.embed(&self.embed, tokens, c.embed_scale, segs[0].cache.adapters.mask_embedding());
        let shape = AttnShape { n_head: c.n_head, n_kv_head: c.n_kv_head, head_dim: c.head_dim, scale: c.attn_scale, softcap: c.attn_softcap };
        // The first sequence's adapters, which the cached keys and values are computed with;
        // taken out of its cache for the pass (no copy) and put back after it (nothing below
        // returns early).
        let lora = std::mem::take(&mut segs[0].cache.adapters);
        // The first block's input norm; each later one comes with the residual step before it.
        be.rms_norm(Buf::X, Buf::Xn, &self.layers[0].attn_norm, c.norm_eps, n);
        for (l, layer) in self.layers.iter().enumerate() {
            let rope = self.rope_for(l);
            // Attention block.
            Linear::forward_fused(be, [&layer.wq, &layer.wk, &layer.wv], Buf::Xn, [Buf::Q, Buf::K, Buf::V], n, &lora);
            let norms = QkNorms { q: layer.q_norm.as_deref(), k: layer.k_norm.as_deref(), eps: c.norm_eps };
            let span = Span { mask, window: if c.swa_layers[l] { c.sliding_window } else { None } };
            let mut row0 = 0;
            for s in segs.iter_mut() {
                let len = s.tokens.len();
                be.segment_attention(norms, rope, &mut s.cache.layers[l], shape, span, row0, s.pos0, len);
                row0 += len;
            }
            layer.wo.forward(be, Buf::Attn, Buf::Proj, n, &lora);
            be.residual_norm(layer.post_attn_norm.as_deref(), Some(&layer.ffn_norm), c.norm_eps, n);
            // Feed-forward block.
            let plain = layer.ffn_gate.bias.is_none() && layer.ffn_up.bias.is_none() && lora.terms(l, [Proj::Gate, Proj::Up]).is_empty();
            if !(plain && be.matmul_gated(&layer.ffn_gate.weight, &layer.ffn_up.weight, c.activation, n)) {
                Linear::forward_fused(be, [&layer.ffn_gate, &layer.ffn_up], Buf::Xn, [Buf::Gate, Buf::Up], n, &lora);
                be.gated_activation(c.activation, n);
            }
            layer.ffn_down.forward(be, Buf::Gate, Buf::Proj, n, &lora);
            let next = self.layers.get(l + 1).map(|nl| nl.attn_norm.as_slice());
            be.residual_norm(layer.post_ffn_norm.as_deref(), next, c.norm_eps, n);
        }
        segs[0].cache.adapters = lora;
        for s in segs.iter_mut() {
            s.cache.tokens.truncate(s.pos0);
            s.cache.tokens.extend_from_slice(s.tokens);
            s.cache.note_written(s.pos0 + s.tokens.len());
        }
        Ok(())
    }

    /// The LM head for row `row` of the last pass, its logits left where the backend computed
    /// them until `be.argmax()` or `be.logits()` asks.
    pub fn head_deferred(&self, be: &mut dyn Backend, row: usize) {
        self.heads_deferred(be, &[row]);
    }

    /// [`head_deferred`](Self::head_deferred) for several rows (one LM head product).
    pub fn heads_deferred(&self, be: &mut dyn Backend, rows: &[usize]) {
        be.lm_head_deferred(&self.output, &self.output_norm, self.cfg.norm_eps, self.cfg.final_logit_softcap, rows);
    }

    /// The greedy token of row `row` of the last pass, where the backend finds it without
    /// computing every logit ([`HeadScreening`](crate::backend::HeadScreening)); `None`: use
    /// [`head_deferred`](Self::head_deferred).
    pub fn head_argmax(&self, be: &mut dyn Backend, row: usize) -> Option<u32> {
        be.screening()?.lm_head_argmax(&self.output, &self.output_norm, self.cfg.norm_eps, self.cfg.final_logit_softcap, row)
    }
}
