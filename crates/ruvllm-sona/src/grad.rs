//! Gradients of the language-model loss with respect to LoRA factors, through the frozen,
//! quantized model, on the CPU.
//!
//! The forward pass mirrors `ruvllm_core::models::Transformer` (embedding scale, pre-norms,
//! QK-norm, RoPE, causal attention with sliding windows and grouped KV heads, sandwich norms,
//! gated activations, tied or separate LM head, soft-capping) and keeps what the backward pass
//! needs. The base weights get no gradient: the backward of `y = W·x` is only `dx = Wᵀ·dy`, a
//! product with the transposed weight. Those transposes are built once, dequantized and stored
//! as Q8_0 (F32 weights stay F32), so the backward runs on the same quantized matmul kernels as
//! the forward. LoRA factors stay f32 here; a learned adapter is rounded to f16 only when the
//! runtime uses it.

use std::sync::Arc;

use ruvllm_core::backend::cpu::ops::dot;
use ruvllm_core::backend::cpu::quant;
use ruvllm_core::backend::cpu::{matmul, GgmlType, QWeight};
use ruvllm_core::backend::{Activation, WeightData};
use ruvllm_core::models::Transformer;
use ruvllm_core::nn::{Linear, Proj};
use ruvllm_core::runtime::ThreadPool;

/// One projection's trainable factors inside [`LoraParams::w`].
#[derive(Debug, Clone, PartialEq)]
pub struct Slot {
    pub layer: usize,
    pub proj: Proj,
    pub d_in: usize,
    pub d_out: usize,
    /// Offset of `A` (`rank × d_in`, row-major).
    pub a: usize,
    /// Offset of `B` (`d_out × rank`, row-major).
    pub b: usize,
}

/// A trainable LoRA: `ΔW = scale · B·A` on each slot; all factors in one flat vector so the
/// optimizer, the Fisher estimate and the files treat them alike.
#[derive(Debug, Clone)]
pub struct LoraParams {
    pub rank: usize,
    /// `alpha / rank`.
    pub scale: f32,
    pub slots: Vec<Slot>,
    pub w: Vec<f32>,
    /// `index[layer][proj]` = position in `slots`.
    index: Vec<[Option<usize>; 7]>,
}

/// Deterministic uniform numbers in `[-1, 1)` (xorshift64*): initialisation and shuffles.
pub struct Rng(pub u64);

