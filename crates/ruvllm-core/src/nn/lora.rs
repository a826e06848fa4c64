//! LoRA adapters (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", 2021) applied
//! at run time: a projection `y = W·x` becomes `y = W·x + Σᵢ sᵢ · Bᵢ(Aᵢ·x)`. The base weights stay
//! quantized and untouched; each adapter keeps its low-rank factors in f32.
//!
//! Two file formats, checked against the model before use:
//! - llama.cpp's LoRA GGUF (`general.type = adapter`, `adapter.type = lora`,
//!   `adapter.lora.alpha`, tensors `<base tensor>.lora_a` with dims `[in, r]` and
//!   `<base tensor>.lora_b` with dims `[r, out]`), as `convert_lora_to_gguf.py` writes it;
//! - PEFT (`adapter_model.safetensors` beside `adapter_config.json` with `r`, `lora_alpha`,
//!   `target_modules`; tensors `…layers.N.self_attn.q_proj.lora_A.weight` `[r, in]` and
//!   `…lora_B.weight` `[out, r]`).
//!
//! The effective scale of an adapter is `user_scale · alpha / rank`, as in llama.cpp (`alpha`
//! of 0 or absent: `user_scale`); PEFT's `use_rslora` gives `alpha / sqrt(rank)`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use half::f16;

use crate::backend::cpu::GgmlType;
use crate::backend::{LowRank, LowRankTerms};
use crate::gguf::{GgufFile, TensorInfo};
use crate::models::TransformerConfig;
use crate::{Error, Result};

/// The projections of a decoder block that adapters can target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proj {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Proj {
    pub const ALL: [Proj; 7] = [Proj::Q, Proj::K, Proj::V, Proj::O, Proj::Gate, Proj::Up, Proj::Down];

    /// The GGUF tensor of block `i` is `blk.{i}.{gguf_name}.weight`.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Proj::Q => "attn_q",
            Proj::K => "attn_k",
            Proj::V => "attn_v",
            Proj::O => "attn_output",
            Proj::Gate => "ffn_gate",
            Proj::Up => "ffn_up",
            Proj::Down => "ffn_down",
        }
    }

    /// The Hugging Face module name (`self_attn.q_proj`, `mlp.gate_proj`, ...).
    pub fn hf_name(self) -> &'static str {
        match self {
            Proj::Q => "q_proj",
            Proj::K => "k_proj",
            Proj::V => "v_proj",
            Proj::O => "o_proj",
            Proj::Gate => "gate_proj",
            Proj::Up => "up_proj",
            Proj::Down => "down_proj",
        }
    }

    fn hf_parent(self) -> &'static str {
        match self {
            Proj::Q | Proj::K | Proj::V | Proj::O => "self_attn",
            Proj::Gate | Proj::Up | Proj::Down => "mlp",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// `(out, in)` of this projection in a model of `cfg`.
    pub fn shape(self, cfg: &TransformerConfig) -> (usize, usize) {
        let (d, q, kv, ff) = (cfg.d_model, cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim, cfg.ff_dim);
        match self {
            Proj::Q => (q, d),
            Proj::K | Proj::V => (kv, d),
            Proj::O => (d, q),
            Proj::Gate | Proj::Up => (ff, d),
            Proj::Down => (d, ff),
        }
    }
}

/// One projection's low-rank factors, held in half precision: decode reads every factor once
/// per token, so half the bytes is most of their cost saved (products and sums stay f32).
#[derive(Debug, Clone)]
pub struct LoraPair {
    pub rank: usize,
    pub d_in: usize,
    pub d_out: usize,
    /// `A`, `rank × d_in`, row-major.
    pub a: Vec<f16>,
    /// `Bᵀ`, `rank × d_out`, row-major (column `j` of `B` is row `j` here, so `B·h` is `rank`
    /// contiguous `axpy`s).
    pub bt: Vec<f16>,
    /// Unique per set of factor values (clones share it): a GPU backend keeps one uploaded copy
    /// per id.
    id: u64,
}

impl LoraPair {
    /// From `A` (`rank × d_in`) and `B` (`d_out × rank`), both row-major, rounded to half.
    pub fn new(a: Vec<f32>, b: &[f32], rank: usize, d_in: usize, d_out: usize) -> Self {
        let mut bt = vec![f16::ZERO; rank * d_out];
        for o in 0..d_out {
            for j in 0..rank {
                bt[j * d_out + o] = f16::from_f32(b[o * rank + j]);
            }
        }
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        LoraPair { rank, d_in, d_out, a: a.iter().map(|&v| f16::from_f32(v)).collect(), bt, id }
    }

