//! Backends: where the forward pass's operations run. A model file describes its graph as calls
//! on a [`Backend`] over named activation buffers ([`Buf`]) that the backend owns, so it never
//! holds host slices, a thread pool or kernel choices; the CPU backend ([`cpu::CpuBackend`]) runs
//! them on this process's kernels and thread pool. Another backend (CUDA) implements the same
//! trait, keeps the buffers and KV rows in its own memory and uploads the weights in
//! [`Memory::prepare_weight`]; the model files do not change.
//!
//! What the trait speaks in is backend-neutral data: quantized weights as the file holds them
//! ([`QWeight`]), RoPE tables ([`RopeTable`]), attention masks ([`AttentionMask`]), the KV rows
//! of one layer ([`LayerCache`], allocated by the backend) and low-rank factor pairs
//! ([`LowRank`]).

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod host_picks;
pub mod kv;
pub mod mask;
pub mod rope;

use half::f16;

pub use cpu::matmul::{QWeight, WeightData};
pub use kv::{KvType, LayerCache};
pub use mask::AttentionMask;
pub use rope::{RopeScaling, RopeStyle, RopeTable};

/// The activation buffers of a forward pass, each `max_batch` rows of its width
/// ([`BufWidths`]): a model file names them, the backend holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buf {
    /// The residual stream (`d_model` per token).
    X,
    /// A normalised copy of `X` (`d_model`).
    Xn,
    /// Queries (`n_head × head_dim`).
    Q,
    /// Keys (`n_kv_head × head_dim`).
    K,
    /// Values (`n_kv_head × head_dim`).
    V,
    /// Attention output (`n_head × head_dim`).
    Attn,
    /// A block's output projection before the residual add (`d_model`).
    Proj,
    /// The feed-forward gate (`ff_dim`).
    Gate,
    /// The feed-forward up projection (`ff_dim`).
    Up,
}

impl Buf {
    pub const ALL: [Buf; 9] = [Buf::X, Buf::Xn, Buf::Q, Buf::K, Buf::V, Buf::Attn, Buf::Proj, Buf::Gate, Buf::Up];

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Floats per token of each [`Buf`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufWidths {
    pub d_model: usize,
    pub q_dim: usize,
    pub kv_dim: usize,
    pub ff_dim: usize,
    pub vocab_size: usize,
}

impl BufWidths {
    pub fn of(&self, b: Buf) -> usize {
        match b {
            Buf::X | Buf::Xn | Buf::Proj => self.d_model,
            Buf::Q | Buf::Attn => self.q_dim,
            Buf::K | Buf::V => self.kv_dim,
            Buf::Gate | Buf::Up => self.ff_dim,
        }
    }
}

/// Feed-forward activation of a gated FFN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// GELU (tanh approximation) gate: Gemma.
    GeluTanh,
    /// SiLU gate (SwiGLU): Llama, Qwen2, Mistral.
    Silu,
}

/// Attention geometry of a layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Scale applied to the scores.
    pub scale: f32,
    /// Soft-capping of the scaled scores, `cap · tanh(s / cap)` (Gemma 2), before the mask
    /// and softmax.
    pub softcap: Option<f32>,
}

/// The per-head RMSNorm weights of queries and keys (when the model has them) and their epsilon.
#[derive(Debug, Clone, Copy)]
pub struct QkNorms<'a> {
    pub q: Option<&'a [f32]>,
    pub k: Option<&'a [f32]>,
    pub eps: f32,
}

/// How many of each row's best logits [`DevicePicks::top_logits`] hands back.
pub const TOP_LOGITS: usize = 64;

/// What a query attends to: the mask, within an optional sliding window.
#[derive(Debug, Clone, Copy)]
pub struct Span {
    pub mask: AttentionMask,
    pub window: Option<usize>,
}

/// One low-rank factor pair (a LoRA adapter's projection): `delta = B·(A·x)`, factors in half
/// precision.
#[derive(Debug, Clone, Copy)]
pub struct LowRank<'a> {
    pub rank: usize,
    pub d_in: usize,
    pub d_out: usize,
    /// `A`, `rank × d_in`, row-major.
    pub a: &'a [f16],
    /// `Bᵀ`, `rank × d_out`, row-major (column `j` of `B` is row `j` here).
    pub bt: &'a [f16],
    /// Identifies these factor values (0: unknown): a GPU backend uploads each id once.
    pub id: u64,
}