impl Rng {
    pub fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let v = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((v >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

fn proj_index(p: Proj) -> usize {
    Proj::ALL.iter().position(|&q| q == p).unwrap_or(0)
}

impl LoraParams {
    /// Factors for `targets` of a model with `n_layer` blocks, `A` drawn uniformly with the
    /// Kaiming bound `1/sqrt(d_in)` (as PEFT does) from `seed`, `B = 0`: the adapter starts as
    /// the identity and its first gradient moves `B`.
    pub fn new(model: &Transformer, targets: &[(usize, Proj)], rank: usize, alpha: f32, seed: u64) -> Self {
        let mut slots = Vec::new();
        let mut off = 0;
        for &(layer, proj) in targets {
            let (d_out, d_in) = proj.shape(&model.cfg);
            slots.push(Slot { layer, proj, d_in, d_out, a: off, b: off + rank * d_in });
            off += rank * (d_in + d_out);
        }
        let mut w = vec![0.0f32; off];
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        for s in &slots {
            let bound = 1.0 / (s.d_in as f32).sqrt();
            for v in &mut w[s.a..s.a + rank * s.d_in] {
                *v = rng.uniform() * bound;
            }
        }
        Self::from_parts(model.cfg.n_layer, rank, alpha / rank as f32, slots, w)
    }

    pub(crate) fn from_parts(n_layer: usize, rank: usize, scale: f32, slots: Vec<Slot>, w: Vec<f32>) -> Self {
        let mut index = vec![[None; 7]; n_layer];
        for (i, s) in slots.iter().enumerate() {
            if s.layer < n_layer {
                index[s.layer][proj_index(s.proj)] = Some(i);
            }
        }
        LoraParams { rank, scale, slots, w, index }
    }

    pub fn slot(&self, layer: usize, proj: Proj) -> Option<&Slot> {
        self.index.get(layer)?[proj_index(proj)].map(|i| &self.slots[i])
    }

    pub fn len(&self) -> usize {
        self.w.len()
    }

    pub fn is_empty(&self) -> bool {
        self.w.is_empty()
    }

    /// The lowest layer with a slot (where the backward pass can stop).
    fn lowest_layer(&self) -> usize {
        self.slots.iter().map(|s| s.layer).min().unwrap_or(usize::MAX)
    }

    /// `A` and `B` of a slot.
    pub fn factors<'a>(&self, s: &Slot, w: &'a [f32]) -> (&'a [f32], &'a [f32]) {
        (&w[s.a..s.a + self.rank * s.d_in], &w[s.b..s.b + s.d_out * self.rank])
    }
}

/// What one training sequence asks: `tokens`, and for some positions `i` a weight on
/// `-ln p(tokens[i + 1] | tokens[..=i])`; for a masked-diffusion model (see
/// [`Frozen::set_diffusion`]) `tokens` is the input with masked positions, every position sees
/// all the others, and the targets are `labels[i + 1]`, the tokens before masking.
#[derive(Debug, Clone, Default)]
pub struct Example {
    pub tokens: Vec<u32>,
    /// `(i, weight)`, `i + 1 < tokens.len()`.
    pub targets: Vec<(usize, f32)>,
    /// The tokens the targets predict when they differ from `tokens` (masked inputs); `None`:
    /// `tokens`.
    pub labels: Option<Vec<u32>>,
}

impl Example {
    /// The token target `(i, _)` predicts.
    pub fn label(&self, i: usize) -> u32 {
        self.labels.as_ref().unwrap_or(&self.tokens)[i + 1]
    }
}

/// What makes the frozen model a masked-diffusion LM: the mask token, whose input embedding is
/// `mask_embd` (as `token_embd` stores rows, before the embedding scale), and attention that
/// sees every position (within a sliding window, back from the query).
#[derive(Debug, Clone)]
pub struct DiffusionInput {
    pub mask_token: u32,
    pub mask_embd: Option<Vec<f32>>,
}

/// The frozen model and the transposed weights its backward pass multiplies by.
pub struct Frozen {
    pub model: Arc<Transformer>,
    pool: ThreadPool,
    /// Per layer, per projection in [`Proj::ALL`] order: `Wᵀ` (`d_in × d_out`).
    wt: Vec<Vec<QWeight>>,
    /// The LM head transposed (`d_model × vocab`).
    head_t: Option<QWeight>,
    /// Called between blocks and head chunks: where background training steps aside.
    pause: Option<Pause>,
    /// Frozen adapters applied on top of the base weights in every pass (the federation's
    /// global adapter; a diffusion model's conversion adapter): they shape the activations and
    /// `dx`, and get no gradient.
    extra: Vec<Arc<LoraParams>>,
    /// Set for a masked-diffusion model: bidirectional attention and the mask embedding.
    diffusion: Option<DiffusionInput>,
}

/// See [`Frozen::set_pause`].
pub type Pause = Arc<dyn Fn() + Send + Sync>;

/// Activations of one block kept for its backward pass.
pub(crate) struct LayerAct {
    x_in: Vec<f32>,
    xn: Vec<f32>,
    q_pre: Vec<f32>,
    k_pre: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// Softmax probabilities, per head, `t × t` (zero where masked).
    p: Vec<f32>,
    attn: Vec<f32>,
    o: Vec<f32>,
    pub(crate) x_mid: Vec<f32>,
    xn2: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    pub(crate) act: Vec<f32>,
    pub(crate) down: Vec<f32>,
    /// `A·x` of each adapted projection, by [`Proj::ALL`] index.
    u: [Vec<f32>; 7],
}

/// Transposes a `rows × cols` weight into a `cols × rows` one: Q8_0 (F32 stays F32).
fn transpose(w: &QWeight) -> QWeight {
    let (rows, cols) = (w.rows, w.cols);
    let exact = w.ty == GgmlType::F32;
    // Dequantize 32 source rows at a time; each becomes one 32-wide block of every output row.
    let block = 32;
    let ty = if exact || !rows.is_multiple_of(block) { GgmlType::F32 } else { GgmlType::Q8_0 };
    let mut out_f32 = if ty == GgmlType::F32 { vec![0.0f32; rows * cols] } else { Vec::new() };
    let row_bytes = ty.type_size() * (rows / ty.block_size());
    let mut out_q = if ty == GgmlType::Q8_0 { vec![0u8; cols * row_bytes] } else { Vec::new() };
    let mut buf = vec![0.0f32; block * cols];
    let mut col = vec![0.0f32; block];
    let mut r0 = 0;
    while r0 < rows {
        let n = block.min(rows - r0);
        for i in 0..n {
            w.dequantize_row(r0 + i, &mut buf[i * cols..(i + 1) * cols]);
        }
        for c in 0..cols {
            if ty == GgmlType::F32 {
                for i in 0..n {
                    out_f32[c * rows + r0 + i] = buf[i * cols + c];
                }
            } else {
                for i in 0..block {
                    col[i] = buf[i * cols + c];
                }
                let q = quant::quantize(GgmlType::Q8_0, &col);
                let at = c * row_bytes + (r0 / block) * q.len();
                out_q[at..at + q.len()].copy_from_slice(&q);
            }
        }
        r0 += n;
    }
    let data = if ty == GgmlType::F32 { out_f32.iter().flat_map(|v| v.to_le_bytes()).collect() } else { out_q };
    QWeight::new(ty, cols, rows, WeightData::Owned(Arc::new(data))).expect("a transposed weight has a valid shape")
}

fn rms(x: &[f32], eps: f32) -> f32 {
    1.0 / (dot(x, x) / x.len() as f32 + eps).sqrt()
}

/// `out = x · r · w` per chunk of `w.len()`.
pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (xc, oc) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let r = rms(xc, eps);
        for i in 0..d {
            oc[i] = xc[i] * r * w[i];
        }
    }
}