    /// The factors as the backends take them.
    pub fn view(&self) -> LowRank<'_> {
        LowRank { rank: self.rank, d_in: self.d_in, d_out: self.d_out, a: &self.a, bt: &self.bt, id: self.id }
    }
}

/// Where an adapter came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdapterFormat {
    Gguf,
    Peft,
    /// Learned at run time (SONA).
    Learned,
}

/// A loaded, validated LoRA adapter for one model.
#[derive(Debug)]
pub struct LoraAdapter {
    /// Unique within the process: what the KV cache compares to know which adapters produced
    /// its keys and values.
    pub id: u64,
    pub path: PathBuf,
    pub format: AdapterFormat,
    /// The largest rank of its projections.
    pub rank: usize,
    /// `alpha / rank` (or `alpha / sqrt(rank)` with rsLoRA; 1 without alpha), applied on top of
    /// the user's scale.
    pub base_scale: f32,
    /// The projections it changes (in any layer), in `Proj::ALL` order.
    pub targets: Vec<Proj>,
    /// Per layer, per `Proj`: the factors, if the adapter has them.
    layers: Vec<[Option<LoraPair>; 7]>,
    /// What a masked-diffusion conversion adapter says about itself (`ruvllm.diffusion.*`).
    pub diffusion: Option<DiffusionInfo>,
}

/// The `ruvllm.diffusion.*` metadata of an adapter that turns the base model into a
/// masked-diffusion LM (one adapter per range of mask ratios: TALoRA).
#[derive(Debug, Clone, PartialEq)]
pub struct DiffusionInfo {
    /// The token that marks a masked position.
    pub mask_token: u32,
    /// The mask ratios `[t_min, t_max)` this adapter was trained for (`[0, 1]`: all).
    pub t_min: f32,
    pub t_max: f32,
    /// The AR shift: the logits at position `i` predict the token at `i + 1`.
    pub shift: bool,
    /// The mask token's trained embedding row (as the GGUF's `token_embd` stores it, before
    /// any input scale), if the adapter has one.
    pub mask_embd: Option<Vec<f32>>,
}