/// The low-rank deltas of one call: (output index, factors, scale) in the order they are
/// added, without allocating for up to 24 (8 adapters on 3 fused projections).
#[derive(Default)]
pub struct LowRankTerms<'a> {
    fixed: [Option<(usize, LowRank<'a>, f32)>; 24],
    len: usize,
    more: Vec<(usize, LowRank<'a>, f32)>,
}

impl<'a> LowRankTerms<'a> {
    pub fn push(&mut self, term: (usize, LowRank<'a>, f32)) {
        if self.len < self.fixed.len() {
            self.fixed[self.len] = Some(term);
            self.len += 1;
        } else {
            self.more.push(term);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = (usize, LowRank<'a>, f32)> + '_ {
        self.fixed[..self.len].iter().flatten().copied().chain(self.more.iter().copied())
    }
}

/// What a backend holds: the weights it prepared, its activation buffers, the KV rows it
/// allocates, and the work it may still be running.
pub trait Memory {
    /// A short description for logs and benchmarks (e.g. the CPU kernels' instruction set).
    fn describe(&self) -> String;
    /// How many threads the backend's CPU work runs on.
    fn threads(&self) -> usize;
    /// Prepares a weight for the products (the CPU packs tiles; a GPU uploads).
    fn prepare_weight(&mut self, w: &QWeight);
    /// [`prepare_weight`](Memory::prepare_weight) for the LM head, which decode reads whole
    /// for one token per pass (the CPU packs it in its compact tile format).
    fn prepare_head(&mut self, w: &QWeight) {
        self.prepare_weight(w)
    }
    /// Sizes the activation buffers for up to `max_batch` tokens of these widths.
    fn reserve(&mut self, widths: BufWidths, max_batch: usize);
    /// The most tokens one pass may carry (0 before [`reserve`](Memory::reserve)).
    fn max_batch(&self) -> usize;
    /// Whether an adapter that every pass applies had better be folded into a copy of the
    /// weights than run as low-rank products: on a GPU each product is two launches per
    /// projection; on the CPU they cost about what the copy's larger weights would.
    fn prefers_merged_adapters(&self) -> bool {
        false
    }
    /// The KV rows of one layer: `capacity` slots of `row` floats each for keys and values.
    fn new_layer_cache(&self, capacity: usize, row: usize, ty: KvType) -> LayerCache;
    /// Waits until the work asked for so far is done (a GPU runs it asynchronously): what a
    /// timing of it must include. A no-op on the CPU.
    fn finish(&mut self) {}
    /// The first failure since the last call (a GPU's failed launch, copy or allocation),
    /// after which the backend's results are void; always `Ok` on the CPU.
    fn status(&mut self) -> crate::Result<()> {
        Ok(())
    }
}

/// The operations a forward pass is made of, which every backend implements (some with a
/// default made of the others), and the optional capabilities a backend may offer besides.
/// Row counts `n` are at most [`max_batch`](Memory::max_batch); buffers hold `n` rows of
/// their width, row-major.
pub trait Backend: Memory {
    /// `X[t] = scale · table[tokens[t]]` (token ids checked by the caller); a token equal to
    /// `replace.0` takes the row `replace.1` instead of its table row (an adapter's trained
    /// embedding of the diffusion mask token).
    fn embed(&mut self, table: &QWeight, tokens: &[u32], scale: Option<f32>, replace: Option<(u32, &[f32])>);
    /// RMSNorm of each `w.len()`-float chunk of the first `n` rows of `src` into `dst`
    /// (`src == dst`: in place; per-head norms use chunks of `head_dim`).
    fn rms_norm(&mut self, src: Buf, dst: Buf, w: &[f32], eps: f32, n: usize);
    /// `dst = W·src` for `n` rows.
    fn matmul(&mut self, w: &QWeight, src: Buf, dst: Buf, n: usize);
    /// `dsts[k] = ws[k]·src` for `n` rows, in one pass over `src`.
    fn matmul_fused(&mut self, ws: &[&QWeight], src: Buf, dsts: &[Buf], n: usize);
    /// `Gate = act(gate·Xn) · (up·Xn)` for `n` rows in one pass, where the backend has such a
    /// kernel (a GPU, for a few tokens); `false`: not done, run the products and
    /// [`gated_activation`](Backend::gated_activation) instead.
    fn matmul_gated(&mut self, _gate: &QWeight, _up: &QWeight, _act: Activation, _n: usize) -> bool {
        false
    }
    /// `dst[t] += bias` for `n` rows.
    fn add_bias(&mut self, dst: Buf, bias: &[f32], n: usize);
    /// [`add_bias`](Backend::add_bias) for each `(dst, bias)`, in order (a GPU: one launch).
    fn add_biases(&mut self, items: &[(Buf, &[f32])], n: usize) {
        for &(dst, bias) in items {
            self.add_bias(dst, bias, n);
        }
    }
    /// `dsts[k][t] += scale · B·(A·src[t])` for every term `(k, factors, scale)`, in order.
    fn add_low_rank(&mut self, terms: &LowRankTerms, src: Buf, dsts: &[Buf], n: usize);
    /// RoPE of every head (`head_dim` floats) of the `n` rows of `buf`, row `t` at `pos0 + t`.
    fn rope(&mut self, table: &RopeTable, buf: Buf, head_dim: usize, pos0: usize, n: usize);
    /// Stores the `n` rows of `K` and `V` at positions `pos0..` of `cache`.
    fn store_kv(&mut self, cache: &mut LayerCache, pos0: usize, n: usize);
    /// `Attn` for the `n` queries in `Q` at positions `pos0..` over `cache` (positions
    /// `0..pos0 + n` stored), each seeing what `mask` (within `window`) lets it.
    #[allow(clippy::too_many_arguments)]
    fn attention(&mut self, cache: &LayerCache, shape: AttnShape, mask: AttentionMask, window: Option<usize>, pos0: usize, n: usize);
    /// `dst += src` for `n` rows.
    fn add(&mut self, dst: Buf, src: Buf, n: usize);
    /// `Gate = act(Gate) · Up` for `n` rows.
    fn gated_activation(&mut self, act: Activation, n: usize);
    /// The LM head for rows `rows` of `X` (at most `max_batch`, any order): final RMSNorm
    /// (`norm`, `eps`), `output` product and optional soft-capping `cap · tanh(v / cap)`;
    /// returns the logits, `rows.len() × vocab`, in the order of `rows`.
    fn lm_head(&mut self, output: &QWeight, norm: &[f32], eps: f32, softcap: Option<f32>, rows: &[usize]) -> &mut [f32];
    /// [`lm_head`](Backend::lm_head) whose logits may stay where they were computed until
    /// [`logits`](Backend::logits) or a [device pick](DevicePicks) asks (a GPU copies them
    /// back only when the sampler needs them all).
    fn lm_head_deferred(&mut self, output: &QWeight, norm: &[f32], eps: f32, softcap: Option<f32>, rows: &[usize]) {
        self.lm_head(output, norm, eps, softcap, rows);
    }
    /// The final RMSNorm of the first `n` rows of `X`, read back as `n × d_model`.
    fn final_hidden(&mut self, norm: &[f32], eps: f32, n: usize) -> &[f32];
    /// The logits of the last [`lm_head`](Backend::lm_head) call, for the sampler to modify.
    fn logits(&mut self) -> &mut [f32];

    /// The residual step after a block: `X += post ? RMSNorm(Proj, post) : Proj`, then, when
    /// `next` is given, `Xn = RMSNorm(X, next)` (the next block's input norm). A GPU runs it as
    /// one kernel.
    fn residual_norm(&mut self, post: Option<&[f32]>, next: Option<&[f32]>, eps: f32, n: usize) {
        residual_steps(self, post, next, eps, n);
    }
    /// Between the Q/K/V products and attention: the per-head norms of `Q` and `K` (when
    /// given), RoPE of both at positions `pos0..`, and the store of `K` and `V` in `cache`. A
    /// GPU runs it as one kernel.
    #[allow(clippy::too_many_arguments)]
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
        qk_rope_store_steps(self, QkNorms { q: q_norm, k: k_norm, eps }, rope, head_dim, cache, pos0, n);
    }

    /// Whether [`segment_attention`](Backend::segment_attention) takes rows other than from
    /// row 0, so one pass can carry several sequences (their products batched, attention per
    /// sequence over its own cache). `false`: one sequence per pass.
    fn runs_segments(&self) -> bool {
        false
    }
    /// Announces every pass before its [`embed`](Backend::embed): its sequences' `(pos0,
    /// tokens)` in row order, the model's layer count (each layer then calls
    /// [`segment_attention`](Backend::segment_attention) once per sequence, in this order) and
    /// the mask. A GPU takes the rows' caches from a table for passes of several sequences and
    /// for causal one-token steps, so one captured decode step serves any sequences.
    fn begin_segments(&mut self, _segs: &[(usize, usize)], _layers: usize, _mask: AttentionMask) {}
    /// [`qk_rope_store`](Backend::qk_rope_store) then [`attention`](Backend::attention) for
    /// the `n` rows `row0..row0 + n` of `Q`/`K`/`V`/`Attn`: one sequence (at positions
    /// `pos0..` of its `cache`) of a pass that may carry others. A backend that does not
    /// [`run segments`](Backend::runs_segments) is only called with `row0 == 0`.
    #[allow(clippy::too_many_arguments)]
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
        assert_eq!(row0, 0, "segment_attention: this backend runs one sequence per pass");
        self.qk_rope_store(norms.q, norms.k, norms.eps, rope, shape.head_dim, cache, pos0, n);
        self.attention(cache, shape, span.mask, span.window, pos0, n);
    }

    /// The backend's [greedy head screening](HeadScreening), where it has one.
    fn screening(&mut self) -> Option<&mut dyn HeadScreening> {
        None
    }
    /// The backend's [picks from the logits where they were computed](DevicePicks), where it
    /// has them.
    fn device_picks(&mut self) -> Option<&mut dyn DevicePicks> {
        None
    }
    /// The backend's [queue of greedy picks](PickQueue), where it has one.
    fn pick_queue(&mut self) -> Option<&mut dyn PickQueue> {
        None
    }
}

/// Optional: the greedy token of a row without computing every logit.
pub trait HeadScreening {
    /// The greedy token (the largest non-NaN logit, the lowest id on ties) of row `row` of the
    /// last pass's hidden states, found without computing every logit where it can (the CPU's
    /// exact screening of a Q8_0 head, `cpu::matmul::head_argmax`); `None`: run
    /// [`Backend::lm_head_deferred`] instead. [`Backend::logits`] is left unspecified.
    fn lm_head_argmax(&mut self, output: &QWeight, norm: &[f32], eps: f32, softcap: Option<f32>, row: usize) -> Option<u32>;
}

/// [`DevicePicks::top_logits_norm`]'s answer: each row's best [`TOP_LOGITS`] logits (rows one
/// after another) and each row's log-sum-exp.
pub type TopNorms = (Vec<(u32, f32)>, Vec<f64>);

/// Optional: picks made from the last LM head's logits where they were computed, so that only
/// ids (or a few candidates) cross back, not vocabulary rows. Each `None`: take the logits
/// ([`Backend::logits`]) instead.
pub trait DevicePicks {
    /// The greedy token of the first row (the largest non-NaN logit, the lowest id on ties).
    fn argmax(&mut self) -> Option<u32>;
    /// The greedy token of each row, as [`argmax`](DevicePicks::argmax) finds it for one.
    fn argmax_rows(&mut self) -> Option<Vec<u32>>;
    /// The best [`TOP_LOGITS`] logits of each row as `(id, logit)`, sorted (higher first,
    /// lower id on ties; NaN and -inf as -inf, +inf as `f32::MAX`), rows one after another
    /// (what [`Sampler::sample_top`](crate::sampling::Sampler::sample_top) samples from).
    fn top_logits(&mut self) -> Option<Vec<(u32, f32)>>;
    /// [`top_logits`](DevicePicks::top_logits) with token `drop` (if any) taken out of every
    /// row first (as if its logit were -inf), and each row's log-sum-exp over the rest of the
    /// row: what a diffusion step's sampling and confidences need, without the rows.
    fn top_logits_norm(&mut self, _drop: Option<u32>) -> Option<TopNorms> {
        None
    }
}

/// Optional: greedy picks queued without waiting for them, so that the pass for the next
/// token can be sent before the host knows it (run-ahead decoding).
pub trait PickQueue {
    /// Queues the greedy pick of the last LM head (as [`DevicePicks::argmax`] finds it);
    /// `false` where it cannot now (then pick otherwise). At most two are queued;
    /// [`next_pick`](PickQueue::next_pick) returns them in order.
    fn queue_pick(&mut self) -> bool;
    /// The oldest queued pick, once it is known; `None` when none is queued.
    fn next_pick(&mut self) -> Option<u32>;
    /// Forgets the queued picks (waiting for the device to finish what it was sent).
    fn drop_picks(&mut self);
    /// While on, a one-token pass takes its token from the last queued pick (the token given
    /// to [`Backend::embed`] is a placeholder): the pass can be sent before the host knows
    /// that token.
    fn embed_last_pick(&mut self, on: bool);
}

/// [`Backend::residual_norm`] as its separate operations (the default; a GPU's reference mode).
pub(crate) fn residual_steps<B: Backend + ?Sized>(b: &mut B, post: Option<&[f32]>, next: Option<&[f32]>, eps: f32, n: usize) {
    if let Some(w) = post {
        b.rms_norm(Buf::Proj, Buf::Proj, w, eps, n);
    }
    b.add(Buf::X, Buf::Proj, n);
    if let Some(w) = next {
        b.rms_norm(Buf::X, Buf::Xn, w, eps, n);
    }
}

/// [`Backend::qk_rope_store`] as its separate operations (the default; a GPU's reference mode).
pub(crate) fn qk_rope_store_steps<B: Backend + ?Sized>(
    b: &mut B,
    norms: QkNorms,
    rope: &RopeTable,
    head_dim: usize,
    cache: &mut LayerCache,
    pos0: usize,
    n: usize,
) {
    if let Some(w) = norms.q {
        b.rms_norm(Buf::Q, Buf::Q, w, norms.eps, n);
    }
    if let Some(w) = norms.k {
        b.rms_norm(Buf::K, Buf::K, w, norms.eps, n);
    }
    b.rope(rope, Buf::Q, head_dim, pos0, n);
    b.rope(rope, Buf::K, head_dim, pos0, n);
    b.store_kv(cache, pos0, n);
}