/// Backward of [`rms_norm`] per chunk: `dx += r·(w∘dy) − x·r³/d·Σ(w∘dy∘x)`.
pub(crate) fn rms_norm_back(x: &[f32], w: &[f32], eps: f32, dy: &[f32], dx: &mut [f32]) {
    let d = w.len();
    for ((xc, dyc), dxc) in x.chunks_exact(d).zip(dy.chunks_exact(d)).zip(dx.chunks_exact_mut(d)) {
        let r = rms(xc, eps);
        let dot: f32 = (0..d).map(|i| w[i] * dyc[i] * xc[i]).sum();
        let k = r * r * r / d as f32 * dot;
        for i in 0..d {
            dxc[i] += r * w[i] * dyc[i] - xc[i] * k;
        }
    }
}

/// `x += rms_norm(y) · w`, or `x += y` where the model has no such norm.
fn add_normed(x: &mut [f32], y: &[f32], w: Option<&[f32]>, eps: f32) {
    match w {
        Some(w) => {
            let mut tmp = vec![0.0f32; y.len()];
            rms_norm(y, w, eps, &mut tmp);
            add_into(x, &tmp);
        }
        None => add_into(x, y),
    }
}

/// The gradient at `x` of `y = rms_norm(x) · w` (per chunk of `w.len()`) given `dy`, or `dy`
/// itself where the model has no such norm.
fn norm_back(x: &[f32], w: Option<&[f32]>, eps: f32, dy: &[f32]) -> Vec<f32> {
    match w {
        Some(w) => {
            let mut dx = vec![0.0f32; x.len()];
            rms_norm_back(x, w, eps, dy, &mut dx);
            dx
        }
        None => dy.to_vec(),
    }
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;

fn act_fwd(a: Activation, g: f32) -> f32 {
    match a {
        Activation::GeluTanh => 0.5 * g * (1.0 + (SQRT_2_OVER_PI * (g + 0.044715 * g * g * g)).tanh()),
        Activation::Silu => g / (1.0 + (-g).exp()),
    }
}

fn act_grad(a: Activation, g: f32) -> f32 {
    match a {
        Activation::GeluTanh => {
            let t = (SQRT_2_OVER_PI * (g + 0.044715 * g * g * g)).tanh();
            0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * g * g)
        }
        Activation::Silu => {
            let s = 1.0 / (1.0 + (-g).exp());
            s * (1.0 + g * (1.0 - s))
        }
    }
}

fn add_into(dst: &mut [f32], src: &[f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d += s;
    }
}

/// Whether `j` is visible from query `i` under the causal (or, `bidir`, the bidirectional) mask
/// and an optional sliding window looking back from `i` (as `AttentionMask::visible`).
fn visible(i: usize, j: usize, window: Option<usize>, bidir: bool) -> bool {
    if j > i {
        return bidir;
    }
    window.is_none_or(|w| i - j < w)
}

/// `y += scale·B·(A·x)` for `params`' slot of (`l`, `p`), factors read from `w`; returns `A·x`
/// (`t × rank`; empty without a slot).
fn lora_forward(params: &LoraParams, w: &[f32], l: usize, p: Proj, x: &[f32], t: usize, y: &mut [f32]) -> Vec<f32> {
    let Some(s) = params.slot(l, p) else { return Vec::new() };
    let (r, d_in, d_out) = (params.rank, s.d_in, s.d_out);
    let (a, b) = params.factors(s, w);
    let mut u = vec![0.0f32; t * r];
    for ti in 0..t {
        let xr = &x[ti * d_in..(ti + 1) * d_in];
        for j in 0..r {
            u[ti * r + j] = dot(&a[j * d_in..(j + 1) * d_in], xr);
        }
        let yr = &mut y[ti * d_out..(ti + 1) * d_out];
        for o in 0..d_out {
            let br = &b[o * r..(o + 1) * r];
            yr[o] += params.scale * (0..r).map(|j| br[j] * u[ti * r + j]).sum::<f32>();
        }
    }
    u
}