/// Name of the diffusion adapter's mask-embedding tensor.
const MASK_EMBD: &str = "ruvllm.diffusion.mask_embd";

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl LoraAdapter {
    /// Builds an adapter from factors (`pairs[(layer, proj)]`), validating their shapes against
    /// `cfg`. `path` only names it in messages.
    pub fn from_pairs(path: &Path, format: AdapterFormat, cfg: &TransformerConfig, base_scale: f32, pairs: Vec<(usize, Proj, LoraPair)>) -> Result<Self> {
        let bad = |m: String| Error::adapter(path, m);
        if pairs.is_empty() {
            return Err(bad("it changes no projection of the model".into()));
        }
        let mut layers: Vec<[Option<LoraPair>; 7]> = (0..cfg.n_layer).map(|_| Default::default()).collect();
        let mut targets = Vec::new();
        let mut rank = 0;
        for (l, p, pair) in pairs {
            let (out, inp) = p.shape(cfg);
            if l >= cfg.n_layer {
                return Err(bad(format!("layer {l} does not exist (the model has {})", cfg.n_layer)));
            }
            if pair.rank == 0 {
                return Err(bad(format!("layer {l} {}: rank 0", p.gguf_name())));
            }
            if (pair.d_out, pair.d_in) != (out, inp) || pair.a.len() != pair.rank * inp || pair.bt.len() != pair.rank * out {
                return Err(bad(format!("layer {l} {}: factors for a {}×{} projection, the model's is {out}×{inp}", p.gguf_name(), pair.d_out, pair.d_in)));
            }
            if !pair.a.iter().chain(&pair.bt).all(|v| v.is_finite()) {
                return Err(bad(format!("layer {l} {}: values that are not finite or lie beyond half precision (±65504)", p.gguf_name())));
            }
            if layers[l][p.index()].is_some() {
                return Err(bad(format!("layer {l} {}: given twice", p.gguf_name())));
            }
            rank = rank.max(pair.rank);
            if !targets.contains(&p) {
                targets.push(p);
            }
            layers[l][p.index()] = Some(pair);
        }
        targets.sort();
        if !base_scale.is_finite() {
            return Err(bad(format!("scale {base_scale} is not finite")));
        }
        Ok(LoraAdapter { id: NEXT_ID.fetch_add(1, Ordering::Relaxed), path: path.to_path_buf(), format, rank, base_scale, targets, layers, diffusion: None })
    }

    /// Loads an adapter file for a model of `cfg` (architecture `arch`): a LoRA GGUF, a PEFT
    /// `adapter_model.safetensors`, or a folder holding one. Every problem is
    /// `ERR_ADAPTER_INVALID` (or `ERR_MODEL_NOT_FOUND` / `ERR_IO` for a file that cannot be read).
    pub fn load(path: &Path, cfg: &TransformerConfig, arch: &str) -> Result<Self> {
        let md = std::fs::metadata(path).map_err(|_| Error::ModelNotFound(format!("no adapter file at {}", path.display())))?;
        if md.is_dir() {
            let peft = path.join("adapter_model.safetensors");
            if peft.is_file() {
                return Self::load_peft(&peft, cfg);
            }
            return Err(Error::adapter(path, "a folder without adapter_model.safetensors"));
        }
        let mut magic = [0u8; 4];
        use std::io::Read;
        std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).map_err(|e| Error::adapter(path, format!("cannot read it: {e}")))?;
        if &magic == b"GGUF" {
            Self::load_gguf(path, cfg, arch)
        } else {
            Self::load_peft(path, cfg)
        }
    }

    /// llama.cpp's LoRA GGUF.
    pub fn load_gguf(path: &Path, cfg: &TransformerConfig, arch: &str) -> Result<Self> {
        let f = GgufFile::open(path).map_err(|e| match e {
            Error::GgufInvalid { msg, .. } => Error::adapter(path, format!("not a valid GGUF: {msg}")),
            other => other,
        })?;
        let bad = |m: String| Error::adapter(path, m);
        match f.get("general.type").and_then(|v| v.as_str()) {
            Some("adapter") => {}
            other => return Err(bad(format!("general.type is {other:?}, expected \"adapter\" (is this a model rather than an adapter?)"))),
        }
        match f.get("adapter.type").and_then(|v| v.as_str()) {
            Some("lora") => {}
            other => return Err(bad(format!("adapter.type is {other:?}; only \"lora\" adapters are supported"))),
        }
        match f.architecture() {
            Some(a) if a == arch => {}
            other => return Err(bad(format!("it was made for architecture {other:?}, the model is '{arch}'"))),
        }
        let alpha = match f.get("adapter.lora.alpha") {
            None => 0.0,
            Some(v) => v.as_f64().ok_or_else(|| bad("adapter.lora.alpha is not a number".into()))? as f32,
        };
        let mut a_of = std::collections::BTreeMap::new();
        let mut b_of = std::collections::BTreeMap::new();
        let mut mask_embd = None;
        for t in &f.tensors {
            if t.name == MASK_EMBD {
                if t.dims != [cfg.d_model as u64] {
                    return Err(bad(format!("'{MASK_EMBD}' has shape {:?}, expected [{}]", t.dims, cfg.d_model)));
                }
                let row = tensor_f32(&f, t, path)?;
                if !row.iter().all(|v| v.is_finite()) {
                    return Err(bad(format!("'{MASK_EMBD}' has values that are not finite")));
                }
                mask_embd = Some(row);
                continue;
            }
            let (base, is_a) = if let Some(b) = t.name.strip_suffix(".lora_a") {
                (b, true)
            } else if let Some(b) = t.name.strip_suffix(".lora_b") {
                (b, false)
            } else {
                return Err(bad(format!("tensor '{}' is neither a .lora_a nor a .lora_b", t.name)));
            };
            let (l, p) = parse_gguf_target(base, cfg.n_layer).ok_or_else(|| {
                bad(format!("tensor '{}' matches no projection of the model (blk.N.attn_q/k/v/output.weight, blk.N.ffn_gate/up/down.weight)", t.name))
            })?;
            if is_a {
                a_of.insert((l, p), t)
            } else {
                b_of.insert((l, p), t)
            };
        }
        // The largest rank is the adapter's: `alpha / max rank` is its scale, and a tensor of a
        // smaller rank has its B scaled up to keep llama.cpp's `alpha / (its own rank)`.
        let max_rank = a_of.values().map(|a| a.dims.get(1).copied().unwrap_or(0) as usize).max().unwrap_or(1).max(1);
        let mut pairs = Vec::new();
        for (&(l, p), a) in &a_of {
            let b = b_of.remove(&(l, p)).ok_or_else(|| bad(format!("'{}' has no matching .lora_b", a.name)))?;
            let (out, inp) = p.shape(cfg);
            // A: dims [in, r]; B: dims [r, out].
            let (a_ok, b_ok) = (a.dims.len() == 2 && a.dims[0] == inp as u64, b.dims.len() == 2 && b.dims[1] == out as u64);
            let rank = a.dims.get(1).copied().unwrap_or(0) as usize;
            if !a_ok || !b_ok || b.dims[0] as usize != rank {
                return Err(bad(format!(
                    "'{}' {:?} / '{}' {:?}: expected [{inp}, r] and [r, {out}] for a {out}×{inp} projection",
                    a.name, a.dims, b.name, b.dims
                )));
            }
            if rank == 0 {
                return Err(bad(format!("'{}': rank 0", a.name)));
            }
            let av = tensor_f32(&f, a, path)?;
            let mut bv = tensor_f32(&f, b, path)?;
            if alpha != 0.0 && rank != max_rank {
                let k = max_rank as f32 / rank as f32;
                bv.iter_mut().for_each(|v| *v *= k);
            }
            pairs.push((l, p, LoraPair::new(av, &bv, rank, inp, out)));
        }
        if let Some(b) = b_of.values().next() {
            return Err(bad(format!("'{}' has no matching .lora_a", b.name)));
        }
        let base_scale = if alpha == 0.0 { 1.0 } else { alpha / max_rank as f32 };
        let mut adapter = Self::from_pairs(path, AdapterFormat::Gguf, cfg, base_scale, pairs)?;
        adapter.diffusion = diffusion_info(&f, cfg, mask_embd).map_err(bad)?;
        Ok(adapter)
    }

    /// PEFT: `adapter_model.safetensors` with `adapter_config.json` beside it.
    pub fn load_peft(path: &Path, cfg: &TransformerConfig) -> Result<Self> {
        let bad = |m: String| Error::adapter(path, m);
        let config_path = path.with_file_name("adapter_config.json");
        let config: serde_json::Value = std::fs::read_to_string(&config_path)
            .map_err(|e| bad(format!("cannot read {} beside it: {e}", config_path.display())))
            .and_then(|s| serde_json::from_str(&s).map_err(|e| bad(format!("{} is not valid JSON: {e}", config_path.display()))))?;
        let r = config.get("r").and_then(|v| v.as_u64()).ok_or_else(|| bad("adapter_config.json has no integer 'r'".into()))? as usize;
        if r == 0 {
            return Err(bad("adapter_config.json: r is 0".into()));
        }
        let alpha = match config.get("lora_alpha") {
            None | Some(serde_json::Value::Null) => r as f64,
            Some(v) => v.as_f64().ok_or_else(|| bad("adapter_config.json: lora_alpha is not a number".into()))?,
        } as f32;
        let rslora = config.get("use_rslora").and_then(|v| v.as_bool()).unwrap_or(false);
        let base_scale = if rslora { alpha / (r as f32).sqrt() } else { alpha / r as f32 };
        let bytes = std::fs::read(path).map_err(|e| Error::Io { path: path.to_path_buf(), source: e })?;
        let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| bad(format!("not a valid safetensors file: {e}")))?;
        let mut a_of = std::collections::BTreeMap::new();
        let mut b_of = std::collections::BTreeMap::new();
        for (name, view) in st.tensors() {
            let (base, is_a) = if let Some(b) = name.strip_suffix(".lora_A.weight") {
                (b, true)
            } else if let Some(b) = name.strip_suffix(".lora_B.weight") {
                (b, false)
            } else {
                return Err(bad(format!("tensor '{name}' is neither a lora_A nor a lora_B weight")));
            };
            let (l, p) = parse_hf_target(base, cfg.n_layer).ok_or_else(|| {
                bad(format!("tensor '{name}' matches no projection of the model (…layers.N.self_attn.q/k/v/o_proj, …layers.N.mlp.gate/up/down_proj)"))
            })?;
            let shape: Vec<usize> = view.shape().to_vec();
            let data = st_f32(&view).map_err(|m| bad(format!("tensor '{name}': {m}")))?;
            if is_a {
                a_of.insert((l, p), (name, shape, data))
            } else {
                b_of.insert((l, p), (name, shape, data))
            };
        }
        let mut pairs = Vec::new();
        for ((l, p), (a_name, a_shape, a)) in a_of {
            let (b_name, b_shape, b) = b_of.remove(&(l, p)).ok_or_else(|| bad(format!("'{a_name}' has no matching lora_B")))?;
            let (out, inp) = p.shape(cfg);
            // lora_A: [r, in]; lora_B: [out, r].
            if a_shape != [r, inp] || b_shape != [out, r] {
                return Err(bad(format!(
                    "'{a_name}' {a_shape:?} / '{b_name}' {b_shape:?}: expected [{r}, {inp}] and [{out}, {r}] (r = {r} from adapter_config.json)"
                )));
            }
            pairs.push((l, p, LoraPair::new(a, &b, r, inp, out)));
        }
        if let Some((name, _, _)) = b_of.values().next() {
            return Err(bad(format!("'{name}' has no matching lora_A")));
        }
        Self::from_pairs(path, AdapterFormat::Peft, cfg, base_scale, pairs)
    }

    /// This adapter without its factors (a new id, the same diffusion metadata and mask
    /// embedding): what still applies to a model its factors were merged into.
    pub fn without_factors(&self) -> LoraAdapter {
        LoraAdapter {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            path: self.path.clone(),
            format: self.format,
            rank: 0,
            base_scale: self.base_scale,
            targets: Vec::new(),
            layers: self.layers.iter().map(|_| Default::default()).collect(),
            diffusion: self.diffusion.clone(),
        }
    }

    /// The factors of block `layer`'s projection `p`, if the adapter changes it.
    pub fn pair(&self, layer: usize, p: Proj) -> Option<&LoraPair> {
        self.layers.get(layer).and_then(|l| l[p.index()].as_ref())
    }
}