impl Frozen {
    /// The model, with `threads` kernel threads for training. Transposed weights are built on
    /// first use of [`Frozen::loss_and_grad`] with layers below the last (or with the LM head).
    pub fn new(model: Arc<Transformer>, threads: usize) -> Self {
        Frozen { model, pool: ThreadPool::new(threads.max(1)), wt: Vec::new(), head_t: None, pause: None, extra: Vec::new(), diffusion: None }
    }

    /// Sets the frozen adapter every pass applies on top of the base weights (`None`: none).
    pub fn set_extra(&mut self, extra: Option<Arc<LoraParams>>) {
        self.extra = extra.into_iter().collect();
    }

    /// Sets the frozen adapters every pass applies on top of the base weights, in order.
    pub fn set_extras(&mut self, extra: Vec<Arc<LoraParams>>) {
        self.extra = extra;
    }

    /// Makes the model a masked-diffusion LM (`None`: the causal LM): see [`DiffusionInput`].
    pub fn set_diffusion(&mut self, d: Option<DiffusionInput>) {
        self.diffusion = d;
    }

    /// `f` is called between blocks (forward and backward) and LM-head chunks: it may wait, for
    /// example while the engine serves a request, so training takes the cores only when they
    /// are free.
    pub fn set_pause(&mut self, f: Option<Pause>) {
        self.pause = f;
    }

    fn checkpoint(&self) {
        if let Some(f) = &self.pause {
            f()
        }
    }

    fn lin(&self, l: usize, p: Proj) -> &Linear {
        let layer = &self.model.layers[l];
        match p {
            Proj::Q => &layer.wq,
            Proj::K => &layer.wk,
            Proj::V => &layer.wv,
            Proj::O => &layer.wo,
            Proj::Gate => &layer.ffn_gate,
            Proj::Up => &layer.ffn_up,
            Proj::Down => &layer.ffn_down,
        }
    }

    /// Builds the transposed weights now (a few seconds for a 270M model; ~300 MB as Q8_0).
    pub fn prepare_backward(&mut self) {
        if self.head_t.is_none() {
            let n = self.model.layers.len();
            self.wt = (0..n).map(|l| Proj::ALL.iter().map(|&p| transpose(&self.lin(l, p).weight)).collect()).collect();
            self.head_t = Some(transpose(&self.model.output));
        }
    }

    /// `y = W·x (+ b) + scale·B·(A·x)`; returns `A·x` (empty without a slot).
    fn linear(&self, l: usize, p: Proj, x: &[f32], t: usize, y: &mut [f32], lora: Option<(&LoraParams, &[f32])>) -> Vec<f32> {
        let lin = self.lin(l, p);
        matmul(&self.pool, &lin.weight, x, t, y);
        let d_out = lin.weight.rows;
        if let Some(b) = &lin.bias {
            for row in y.chunks_exact_mut(d_out) {
                add_into(row, b);
            }
        }
        for e in &self.extra {
            lora_forward(e, &e.w, l, p, x, t, y);
        }
        let Some((params, w)) = lora else { return Vec::new() };
        lora_forward(params, w, l, p, x, t, y)
    }