/// `blk.{i}.{proj}.weight` → (i, proj).
fn parse_gguf_target(base: &str, n_layer: usize) -> Option<(usize, Proj)> {
    let rest = base.strip_prefix("blk.")?;
    let (i, name) = rest.split_once('.')?;
    let i: usize = i.parse().ok()?;
    let name = name.strip_suffix(".weight")?;
    let p = Proj::ALL.into_iter().find(|p| p.gguf_name() == name)?;
    (i < n_layer).then_some((i, p))
}

/// `…layers.{i}.self_attn.q_proj` (any prefix, e.g. `base_model.model.model.`) → (i, proj).
fn parse_hf_target(base: &str, n_layer: usize) -> Option<(usize, Proj)> {
    let at = base.find("layers.")?;
    let rest = &base[at + "layers.".len()..];
    let (i, name) = rest.split_once('.')?;
    let i: usize = i.parse().ok()?;
    let p = Proj::ALL.into_iter().find(|p| name == format!("{}.{}", p.hf_parent(), p.hf_name()))?;
    (i < n_layer).then_some((i, p))
}

/// The `ruvllm.diffusion.*` keys of an adapter GGUF: `None` when it has none (a plain LoRA).
fn diffusion_info(f: &GgufFile, cfg: &TransformerConfig, mask_embd: Option<Vec<f32>>) -> std::result::Result<Option<DiffusionInfo>, String> {
    let Some(mask) = f.get("ruvllm.diffusion.mask_token_id") else {
        return match mask_embd {
            Some(_) => Err(format!("it has '{MASK_EMBD}' but no ruvllm.diffusion.mask_token_id")),
            None => Ok(None),
        };
    };
    let mask_token = mask
        .as_u64()
        .filter(|&m| (m as usize) < cfg.vocab_size)
        .ok_or_else(|| format!("ruvllm.diffusion.mask_token_id must be a token id below the vocabulary size {}", cfg.vocab_size))? as u32;
    let num = |key: &str, default: f64| -> std::result::Result<f64, String> {
        match f.get(key) {
            None => Ok(default),
            Some(v) => v.as_f64().filter(|x| x.is_finite()).ok_or_else(|| format!("{key} must be a finite number")),
        }
    };
    let (t_min, t_max) = (num("ruvllm.diffusion.t_min", 0.0)? as f32, num("ruvllm.diffusion.t_max", 1.0)? as f32);
    if !(0.0..=1.0).contains(&t_min) || !(0.0..=1.0).contains(&t_max) || t_min >= t_max {
        return Err(format!("ruvllm.diffusion.t_min {t_min} / t_max {t_max}: expected 0 <= t_min < t_max <= 1"));
    }
    let shift = match f.get("ruvllm.diffusion.shift") {
        None => true,
        Some(v) => v.as_bool().ok_or("ruvllm.diffusion.shift must be a boolean")?,
    };
    Ok(Some(DiffusionInfo { mask_token, t_min, t_max, shift, mask_embd }))
}

/// A GGUF adapter tensor as f32 (F32, F16 or BF16).
fn tensor_f32(f: &GgufFile, t: &TensorInfo, path: &Path) -> Result<Vec<f32>> {
    if !matches!(t.dtype, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
        return Err(Error::adapter(path, format!("tensor '{}' has type {}; adapters must be F32, F16 or BF16", t.name, t.dtype.name())));
    }
    let mut out = vec![0.0; t.n_elements() as usize];
    crate::backend::cpu::quant::dequantize(t.dtype, f.tensor_bytes(t), &mut out);
    Ok(out)
}

/// A safetensors tensor as f32 (F32, F16 or BF16, little-endian).
fn st_f32(view: &safetensors::tensor::TensorView<'_>) -> std::result::Result<Vec<f32>, String> {
    use safetensors::Dtype;
    let d = view.data();
    Ok(match view.dtype() {
        Dtype::F32 => d.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Dtype::F16 => d.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Dtype::BF16 => d.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        other => return Err(format!("type {other:?}; adapters must be F32, F16 or BF16")),
    })
}

/// The adapters applied to a request, each with the user's scale; compared by identity.
#[derive(Debug, Clone, Default)]
pub struct AdapterSet {
    entries: Vec<(Arc<LoraAdapter>, f32)>,
    /// Asks the engine to pick the adapters for the request's prompt ([`AdapterSet::auto`]).
    auto: bool,
}