    /// Backward of [`Self::linear`]: `dx += Wᵀ·dy + scale·Aᵀ·(Bᵀ·dy)` (when `dx` is given) and
    /// the factor gradients into `grad`.
    #[allow(clippy::too_many_arguments)]
    fn linear_back(&self, l: usize, p: Proj, x: &[f32], u: &[f32], dy: &[f32], t: usize, dx: Option<&mut [f32]>, lora: (&LoraParams, &[f32], &mut [f32])) {
        let lin = self.lin(l, p);
        let (d_in, d_out) = (lin.weight.cols, lin.weight.rows);
        let (params, w, grad) = lora;
        let slot = params.slot(l, p);
        let mut g = Vec::new();
        if let Some(s) = slot {
            let r = params.rank;
            let (a, b) = params.factors(s, w);
            let sc = params.scale;
            g = vec![0.0f32; t * r];
            for ti in 0..t {
                let dyr = &dy[ti * d_out..(ti + 1) * d_out];
                let ur = &u[ti * r..(ti + 1) * r];
                for o in 0..d_out {
                    let dv = dyr[o];
                    if dv == 0.0 {
                        continue;
                    }
                    let br = &b[o * r..(o + 1) * r];
                    let gb = &mut grad[s.b + o * r..s.b + (o + 1) * r];
                    for j in 0..r {
                        g[ti * r + j] += dv * br[j];
                        gb[j] += sc * dv * ur[j];
                    }
                }
                let xr = &x[ti * d_in..(ti + 1) * d_in];
                for j in 0..r {
                    let gj = sc * g[ti * r + j];
                    let ga = &mut grad[s.a + j * d_in..s.a + (j + 1) * d_in];
                    for (gv, &xv) in ga.iter_mut().zip(xr) {
                        *gv += gj * xv;
                    }
                }
            }
            let _ = a;
        }
        let Some(dx) = dx else { return };
        let mut tmp = vec![0.0f32; t * d_in];
        matmul(&self.pool, &self.wt[l][proj_index(p)], dy, t, &mut tmp);
        add_into(&mut dx[..t * d_in], &tmp);
        for e in &self.extra {
            if let Some(s) = e.slot(l, p) {
                // dx += scale·Aᵀ·(Bᵀ·dy) of the frozen adapter.
                let r = e.rank;
                let (a, b) = e.factors(s, &e.w);
                let mut g = vec![0.0f32; r];
                for ti in 0..t {
                    g.iter_mut().for_each(|v| *v = 0.0);
                    for (o, &dv) in dy[ti * d_out..(ti + 1) * d_out].iter().enumerate() {
                        if dv != 0.0 {
                            g.iter_mut().zip(&b[o * r..(o + 1) * r]).for_each(|(gv, &bv)| *gv += dv * bv);
                        }
                    }
                    let dxr = &mut dx[ti * d_in..(ti + 1) * d_in];
                    for (j, &gj) in g.iter().enumerate() {
                        let gj = e.scale * gj;
                        if gj != 0.0 {
                            dxr.iter_mut().zip(&a[j * d_in..(j + 1) * d_in]).for_each(|(dv, &av)| *dv += gj * av);
                        }
                    }
                }
            }
        }
        if let Some(s) = slot {
            let r = params.rank;
            let (a, _) = params.factors(s, w);
            for ti in 0..t {
                let dxr = &mut dx[ti * d_in..(ti + 1) * d_in];
                for j in 0..r {
                    let gj = params.scale * g[ti * r + j];
                    for (dv, &av) in dxr.iter_mut().zip(&a[j * d_in..(j + 1) * d_in]) {
                        *dv += gj * av;
                    }
                }
            }
        }
    }