impl AdapterSet {
    pub fn new(entries: Vec<(Arc<LoraAdapter>, f32)>) -> Self {
        AdapterSet { entries, auto: false }
    }

    /// `adapters: 'auto'`: the engine's resolver (a learner's adapter bank) picks the adapters
    /// nearest to the request's prompt.
    pub fn auto() -> Self {
        AdapterSet { entries: Vec::new(), auto: true }
    }

    pub fn is_auto(&self) -> bool {
        self.auto
    }

    pub fn entries(&self) -> &[(Arc<LoraAdapter>, f32)] {
        &self.entries
    }

    /// The diffusion mask token's replacement embedding row, from the first adapter of the set
    /// that has one.
    pub fn mask_embedding(&self) -> Option<(u32, &[f32])> {
        self.entries.iter().find_map(|(a, _)| {
            let d = a.diffusion.as_ref()?;
            Some((d.mask_token, d.mask_embd.as_deref()?))
        })
    }

    /// Whether two sets give the same forward pass (same adapters, same scales, same order).
    pub fn same_as(&self, other: &AdapterSet) -> bool {
        let key = |s: &AdapterSet| s.entries.iter().filter(|(_, k)| *k != 0.0).map(|(a, k)| (a.id, k.to_bits())).collect::<Vec<_>>();
        key(self) == key(other)
    }

    /// The low-rank deltas of block `layer`'s projections `ps` (output `k` for `ps[k]`): every
    /// adapter of the set that changes one, in the set's order, with its scale.
    pub fn terms<const N: usize>(&self, layer: usize, ps: [Proj; N]) -> LowRankTerms<'_> {
        let mut terms = LowRankTerms::default();
        for (a, s) in &self.entries {
            for (k, &p) in ps.iter().enumerate() {
                if let (Some(pair), true) = (a.pair(layer, p), *s != 0.0) {
                    terms.push((k, pair.view(), s * a.base_scale));
                }
            }
        }
        terms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_names() {
        assert_eq!(parse_gguf_target("blk.3.attn_q.weight", 18), Some((3, Proj::Q)));
        assert_eq!(parse_gguf_target("blk.17.ffn_down.weight", 18), Some((17, Proj::Down)));
        assert_eq!(parse_gguf_target("blk.18.ffn_down.weight", 18), None);
        assert_eq!(parse_gguf_target("blk.1.attn_norm.weight", 18), None);
        assert_eq!(parse_gguf_target("output.weight", 18), None);
        assert_eq!(parse_hf_target("base_model.model.model.layers.2.self_attn.o_proj", 18), Some((2, Proj::O)));
        assert_eq!(parse_hf_target("model.layers.0.mlp.up_proj", 18), Some((0, Proj::Up)));
        assert_eq!(parse_hf_target("model.layers.0.mlp.q_proj", 18), None);
    }
}