    /// The forward pass of `tokens` at positions `0..t` with the causal mask (bidirectional for
    /// a diffusion model, its mask token embedded as the mask embedding); returns the final
    /// residual stream (`t × d`) and, when `keep`, every block's activations from `from_layer` on.
    pub(crate) fn forward(&self, tokens: &[u32], lora: Option<(&LoraParams, &[f32])>, keep_from: usize) -> (Vec<f32>, Vec<Option<LayerAct>>) {
        let m = &self.model;
        let c = &m.cfg;
        let (t, d) = (tokens.len(), c.d_model);
        let (hd, nh, nkv) = (c.head_dim, c.n_head, c.n_kv_head);
        let (qd, kvd) = (nh * hd, nkv * hd);
        let mut x = vec![0.0f32; t * d];
        let mask = self.diffusion.as_ref().and_then(|df| Some((df.mask_token, df.mask_embd.as_deref().filter(|r| r.len() == d)?)));
        let bidir = self.diffusion.is_some();
        for (i, &tok) in tokens.iter().enumerate() {
            match mask {
                Some((id, row)) if id == tok => x[i * d..(i + 1) * d].copy_from_slice(row),
                _ => m.embed.dequantize_row(tok as usize, &mut x[i * d..(i + 1) * d]),
            }
            if let Some(s) = c.embed_scale {
                x[i * d..(i + 1) * d].iter_mut().for_each(|v| *v *= s);
            }
        }
        let mut acts = Vec::with_capacity(c.n_layer);
        for (l, layer) in m.layers.iter().enumerate() {
            self.checkpoint();
            let x_in = x.clone();
            let mut xn = vec![0.0f32; t * d];
            rms_norm(&x_in, &layer.attn_norm, c.norm_eps, &mut xn);
            let mut u: [Vec<f32>; 7] = Default::default();
            let (mut q, mut k, mut v) = (vec![0.0f32; t * qd], vec![0.0f32; t * kvd], vec![0.0f32; t * kvd]);
            u[0] = self.linear(l, Proj::Q, &xn, t, &mut q, lora);
            u[1] = self.linear(l, Proj::K, &xn, t, &mut k, lora);
            u[2] = self.linear(l, Proj::V, &xn, t, &mut v, lora);
            let (q_pre, k_pre) = (q.clone(), k.clone());
            if let Some(w) = &layer.q_norm {
                rms_norm(&q_pre, w, c.norm_eps, &mut q);
            }
            if let Some(w) = &layer.k_norm {
                rms_norm(&k_pre, w, c.norm_eps, &mut k);
            }
            let rope = m.rope_for(l);
            for i in 0..t {
                rope.apply(&mut q[i * qd..(i + 1) * qd], hd, i);
                rope.apply(&mut k[i * kvd..(i + 1) * kvd], hd, i);
            }
            let window = if c.swa_layers[l] { c.sliding_window } else { None };
            let mut p = vec![0.0f32; nh * t * t];
            let mut attn = vec![0.0f32; t * qd];
            let group = nh / nkv;
            for h in 0..nh {
                let g = h / group;
                for i in 0..t {
                    let qi = &q[i * qd + h * hd..i * qd + (h + 1) * hd];
                    let row = &mut p[(h * t + i) * t..(h * t + i + 1) * t];
                    let mut max = f32::NEG_INFINITY;
                    for j in 0..t {
                        if visible(i, j, window, bidir) {
                            let kj = &k[j * kvd + g * hd..j * kvd + (g + 1) * hd];
                            let raw = c.attn_scale * dot(qi, kj);
                            row[j] = match c.attn_softcap {
                                Some(cap) => (raw / cap).tanh() * cap,
                                None => raw,
                            };
                            max = max.max(row[j]);
                        }
                    }
                    let mut sum = 0.0;
                    for (j, r) in row.iter_mut().enumerate() {
                        *r = if visible(i, j, window, bidir) { (*r - max).exp() } else { 0.0 };
                        sum += *r;
                    }
                    let out = &mut attn[i * qd + h * hd..i * qd + (h + 1) * hd];
                    for j in 0..t {
                        row[j] /= sum;
                        if row[j] != 0.0 {
                            let vj = &v[j * kvd + g * hd..j * kvd + (g + 1) * hd];
                            for (o, &vv) in out.iter_mut().zip(vj) {
                                *o += row[j] * vv;
                            }
                        }
                    }
                }
            }
            let mut o = vec![0.0f32; t * d];
            u[3] = self.linear(l, Proj::O, &attn, t, &mut o, lora);
            let mut x_mid = x_in.clone();
            add_normed(&mut x_mid, &o, layer.post_attn_norm.as_deref(), c.norm_eps);
            let mut xn2 = vec![0.0f32; t * d];
            rms_norm(&x_mid, &layer.ffn_norm, c.norm_eps, &mut xn2);
            let (mut gate, mut up) = (vec![0.0f32; t * c.ff_dim], vec![0.0f32; t * c.ff_dim]);
            u[4] = self.linear(l, Proj::Gate, &xn2, t, &mut gate, lora);
            u[5] = self.linear(l, Proj::Up, &xn2, t, &mut up, lora);
            let act: Vec<f32> = gate.iter().zip(&up).map(|(&g, &uv)| act_fwd(c.activation, g) * uv).collect();
            let mut down = vec![0.0f32; t * d];
            u[6] = self.linear(l, Proj::Down, &act, t, &mut down, lora);
            x = x_mid.clone();
            add_normed(&mut x, &down, layer.post_ffn_norm.as_deref(), c.norm_eps);
            acts.push((l >= keep_from).then_some(LayerAct { x_in, xn, q_pre, k_pre, q, k, v, p, attn, o, x_mid, xn2, gate, up, act, down, u }));
        }
        (x, acts)
    }

    /// Logits of rows `rows` of the final residual stream `x` (after the output norm; soft-capped
    /// when the model does), `rows.len() × vocab`, and the normed hidden rows.
    pub(crate) fn head(&self, x: &[f32], rows: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let c = &self.model.cfg;
        let d = c.d_model;
        let mut h = vec![0.0f32; rows.len() * d];
        for (k, &r) in rows.iter().enumerate() {
            rms_norm(&x[r * d..(r + 1) * d], &self.model.output_norm, c.norm_eps, &mut h[k * d..(k + 1) * d]);
        }
        let mut logits = vec![0.0f32; rows.len() * c.vocab_size];
        matmul(&self.pool, &self.model.output, &h, rows.len(), &mut logits);
        if let Some(cap) = c.final_logit_softcap {
            logits.iter_mut().for_each(|z| *z = cap * (*z / cap).tanh());
        }
        (logits, h)
    }

    /// Weighted negative log-likelihood of `ex` under base + `params` (forward only): returns
    /// (Σ weight·nll, Σ weight).
    pub fn loss(&self, ex: &Example, params: Option<&LoraParams>) -> (f64, f64) {
        let lora = params.map(|p| (p, p.w.as_slice()));
        let (x, _) = self.forward(&ex.tokens, lora, usize::MAX);
        let mut total = (0.0, 0.0);
        for chunk in ex.targets.chunks(16) {
            let rows: Vec<usize> = chunk.iter().map(|&(i, _)| i).collect();
            let (logits, _) = self.head(&x, &rows);
            let v = self.model.cfg.vocab_size;
            for (k, &(i, wt)) in chunk.iter().enumerate() {
                let row = &logits[k * v..(k + 1) * v];
                total.0 += wt as f64 * nll(row, ex.label(i));
                total.1 += wt as f64;
            }
        }
        total
    }

    /// The weighted loss of `ex` under base + `params` and its gradient with respect to
    /// `params.w`, added into `grad`: returns (Σ weight·nll, Σ weight). The gradient is of the
    /// weighted sum (callers divide by the weight sum).
    pub fn loss_and_grad(&mut self, ex: &Example, params: &LoraParams, grad: &mut [f32]) -> (f64, f64) {
        self.prepare_backward();
        let c = self.model.cfg.clone();
        let (t, d, v) = (ex.tokens.len(), c.d_model, c.vocab_size);
        let lowest = params.lowest_layer();
        let (x, acts) = self.forward(&ex.tokens, Some((params, &params.w)), lowest);
        let mut total = (0.0f64, 0.0f64);
        // LM head: loss and dx of the final residual stream, 16 rows at a time.
        let mut dx = vec![0.0f32; t * d];
        let head_t = self.head_t.as_ref().expect("prepared");
        for chunk in ex.targets.chunks(8) {
            self.checkpoint();
            let rows: Vec<usize> = chunk.iter().map(|&(i, _)| i).collect();
            let (mut logits, h) = self.head(&x, &rows);
            for (k, &(i, wt)) in chunk.iter().enumerate() {
                let row = &mut logits[k * v..(k + 1) * v];
                let target = ex.label(i) as usize;
                total.0 += wt as f64 * nll(row, target as u32);
                total.1 += wt as f64;
                // d nll / d z = softmax − onehot (through the soft-cap's tanh when there is one).
                let capped: Option<Vec<f32>> = c.final_logit_softcap.map(|_| row.to_vec());
                softmax(row);
                row[target] -= 1.0;
                for (j, z) in row.iter_mut().enumerate() {
                    *z *= wt;
                    if let (Some(cap), Some(cz)) = (c.final_logit_softcap, &capped) {
                        let th = cz[j] / cap;
                        *z *= 1.0 - th * th;
                    }
                }
            }
            let mut dh = vec![0.0f32; rows.len() * d];
            matmul(&self.pool, head_t, &logits, rows.len(), &mut dh);
            for (k, &r) in rows.iter().enumerate() {
                rms_norm_back(&x[r * d..(r + 1) * d], &self.model.output_norm, c.norm_eps, &dh[k * d..(k + 1) * d], &mut dx[r * d..(r + 1) * d]);
            }
            let _ = h;
        }
        let (hd, nh, nkv) = (c.head_dim, c.n_head, c.n_kv_head);
        let (qd, kvd, ff) = (nh * hd, nkv * hd, c.ff_dim);
        let w = &params.w;
        for l in (lowest..c.n_layer).rev() {
            self.checkpoint();
            let a = acts[l].as_ref().expect("kept");
            let layer = &self.model.layers[l];
            let need_dx = l > lowest;
            // x_out = x_mid + post_ffn_norm(down)
            let d_down = norm_back(&a.down, layer.post_ffn_norm.as_deref(), c.norm_eps, &dx);
            let mut d_act = vec![0.0f32; t * ff];
            self.checkpoint();
            self.linear_back(l, Proj::Down, &a.act, &a.u[6], &d_down, t, Some(&mut d_act), (params, w, grad));
            let mut d_gate = vec![0.0f32; t * ff];
            let mut d_up = vec![0.0f32; t * ff];
            for i in 0..t * ff {
                d_gate[i] = d_act[i] * a.up[i] * act_grad(c.activation, a.gate[i]);
                d_up[i] = d_act[i] * act_fwd(c.activation, a.gate[i]);
            }
            let mut d_xn2 = vec![0.0f32; t * d];
            self.checkpoint();
            self.linear_back(l, Proj::Gate, &a.xn2, &a.u[4], &d_gate, t, Some(&mut d_xn2), (params, w, grad));
            self.checkpoint();
            self.linear_back(l, Proj::Up, &a.xn2, &a.u[5], &d_up, t, Some(&mut d_xn2), (params, w, grad));
            // dx now is d x_mid (residual) + through ffn_norm.
            rms_norm_back(&a.x_mid, &layer.ffn_norm, c.norm_eps, &d_xn2, &mut dx);
            // x_mid = x_in + post_attn_norm(o)
            let d_o = norm_back(&a.o, layer.post_attn_norm.as_deref(), c.norm_eps, &dx);
            let mut d_attn = vec![0.0f32; t * qd];
            self.checkpoint();
            self.linear_back(l, Proj::O, &a.attn, &a.u[3], &d_o, t, Some(&mut d_attn), (params, w, grad));
            // Attention: out_h = P_h · V_g.
            let (mut dq, mut dk, mut dv) = (vec![0.0f32; t * qd], vec![0.0f32; t * kvd], vec![0.0f32; t * kvd]);
            let group = nh / nkv;
            let mut dp = vec![0.0f32; t];
            for h in 0..nh {
                let g = h / group;
                for i in 0..t {
                    let p = &a.p[(h * t + i) * t..(h * t + i + 1) * t];
                    let dout = &d_attn[i * qd + h * hd..i * qd + (h + 1) * hd];
                    let mut pdp = 0.0f32;
                    for j in 0..t {
                        dp[j] = 0.0;
                        if p[j] != 0.0 {
                            let vj = &a.v[j * kvd + g * hd..j * kvd + (g + 1) * hd];
                            dp[j] = dot(dout, vj);
                            pdp += dp[j] * p[j];
                            let dvj = &mut dv[j * kvd + g * hd..j * kvd + (g + 1) * hd];
                            for (dd, &o) in dvj.iter_mut().zip(dout) {
                                *dd += p[j] * o;
                            }
                        }
                    }
                    let qi: Vec<f32> = a.q[i * qd + h * hd..i * qd + (h + 1) * hd].to_vec();
                    for j in 0..t {
                        if p[j] == 0.0 {
                            continue;
                        }
                        let kj = &a.k[j * kvd + g * hd..j * kvd + (g + 1) * hd];
                        let mut ds = p[j] * (dp[j] - pdp);
                        if let Some(cap) = c.attn_softcap {
                            // d/dx cap·tanh(x / cap) = 1 − tanh²(x / cap)
                            let th = (c.attn_scale * dot(&qi, kj) / cap).tanh();
                            ds *= 1.0 - th * th;
                        }
                        let ds = ds * c.attn_scale;
                        let dqi = &mut dq[i * qd + h * hd..i * qd + (h + 1) * hd];
                        for (dd, &kv) in dqi.iter_mut().zip(kj) {
                            *dd += ds * kv;
                        }
                        let dkj = &mut dk[j * kvd + g * hd..j * kvd + (g + 1) * hd];
                        for (dd, &qv) in dkj.iter_mut().zip(&qi) {
                            *dd += ds * qv;
                        }
                    }
                }
            }
            let rope = self.model.rope_for(l);
            for i in 0..t {
                rope.apply_inverse(&mut dq[i * qd..(i + 1) * qd], hd, i);
                rope.apply_inverse(&mut dk[i * kvd..(i + 1) * kvd], hd, i);
            }
            let dq = norm_back(&a.q_pre, layer.q_norm.as_deref(), c.norm_eps, &dq);
            let dk = norm_back(&a.k_pre, layer.k_norm.as_deref(), c.norm_eps, &dk);
            let mut d_xn = vec![0.0f32; t * d];
            let dxn = if need_dx { Some(&mut d_xn[..]) } else { None };
            let mut dxn = dxn;
            self.checkpoint();
            self.linear_back(l, Proj::Q, &a.xn, &a.u[0], &dq, t, dxn.as_deref_mut(), (params, w, grad));
            self.checkpoint();
            self.linear_back(l, Proj::K, &a.xn, &a.u[1], &dk, t, dxn.as_deref_mut(), (params, w, grad));
            self.checkpoint();
            self.linear_back(l, Proj::V, &a.xn, &a.u[2], &dv, t, dxn, (params, w, grad));
            if need_dx {
                rms_norm_back(&a.x_in, &layer.attn_norm, c.norm_eps, &d_xn, &mut dx);
            }
        }
        total
    }
}

/// In-place softmax.
pub(crate) fn softmax(z: &mut [f32]) {
    let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in z.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    z.iter_mut().for_each(|v| *v *= inv);
}

/// `-ln softmax(z)[target]` (the scorer's log-softmax).
pub(crate) fn nll(z: &[f32], target: u32) -> f64 {
    -ruvllm_core::sampling::log_softmax_at(z, target as usize).0
}
