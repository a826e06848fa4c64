//! The generation engine: one worker thread owns the model and its KV cache; requests arrive on
//! a channel, tokens stream back through each request's sink. Cancellation is a flag checked
//! every token; closing the engine sets every submitted request's flag, so whatever is queued or
//! running ends with `Error::Closed` within a token, whoever the caller is (a binding, a server).
//! A panic inside the worker is caught and reported as `Error::Internal`. How a completion's
//! tokens are produced is a [`decode::DecodeStrategy`] (today: autoregressive).

use std::collections::{BTreeMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::backend::cpu::CpuBackend;
use crate::backend::host_picks::HostPicks;
use crate::backend::Backend;
use crate::chat::{ChatMessage, ChatTemplate};
use crate::gguf::GgufFile;
use crate::kv::{KvCache, KvType, Q8_BLOCK};
use crate::models::{self, Outputs, Transformer};
use crate::nn::{AdapterSet, AttentionMask, LoraAdapter};
use crate::sampling::{log_softmax_at, SamplingParams};
use crate::structured::{Constraint, TokenEnv, Tool, ToolCall, ToolChoice, ToolFormat};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

mod batch;
pub mod decode;

use decode::{DecodeContext, DecodeRequest, DecodeStrategy, Diffusion, DiffusionModel};
pub use decode::{DiffusionParams, DiffusionStats, DiffusionStep, ElboParams, Remasking, Schedule};

/// Options for loading a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// KV cache length in tokens (default: min(model's context length, 4096)).
    pub context_size: Option<usize>,
    /// Worker threads for the kernels (default: available parallelism).
    pub threads: Option<usize>,
    /// Default seed for sampling when a request gives none.
    pub seed: Option<u64>,
    /// LoRA adapter files (LoRA GGUF or PEFT safetensors) and their scales, applied to every
    /// request that does not name its own set.
    pub adapters: Vec<(PathBuf, f32)>,
    /// Masked-diffusion conversion adapters (one, or one per range of mask ratios): the model
    /// then decodes by diffusion ([`decode::Diffusion`]).
    pub diffusion: Vec<PathBuf>,
    /// Where the forward pass runs (default [`GpuMode::Auto`]).
    pub gpu: GpuMode,
    /// Most requests decoded together (default [`DEFAULT_PARALLEL`]); more wait in a queue.
    pub parallel: Option<usize>,
    /// Memory budget in MiB for the KV caches of finished requests, kept for the prompt
    /// prefixes they hold (default [`DEFAULT_PREFIX_CACHE_MB`]; 0 keeps none).
    pub prefix_cache_mb: Option<usize>,
    /// How the KV cache stores keys and values (default [`KvType::F16`]).
    pub kv_type: Option<KvType>,
    /// Whether a diffusion model's one conversion adapter is folded into a copy of the weights
    /// ([`DiffusionModel::merge`]); default: `RUVLLM_DIFFUSION_MERGE`, else as the backend
    /// prefers (on a GPU, not in its reference mode).
    pub merge_diffusion: Option<bool>,
}

/// Where the forward pass runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GpuMode {
    /// The CUDA backend when this build has it, a CUDA device is usable and it runs every
    /// weight type of the model; else the CPU.
    #[default]
    Auto,
    /// The CUDA backend, or an `ERR_GPU_UNAVAILABLE` error saying why not.
    Cuda,
    /// The CPU.
    Off,
}

/// What the JS side shows as `llm.info`.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelInfo {
    pub path: String,
    pub name: String,
    pub architecture: String,
    pub parameter_count: u64,
    /// e.g. "Q4_K_M" from general.file_type, plus the tensor type histogram in `tensor_types`.
    pub quantization: String,
    pub tensor_types: std::collections::BTreeMap<String, u64>,
    /// Context size this instance was loaded with.
    pub context_length: usize,
    /// The model's trained maximum.
    pub train_context_length: usize,
    pub vocab_size: usize,
    /// Width of the hidden state (`d_model`): the length of the vectors `embed` returns.
    pub embedding_length: usize,
    pub has_chat_template: bool,
    /// Whether it decodes by masked diffusion.
    pub diffusion: bool,
    pub threads: usize,
    /// Where the forward pass runs, e.g. `cpu (avx512-vnni, 2 threads)` or
    /// `cuda (NVIDIA H100 80GB HBM3 (sm_90, 81079 MiB))`.
    pub backend: String,
    /// How the KV cache stores keys and values: `f16`, `f32` or `q8_0`.
    pub kv_cache_type: String,
    /// Bytes of one sequence's KV cache at `context_length` (memory is touched as positions
    /// are written; up to `parallel` sequences, and the prefix cache's, are held at once).
    pub kv_cache_bytes: u64,
}

/// A prompt: plain text, or chat messages rendered with the model's (or a given) template.
#[derive(Debug, Clone)]
pub enum Prompt {
    Text(String),
    Chat(Vec<ChatMessage>),
    /// Token ids, used as given (no BOS added).
    Tokens(Vec<u32>),
}

#[derive(Debug, Clone, Default)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// Overrides the model's chat template for `Prompt::Chat`.
    pub chat_template: Option<String>,
    /// Diffusion settings (only for a diffusion model, which uses the defaults without them).
    pub diffusion: Option<DiffusionParams>,
    /// Constrains the output (JSON, a schema, a grammar); `None`: free text.
    pub constraint: Option<Constraint>,
    /// Tools offered to the model (rendered through the chat template of a `Prompt::Chat`).
    pub tools: Vec<Tool>,
    pub tool_choice: ToolChoice,
    /// Report each generated token's log-probability and this many most likely alternatives at
    /// its position (at most [`MAX_TOP_LOGPROBS`]); `None`: none.
    pub logprobs: Option<usize>,
}

/// Most alternatives [`GenerateParams::logprobs`] may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A token and the natural-log probability the model gave it: of the raw model distribution
/// at its position (the softmax of the logits before penalties, temperature, truncation and
/// any output constraint), as OpenAI and llama.cpp report it.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenProb {
    pub id: u32,
    /// The token's text (a byte token's bytes read as UTF-8, lossily; `bytes` has them exact).
    pub text: String,
    pub bytes: Vec<u8>,
    pub logprob: f64,
}

/// A generated token's log-probability, with the most likely tokens at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: TokenProb,
    /// Most likely first; as many as were asked for (fewer only when the vocabulary is smaller).
    pub top: Vec<TokenProb>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    Abort,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Completion {
    pub id: String,
    pub text: String,
    pub tokens: Vec<u32>,
    /// The prompt's token ids as evaluated (BOS and chat template included): with `tokens`,
    /// what a learner needs to train on this completion.
    pub prompt_ids: Vec<u32>,
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt tokens whose keys and values came from the prefix cache (not evaluated again).
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub ttft_ms: f64,
    pub prefill_tokens_per_second: f64,
    pub decode_tokens_per_second: f64,
    /// Steps, blocks and tokens per step of a diffusion model's answer.
    pub diffusion: Option<DiffusionStats>,
    /// For `adapters: 'auto'`: the adapters the resolver picked.
    pub adapters_used: Option<Vec<AdapterUse>>,
    /// The tool calls the model made (with `GenerateParams::tools`); `text` then holds what it
    /// wrote besides them.
    pub tool_calls: Vec<ToolCall>,
    /// With `GenerateParams::logprobs`: one entry per generated token, in order.
    pub logprobs: Option<Vec<TokenLogprob>>,
}

/// An adapter an `'auto'` request ran, as the resolver named it, with the similarity of its
/// training prompts to the request's prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterUse {
    pub id: String,
    pub similarity: f32,
}

/// Picks the adapters for an `'auto'` request from its prompt's embedding (unit length, as
/// `embed` computes it) and says which it picked.
pub type AutoResolver = Arc<dyn Fn(&[f32]) -> Result<(AdapterSet, Vec<AdapterUse>)> + Send + Sync>;

/// Called with every completion the engine finishes (on the engine thread: it must be quick).
pub type CompletionObserver = Arc<dyn Fn(&Completion) + Send + Sync>;

/// What the worker shares with the engine for learning: the learned adapters, the observer,
/// the resolver.
#[derive(Default)]
struct Hooks {
    learned: AdapterSet,
    observer: Option<CompletionObserver>,
    resolver: Option<AutoResolver>,
}

/// What a request's sink receives, in order: zero or more `Token`, then exactly one `Done` or
/// `Error` (`Error::Closed` when the engine was closed before the request finished).
#[derive(Debug)]
pub enum Event {
    Token {
        id: u32,
        text: String,
        /// With `GenerateParams::logprobs`: this token's (`None` on the event that only
        /// releases held-back text at the end).
        logprob: Option<TokenLogprob>,
    },
    /// A diffusion model's denoising step (after the tokens it made final).
    Step(DiffusionStep),
    Done(Completion),
    Error(Error),
}

pub type Sink = Box<dyn FnMut(Event) + Send>;

pub struct GenerateRequest {
    pub prompt: Prompt,
    pub params: GenerateParams,
    /// The LoRA adapters for this request; `None`: the ones given at load.
    pub adapters: Option<AdapterSet>,
    /// Set to true to stop the request; checked before prefill and every token. Closing the
    /// engine sets it too.
    pub cancel: Arc<AtomicBool>,
    pub sink: Sink,
}

/// Most tokens evaluated in one forward call (prefill is split into chunks of this size).
pub const MAX_BATCH: usize = 512;
/// Default KV cache length when the caller gives none.
pub const DEFAULT_CONTEXT: usize = 4096;
/// Default for [`LoadOptions::parallel`].
pub const DEFAULT_PARALLEL: usize = 8;
/// Most requests decoded together that [`LoadOptions::parallel`] may ask for.
pub const MAX_PARALLEL: usize = 256;
/// Default for [`LoadOptions::prefix_cache_mb`].
pub const DEFAULT_PREFIX_CACHE_MB: usize = 256;

/// What the request path shares with the worker: the file (metadata, mmap), tokenizer, template.
struct Shared {
    file: GgufFile,
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    /// The BOS token's text ("" when the model has none), to see if a rendered chat has it.
    bos_text: String,
    /// The vocabulary compiled for constrained decoding, built by the first request that needs it.
    token_env: std::sync::OnceLock<Arc<TokenEnv>>,
}

/// Scores a text: the log-probability the model gives each token after the ones before it.
pub struct ScoreRequest {
    pub prompt: Prompt,
    /// The LoRA adapters for this request; `None`: the ones given at load.
    pub adapters: Option<AdapterSet>,
    /// A chat template for `Prompt::Chat` (else the model's).
    pub chat_template: Option<String>,
    /// Set to true to stop; checked between chunks of tokens.
    pub cancel: Arc<AtomicBool>,
    /// A diffusion model's ELBO instead of the autoregressive log-probabilities.
    pub elbo: Option<ElboParams>,
    /// Called once with the result.
    pub reply: Box<dyn FnOnce(Result<Score>) + Send>,
}

/// The result of a [`ScoreRequest`].
#[derive(Debug, Clone)]
pub struct Score {
    /// The evaluated token ids (BOS included for text prompts).
    pub tokens: Vec<u32>,
    /// `logprobs[i]` = ln p(tokens[i + 1] | tokens[..=i]); one fewer than `tokens`.
    pub logprobs: Vec<f64>,
    /// `top_tokens[i]`: the most likely token after `tokens[..=i]` (what greedy decoding would
    /// pick there); one fewer than `tokens`, like `logprobs`.
    pub top_tokens: Vec<u32>,
    /// `top_logprobs[i]` = ln p(top_tokens[i] | tokens[..=i]), so `top_logprobs[i] - logprobs[i]`
    /// is how far the given token falls short of the model's first choice (0 when it is it).
    pub top_logprobs: Vec<f64>,
    /// `exp(-mean(logprobs))` (NaN with fewer than two tokens).
    pub perplexity: f64,
    /// For `adapters: 'auto'`: the adapters the resolver picked.
    pub adapters_used: Option<Vec<AdapterUse>>,
    /// Tokens evaluated per second.
    pub tokens_per_second: f64,
    /// For a diffusion model's ELBO (`ScoreRequest::elbo`): the ratios sampled; `perplexity` is
    /// then `exp` of the bound per token and the per-token lists are empty.
    pub elbo_samples: Option<usize>,
}

/// Embeds texts: the mean over a text's tokens (BOS included) of the model's final hidden
/// states after the output norm, L2-normalised. One vector of `ModelInfo::embedding_length`
/// per text.
pub struct EmbedRequest {
    pub texts: Vec<String>,
    /// The LoRA adapters for this request; `None`: the ones given at load.
    pub adapters: Option<AdapterSet>,
    /// Set to true to stop; checked between texts and chunks.
    pub cancel: Arc<AtomicBool>,
    /// Called once with the result.
    pub reply: EmbedReply,
}

/// Receives an [`EmbedRequest`]'s vectors (one per text) or its error.
pub type EmbedReply = Box<dyn FnOnce(Result<Vec<Vec<f32>>>) + Send>;

enum Command {
    // Boxed: a request (prompt, params, tools) is far larger than the other commands.
    Generate(Box<GenerateRequest>),
    Score(ScoreRequest),
    Embed(EmbedRequest),
    Close,
}

/// A loaded model with its worker thread. Cheap to share behind an `Arc`.
pub struct Engine {
    info: ModelInfo,
    /// The model's shape, to check adapters against.
    cfg: models::TransformerConfig,
    /// The adapters given at load.
    default_adapters: AdapterSet,
    /// What a learner plugs in: its adapters ([`Engine::set_learned`], applied after the
    /// load-time ones to every request that names no set of its own), an observer of
    /// completions, a resolver for `'auto'`.
    hooks: Arc<Mutex<Hooks>>,
    /// The weights (the worker runs them; a learner reads them on its own threads).
    model: Arc<Transformer>,
    shared: Mutex<Option<Arc<Shared>>>,
    tx: Mutex<Option<Sender<Command>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
    /// Set by [`Engine::stop`]; the worker then answers every request it has not finished with
    /// `Closed`.
    closing: Arc<AtomicBool>,
    /// Set while the worker serves a request (see [`Engine::busy`]).
    busy: Arc<AtomicBool>,
    /// The cancel flags of submitted requests that may still be queued or running, for `stop`
    /// to set.
    in_flight: Mutex<Vec<Weak<AtomicBool>>>,
    /// The diffusion model the worker decodes with (shared: a learner sets its learned ranges).
    diffusion: Option<Arc<DiffusionModel>>,
}

/// The model and everything the worker thread owns.
struct Worker {
    model: Arc<Transformer>,
    shared: Arc<Shared>,
    /// Where the forward pass runs; owns the activation buffers.
    backend: Box<dyn Backend + Send>,
    cache: KvCache,
    context: usize,
    /// How the KV caches store keys and values.
    kv_type: KvType,
    /// The adapters of requests that name none.
    default_adapters: AdapterSet,
    /// The learner's hooks (see [`Engine`]).
    hooks: Arc<Mutex<Hooks>>,
    /// The adapters the last `'auto'` resolution picked (for the completion or score).
    auto_used: Option<Vec<AdapterUse>>,
    /// The current request asked for `'auto'` and its prompt has not been resolved yet.
    auto_pending: bool,
    /// The diffusion model's adapters, when the model decodes by diffusion.
    diffusion: Option<Arc<DiffusionModel>>,
    /// The engine's `closing` flag.
    closing: Arc<AtomicBool>,
    /// Set while a request is being served ([`Engine::busy`]).
    busy: Arc<AtomicBool>,
    /// Most sequences decoded together.
    parallel: usize,
    /// The caches of finished sequences, for their prefixes.
    pool: batch::CachePool,
    /// Rotates which adapter group a step serves first.
    turn: usize,
}

static REQUEST_COUNTER: AtomicU64 = AtomicU64::new(0);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `general.file_type` as llama.cpp names it.
fn file_type_name(ft: u64) -> Option<&'static str> {
    Some(match ft {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        32 => "BF16",
        _ => return None,
    })
}

fn model_info(file: &GgufFile, cfg: &models::TransformerConfig, context: usize, threads: usize, vocab: usize, has_template: bool) -> ModelInfo {
    let mut tensor_types = BTreeMap::new();
    let mut params = 0u64;
    for t in &file.tensors {
        *tensor_types.entry(t.dtype.name().to_string()).or_insert(0) += 1;
        params += t.n_elements();
    }
    let quantization = file.get("general.file_type").and_then(|v| v.as_u64()).and_then(file_type_name).map(str::to_string).unwrap_or_else(|| {
        // No file type: name the most common weight type.
        tensor_types.iter().filter(|(k, _)| k.as_str() != "F32").max_by_key(|(_, n)| **n).map(|(k, _)| k.clone()).unwrap_or_else(|| "F32".into())
    });
    ModelInfo {
        path: file.path.display().to_string(),
        name: file.get("general.name").and_then(|v| v.as_str()).unwrap_or("").to_string(),
        architecture: cfg.architecture.clone(),
        parameter_count: params,
        quantization,
        tensor_types,
        context_length: context,
        train_context_length: cfg.train_context,
        vocab_size: vocab,
        embedding_length: cfg.d_model,
        has_chat_template: has_template,
        diffusion: false,
        threads,
        backend: String::new(),
        kv_cache_type: String::new(),
        kv_cache_bytes: 0,
    }
}

/// The backend `mode` asks for, with the most tokens one pass carries.
fn open_backend(mode: GpuMode, model: &Transformer, threads: usize, context: usize, kv_type: KvType) -> Result<(Box<dyn Backend + Send>, usize)> {
    let cpu = |model: &Transformer| -> (Box<dyn Backend + Send>, usize) {
        let max_batch = MAX_BATCH.min(context);
        let cpu = CpuBackend::new(threads);
        let mut be: Box<dyn Backend + Send> = if crate::runtime::cpu_run_ahead() { Box::new(HostPicks::new(cpu)) } else { Box::new(cpu) };
        model.prepare(&mut *be, max_batch);
        (be, max_batch)
    };
    match mode {
        GpuMode::Off => Ok(cpu(model)),
        GpuMode::Cuda => open_cuda(model, context, kv_type),
        GpuMode::Auto => match open_cuda(model, context, kv_type) {
            Ok(b) => Ok(b),
            // Out of device memory is not a reason to fall back silently.
            Err(e) if e.code() == "ERR_GPU_OOM" => Err(e),
            Err(_) => Ok(cpu(model)),
        },
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(model: &Transformer, context: usize, kv_type: KvType) -> Result<(Box<dyn Backend + Send>, usize)> {
    use crate::backend::{cuda, AttnShape, Memory};
    let c = &model.cfg;
    let shape = AttnShape { n_head: c.n_head, n_kv_head: c.n_kv_head, head_dim: c.head_dim, scale: c.attn_scale, softcap: c.attn_softcap };
    let weights = [&model.embed, &model.output].into_iter().chain(model.layer_weights());
    cuda::check_model(weights, shape, c.d_model, kv_type).map_err(|why| cuda::unavailable(format!("{why} ({})", c.architecture)))?;
    let mut be = cuda::CudaBackend::new()?;
    let max_batch = MAX_BATCH.min(context);
    model.prepare(&mut be, max_batch);
    be.prepare_weight(&model.embed);
    be.status()?;
    Ok((Box::new(be), max_batch))
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_model: &Transformer, _context: usize, _kv_type: KvType) -> Result<(Box<dyn Backend + Send>, usize)> {
    Err(Error::Gpu { code: "ERR_GPU_UNAVAILABLE", msg: "this build of ruvllm has no CUDA backend".into() })
}

impl Engine {
    /// Opens the GGUF, builds tokenizer, template and model, and starts the worker thread.
    pub fn load(path: &Path, opts: LoadOptions) -> Result<Engine> {
        let file = GgufFile::open(path)?;
        let cfg = models::config_from_gguf(&file)?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        crate::runtime::mem::trim_heap();
        if tokenizer.vocab_size() > cfg.vocab_size {
            return Err(Error::gguf(&file.path, format!("tokenizer has {} tokens but the embedding only {}", tokenizer.vocab_size(), cfg.vocab_size)));
        }
        let template = ChatTemplate::from_gguf(&file, &tokenizer)?;
        let context = match opts.context_size {
            Some(0) => return Err(Error::InvalidArg("contextSize must be at least 1".into())),
            Some(c) if c > cfg.train_context => {
                return Err(Error::InvalidArg(format!("contextSize {c} exceeds the model's context length {}", cfg.train_context)))
            }
            Some(c) => c,
            None => cfg.train_context.min(DEFAULT_CONTEXT),
        };
        let parallel = match opts.parallel {
            Some(p) if p == 0 || p > MAX_PARALLEL => return Err(Error::InvalidArg(format!("parallel must be between 1 and {MAX_PARALLEL}, got {p}"))),
            Some(p) => p,
            None => DEFAULT_PARALLEL,
        };
        let prefix_budget = opts.prefix_cache_mb.unwrap_or(DEFAULT_PREFIX_CACHE_MB).saturating_mul(1 << 20);
        let threads = match opts.threads {
            Some(0) => return Err(Error::InvalidArg("threads must be at least 1".into())),
            Some(t) => t,
            None => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        };
        let model = {
            let loader = models::WeightLoader { file: &file };
            Arc::new(Transformer::load(&loader, cfg.clone(), context)?)
        };
        let mut defaults = Vec::with_capacity(opts.adapters.len());
        for (p, scale) in &opts.adapters {
            defaults.push((Arc::new(LoraAdapter::load(p, &cfg, &cfg.architecture)?), *scale));
        }
        let default_adapters = AdapterSet::new(defaults);
        let diffusion = if opts.diffusion.is_empty() {
            None
        } else {
            let adapters = opts.diffusion.iter().map(|p| LoraAdapter::load(p, &cfg, &cfg.architecture).map(Arc::new)).collect::<Result<Vec<_>>>()?;
            Some(DiffusionModel::new(adapters)?)
        };
        let kv_type = opts.kv_type.unwrap_or_default();
        let kv_row = cfg.n_kv_head * cfg.head_dim;
        if kv_type == KvType::Q8_0 && !kv_row.is_multiple_of(Q8_BLOCK) {
            return Err(Error::InvalidArg(format!("kvCacheType 'q8_0' stores blocks of {Q8_BLOCK} values; this model's key rows have {kv_row}")));
        }
        let (backend, max_batch) = open_backend(opts.gpu, &model, threads, context, kv_type)?;
        let diffusion = match diffusion {
            Some(mut dm) => {
                if opts.merge_diffusion.or_else(crate::runtime::diffusion_merge).unwrap_or_else(|| backend.prefers_merged_adapters()) {
                    dm.merge(&model, threads)?;
                }
                Some(Arc::new(dm))
            }
            None => None,
        };
        let mut info = model_info(&file, &cfg, context, threads, tokenizer.vocab_size(), template.is_some());
        info.diffusion = diffusion.is_some();
        info.backend = backend.describe();
        info.kv_cache_type = kv_type.name().into();
        info.kv_cache_bytes = model.cache_bytes(context, max_batch, kv_type) as u64;
        let bos_text = tokenizer.bos_id().and_then(|b| tokenizer.decode(&[b], false).ok()).unwrap_or_default();
        // The tokenizer and template are built: the vocabulary's arrays need not stay parsed.
        let mut file = file;
        file.drop_large_arrays(4096);
        crate::runtime::mem::trim_heap();
        let shared = Arc::new(Shared { file, tokenizer, template, bos_text, token_env: Default::default() });
        let (tx, rx) = channel();
        let worker_shared = shared.clone();
        let worker_adapters = default_adapters.clone();
        let hooks = Arc::new(Mutex::new(Hooks::default()));
        let (worker_hooks, worker_model) = (hooks.clone(), model.clone());
        let closing = Arc::new(AtomicBool::new(false));
        let worker_closing = closing.clone();
        let busy = Arc::new(AtomicBool::new(false));
        let worker_busy = busy.clone();
        let worker_diffusion = diffusion.clone();
        let handle = std::thread::Builder::new()
            .name("ruvllm-engine".into())
            .spawn(move || {
                let worker = Worker {
                    cache: worker_model.new_cache_typed(backend.as_ref(), context, max_batch, kv_type),
                    kv_type,
                    model: worker_model,
                    shared: worker_shared,
                    backend,
                    context,
                    default_adapters: worker_adapters,
                    hooks: worker_hooks,
                    auto_used: None,
                    auto_pending: false,
                    diffusion: worker_diffusion,
                    closing: worker_closing,
                    busy: worker_busy,
                    parallel,
                    pool: batch::CachePool::new(prefix_budget, parallel),
                    turn: 0,
                };
                worker.run(rx, opts.seed)
            })
            .map_err(|e| Error::Internal(format!("cannot start the engine thread: {e}")))?;
        Ok(Engine {
            info,
            cfg,
            default_adapters,
            hooks,
            model,
            shared: Mutex::new(Some(shared)),
            tx: Mutex::new(Some(tx)),
            worker: Mutex::new(Some(handle)),
            closing,
            busy,
            in_flight: Mutex::new(Vec::new()),
            diffusion,
        })
    }

    /// Loads and validates a LoRA adapter for this model (a LoRA GGUF, or a PEFT
    /// `adapter_model.safetensors` or its folder), for requests to name in their adapter set.
    pub fn load_adapter(&self, path: &Path) -> Result<Arc<LoraAdapter>> {
        LoraAdapter::load(path, &self.cfg, &self.cfg.architecture).map(Arc::new)
    }

    /// The adapters applied to requests that name none (those given at load).
    pub fn default_adapters(&self) -> &AdapterSet {
        &self.default_adapters
    }

    /// Makes `set` the learned adapters: from the next request on, every request that names no
    /// adapters of its own runs the load-time adapters and then these.
    pub fn set_learned(&self, set: AdapterSet) {
        lock(&self.hooks).learned = set;
    }

    /// The learned adapters in use ([`Engine::set_learned`]).
    pub fn learned(&self) -> AdapterSet {
        lock(&self.hooks).learned.clone()
    }

    /// Whether the engine is serving a request now (or has more queued): background work on
    /// the same cores (a learner's training) can step aside while it is.
    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::Relaxed)
    }

    /// Calls `f` with every completion from now on (`None` stops it).
    pub fn set_observer(&self, f: Option<CompletionObserver>) {
        lock(&self.hooks).observer = f;
    }

    /// Lets requests ask for `adapters: 'auto'` ([`AdapterSet::auto`]); `None` refuses them.
    pub fn set_auto_resolver(&self, f: Option<AutoResolver>) {
        lock(&self.hooks).resolver = f;
    }

    /// The model's weights, read-only (a learner computes gradients through them).
    pub fn model(&self) -> Arc<Transformer> {
        self.model.clone()
    }

    /// The diffusion model (conversion adapters, learned ranges), when it decodes by diffusion.
    pub fn diffusion_model(&self) -> Option<Arc<DiffusionModel>> {
        self.diffusion.clone()
    }

    /// The model's shape.
    pub fn config(&self) -> &models::TransformerConfig {
        &self.cfg
    }

    fn shared(&self) -> Result<Arc<Shared>> {
        lock(&self.shared).clone().ok_or(Error::Closed)
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// All GGUF metadata as JSON (token arrays included).
    pub fn metadata_json(&self) -> Result<serde_json::Value> {
        Ok(self.shared()?.file.metadata_json())
    }

    pub fn tokenize(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        self.shared()?.tokenizer.encode(text, add_special, true)
    }

    pub fn detokenize(&self, ids: &[u32]) -> Result<String> {
        let shared = self.shared()?;
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= shared.tokenizer.vocab_size()) {
            return Err(Error::InvalidArg(format!("token id {bad} is outside the vocabulary ({})", shared.tokenizer.vocab_size())));
        }
        shared.tokenizer.decode(ids, false)
    }

    /// The token ids generation feeds for chat `messages` (rendered with `template`, else the
    /// model's, and `tools`): what a chat session counts to keep its history inside the context.
    pub fn chat_tokens(&self, messages: &[ChatMessage], template: Option<&str>, tools: &[Tool]) -> Result<Vec<u32>> {
        self.shared()?.chat_ids(messages, template, tools)
    }

    /// Renders chat messages to the prompt text (the model's template, or `template`).
    pub fn apply_chat_template(&self, messages: &[ChatMessage], template: Option<&str>) -> Result<String> {
        self.shared()?.render_chat(messages, template, &[])
    }

    /// Queues a command whose cancel flag is `cancel`, for `stop` to set. A command sent while
    /// `stop` runs is still answered: the worker sees `closing` before running it.
    fn send(&self, cancel: &Arc<AtomicBool>, cmd: Command) -> Result<()> {
        let tx = lock(&self.tx);
        let tx = tx.as_ref().filter(|_| !self.is_closed()).ok_or(Error::Closed)?;
        {
            let mut in_flight = lock(&self.in_flight);
            in_flight.retain(|c| c.strong_count() > 0);
            in_flight.push(Arc::downgrade(cancel));
        }
        tx.send(cmd).map_err(|_| Error::Closed)
    }

    /// Queues a request. `Closed` is returned here; everything after goes to the sink.
    pub fn submit(&self, req: GenerateRequest) -> Result<()> {
        let cancel = req.cancel.clone();
        self.send(&cancel, Command::Generate(Box::new(req)))
    }

    /// Runs a generation and waits for it (tokens are not streamed; no cancellation): for Rust
    /// callers, examples and tests. Errors are the request's own, or `Closed`.
    pub fn generate_blocking(&self, prompt: Prompt, params: GenerateParams) -> Result<Completion> {
        self.generate_blocking_with(prompt, params, None)
    }

    /// [`Self::generate_blocking`] with a set of adapters (`None`: the load-time ones).
    pub fn generate_blocking_with(&self, prompt: Prompt, params: GenerateParams, adapters: Option<AdapterSet>) -> Result<Completion> {
        let (tx, rx) = channel();
        let sink = Box::new(move |e| {
            let _ = tx.send(e);
        });
        self.submit(GenerateRequest { prompt, params, adapters, cancel: Arc::new(AtomicBool::new(false)), sink })?;
        loop {
            match rx.recv().map_err(|_| Error::Closed)? {
                Event::Token { .. } | Event::Step(_) => {}
                Event::Done(c) => return Ok(c),
                Event::Error(e) => return Err(e),
            }
        }
    }

    /// Queues a scoring request; its result goes to `req.reply` (`Closed` is returned here).
    pub fn submit_score(&self, req: ScoreRequest) -> Result<()> {
        let cancel = req.cancel.clone();
        self.send(&cancel, Command::Score(req))
    }

    /// Scores `prompt` with the load-time adapters and waits (see [`ScoreRequest`]); no
    /// cancellation.
    pub fn score_blocking(&self, prompt: Prompt) -> Result<Score> {
        let (tx, rx) = channel();
        self.submit_score(ScoreRequest {
            prompt,
            adapters: None,
            chat_template: None,
            elbo: None,
            cancel: Arc::new(AtomicBool::new(false)),
            reply: Box::new(move |r| {
                let _ = tx.send(r);
            }),
        })?;
        rx.recv().map_err(|_| Error::Closed)?
    }

    /// Queues an embedding request; its result goes to `req.reply` (`Closed` is returned here).
    pub fn submit_embed(&self, req: EmbedRequest) -> Result<()> {
        let cancel = req.cancel.clone();
        self.send(&cancel, Command::Embed(req))
    }

    /// Embeds `texts` and waits (see [`EmbedRequest`]); no cancellation.
    pub fn embed_blocking(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let (tx, rx) = channel();
        let texts = texts.iter().map(|t| t.to_string()).collect();
        self.submit_embed(EmbedRequest {
            texts,
            adapters: None,
            cancel: Arc::new(AtomicBool::new(false)),
            reply: Box::new(move |r| {
                let _ = tx.send(r);
            }),
        })?;
        rx.recv().map_err(|_| Error::Closed)?
    }

    /// Starts closing without waiting: takes no more requests and cancels every queued and
    /// running one; each ends with `Closed` (the running one within a token). [`Self::close`]
    /// also waits for the worker and frees the model. Safe to call more than once.
    pub fn stop(&self) {
        self.closing.store(true, Ordering::SeqCst);
        for c in lock(&self.in_flight).drain(..) {
            if let Some(c) = c.upgrade() {
                c.store(true, Ordering::SeqCst);
            }
        }
        if let Some(tx) = lock(&self.tx).take() {
            let _ = tx.send(Command::Close);
        }
    }

    /// [`Self::stop`], then waits for the worker to answer what was queued and frees the model.
    pub fn close(&self) {
        self.stop();
        if let Some(handle) = lock(&self.worker).take() {
            let _ = handle.join();
        }
        lock(&self.shared).take();
    }

    /// True from the first `stop` or `close` on.
    pub fn is_closed(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.close();
    }
}

impl Shared {
    /// Chat messages rendered and tokenized as a prompt.
    fn chat_ids(&self, messages: &[ChatMessage], template: Option<&str>, tools: &[Tool]) -> Result<Vec<u32>> {
        let text = self.render_chat(messages, template, tools)?;
        // Templates usually write the BOS text themselves; don't add a second one.
        let add_special = self.bos_text.is_empty() || !text.starts_with(&self.bos_text);
        self.tokenizer.encode(&text, add_special, true)
    }

    /// Renders messages, and `tools` through the template's `tools` variable, or, for a
    /// template that has none, described in a system message.
    fn render_chat(&self, messages: &[ChatMessage], template: Option<&str>, tools: &[Tool]) -> Result<String> {
        if messages.is_empty() {
            return Err(Error::InvalidArg("messages must not be empty".into()));
        }
        let tok = &self.tokenizer;
        let piece = |id: Option<u32>| id.and_then(|i| tok.decode(&[i], false).ok()).unwrap_or_default();
        let given;
        let t = match (template, &self.template) {
            (Some(src), _) => {
                given = ChatTemplate::new(src, &piece(tok.bos_id()), &piece(tok.eos_id()))?;
                &given
            }
            (None, Some(t)) => t,
            (None, None) => {
                return Err(Error::ChatTemplate(
                    "this model ships no chat template (tokenizer.chat_template); pass a prompt string, or give one with the chatTemplate option".into(),
                ))
            }
        };
        if tools.is_empty() || t.reads_tools() {
            t.render_with_tools(messages, tools, true)
        } else {
            t.render(&crate::structured::messages_with_tools_prompt(messages, tools, ToolFormat::for_template(Some(t.source()))), true)
        }
    }

    /// How the model writes tool calls, from the chat template a request uses.
    fn tool_format(&self, template: Option<&str>) -> ToolFormat {
        ToolFormat::for_template(template.or(self.template.as_ref().map(ChatTemplate::source)))
    }

    /// The vocabulary for constrained decoding, built on first use.
    fn token_env(&self) -> Result<Arc<TokenEnv>> {
        if let Some(env) = self.token_env.get() {
            return Ok(env.clone());
        }
        let env = TokenEnv::new(&self.tokenizer)?;
        // Only the worker builds it, so no other value can have been set meanwhile.
        let _ = self.token_env.set(env.clone());
        Ok(env)
    }
}

/// Answers a command the closing engine will not run with `Closed`.
fn refuse(cmd: Command) {
    match cmd {
        Command::Generate(mut req) => {
            let _ = catch_unwind(AssertUnwindSafe(|| (req.sink)(Event::Error(Error::Closed))));
        }
        Command::Score(req) => {
            let _ = catch_unwind(AssertUnwindSafe(|| (req.reply)(Err(Error::Closed))));
        }
        Command::Embed(req) => {
            let _ = catch_unwind(AssertUnwindSafe(|| (req.reply)(Err(Error::Closed))));
        }
        Command::Close => {}
    }
}

/// Longest common prefix of two token sequences.
/// The next command: `busy` is cleared while the worker waits for one and set while it works.
fn next_command(rx: &Receiver<Command>, busy: &AtomicBool) -> Option<Command> {
    let cmd = match rx.try_recv() {
        Ok(c) => Some(c),
        Err(std::sync::mpsc::TryRecvError::Empty) => {
            busy.store(false, Ordering::Relaxed);
            rx.recv().ok()
        }
        Err(std::sync::mpsc::TryRecvError::Disconnected) => None,
    };
    busy.store(cmd.is_some(), Ordering::Relaxed);
    cmd
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Worker {
    /// Serves commands until closed: generation requests join the batch of decoding sequences
    /// (up to `parallel`, the rest wait in order); scoring, embedding and a diffusion model's
    /// generation run alone between two steps of the batch.
    fn run(mut self, rx: Receiver<Command>, default_seed: Option<u64>) {
        let shared = self.shared.clone();
        let tok = &shared.tokenizer;
        let mut waiting: VecDeque<(GenerateRequest, Instant)> = VecDeque::new();
        let mut active: Vec<batch::Seq<'_>> = Vec::new();
        let mut open = true;
        while open {
            // Wait for a command when there is nothing to decode; else take what has arrived.
            let mut cmds = Vec::new();
            if active.is_empty() && waiting.is_empty() {
                match next_command(&rx, &self.busy) {
                    Some(c) => cmds.push(c),
                    None => break,
                }
            }
            while let Ok(c) = rx.try_recv() {
                cmds.push(c);
            }
            for cmd in cmds {
                if !open || (self.closing.load(Ordering::SeqCst) && !matches!(cmd, Command::Close)) {
                    refuse(cmd);
                    continue;
                }
                match cmd {
                    Command::Close => open = false,
                    Command::Generate(mut req) => {
                        if let Some(seed) = default_seed {
                            if req.params.sampling.seed == 0 {
                                req.params.sampling.seed = seed;
                            }
                        }
                        if self.diffusion.is_some() {
                            self.generate_alone(*req);
                        } else {
                            waiting.push_back((*req, Instant::now()));
                        }
                    }
                    Command::Embed(req) => {
                        let EmbedRequest { texts, adapters, cancel, reply } = req;
                        self.use_adapters(adapters);
                        self.answer(|w| w.embed(&texts, &cancel), reply);
                    }
                    Command::Score(req) => {
                        let ScoreRequest { prompt, adapters, chat_template, cancel, elbo, reply } = req;
                        match elbo {
                            Some(p) => self.answer(|w| w.score_elbo(&prompt, chat_template.as_deref(), p, &cancel), reply),
                            None => {
                                self.use_adapters(adapters);
                                self.answer(|w| w.score(&prompt, chat_template.as_deref(), &cancel), reply);
                            }
                        }
                    }
                }
            }
            if !open || self.closing.load(Ordering::SeqCst) {
                break;
            }
            while active.len() < self.parallel {
                let Some((req, start)) = waiting.pop_front() else { break };
                if let Some(s) = self.admit(req, start, tok, &active) {
                    active.push(s);
                }
            }
            self.busy.store(true, Ordering::Relaxed);
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.step(&mut active))) {
                // Whatever was running may be half-done: it ends with the panic's error.
                let msg = Error::from_panic(panic).to_string();
                let _ = catch_unwind(AssertUnwindSafe(|| batch::drop_picks(&mut *self.backend)));
                for s in active.drain(..) {
                    let mut sink = s.req.sink;
                    let _ = catch_unwind(AssertUnwindSafe(|| sink(Event::Error(Error::Internal(msg.clone())))));
                }
            }
            let mut i = 0;
            while i < active.len() {
                if active[i].finished() {
                    let s = active.swap_remove(i);
                    self.retire(s);
                } else {
                    i += 1;
                }
            }
        }
        // Closed: what is decoding, waiting or still queued ends with `Closed`.
        for s in active {
            let mut sink = s.req.sink;
            let _ = catch_unwind(AssertUnwindSafe(|| sink(Event::Error(Error::Closed))));
        }
        for (req, _) in waiting {
            refuse(Command::Generate(Box::new(req)));
        }
        while let Ok(cmd) = rx.try_recv() {
            refuse(cmd);
        }
    }

    /// A diffusion model's generation, run alone on the worker's cache.
    fn generate_alone(&mut self, mut req: GenerateRequest) {
        self.use_adapters(req.adapters.take());
        let outcome = catch_unwind(AssertUnwindSafe(|| self.generate(&mut req)));
        let event = match outcome {
            Ok(Ok(done)) if done.finish_reason == FinishReason::Abort && self.closing.load(Ordering::SeqCst) => Event::Error(Error::Closed),
            Ok(Ok(done)) => {
                let observer = lock(&self.hooks).observer.clone();
                if let Some(f) = observer {
                    let _ = catch_unwind(AssertUnwindSafe(|| f(&done)));
                }
                Event::Done(done)
            }
            Ok(Err(e)) => Event::Error(e),
            Err(panic) => {
                // The cache may be half-written: forget it.
                self.cache.tokens.clear();
                Event::Error(Error::from_panic(panic))
            }
        };
        let _ = catch_unwind(AssertUnwindSafe(|| (req.sink)(event)));
    }

    /// Makes `set` (or, for `None`, the load-time adapters) the ones the forward pass applies.
    /// The cached keys and values were computed with the previous set: under another they are
    /// not a reusable prefix.
    fn use_adapters(&mut self, set: Option<AdapterSet>) {
        self.auto_used = None;
        self.auto_pending = set.as_ref().is_some_and(|s| s.is_auto());
        let set = set.filter(|s| !s.is_auto()).unwrap_or_else(|| {
            let learned = lock(&self.hooks).learned.clone();
            if learned.entries().is_empty() {
                self.default_adapters.clone()
            } else {
                AdapterSet::new(self.default_adapters.entries().iter().chain(learned.entries()).cloned().collect())
            }
        });
        if !self.cache.adapters.same_as(&set) {
            self.cache.tokens.clear();
        }
        self.cache.adapters = set;
    }

    /// For an `'auto'` request: embeds its prompt `ids` (as `embed` does, under the learned
    /// adapters) and lets the resolver pick the adapters, which the request then runs.
    fn resolve_auto(&mut self, ids: &[u32], cancel: &AtomicBool) -> Result<()> {
        if !std::mem::take(&mut self.auto_pending) {
            return Ok(());
        }
        let Some(resolver) = lock(&self.hooks).resolver.clone() else {
            return Err(Error::InvalidArg("adapters: 'auto' needs a model loaded with learning: { dir } (its adapter bank picks the adapters)".into()));
        };
        if ids.len() > self.context {
            return Err(Error::ContextOverflow { tokens: ids.len(), context: self.context });
        }
        let mut sum = vec![0.0f64; self.model.cfg.d_model];
        self.evaluate(ids, cancel, Outputs::Hidden, &mut |_, h| sum.iter_mut().zip(h).for_each(|(s, &v)| *s += v as f64))?;
        let norm = sum.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-30);
        let q: Vec<f32> = sum.iter().map(|v| (v / norm) as f32).collect();
        let (set, used) = resolver(&q)?;
        self.use_adapters(Some(set));
        self.auto_used = Some(used);
        Ok(())
    }

    /// The token ids of a prompt (BOS added to text; chat rendered with its template).
    fn prompt_ids(&self, prompt: &Prompt, chat_template: Option<&str>, tools: &[Tool]) -> Result<Vec<u32>> {
        let tok = &self.shared.tokenizer;
        let ids = match prompt {
            Prompt::Text(text) => tok.encode(text, true, true)?,
            Prompt::Tokens(ids) => {
                if let Some(bad) = ids.iter().find(|&&id| id as usize >= self.model.cfg.vocab_size) {
                    return Err(Error::InvalidArg(format!("token id {bad} is outside the vocabulary ({})", self.model.cfg.vocab_size)));
                }
                ids.clone()
            }
            Prompt::Chat(messages) => self.shared.chat_ids(messages, chat_template, tools)?,
        };
        if ids.is_empty() {
            return Err(Error::InvalidArg("the prompt is empty".into()));
        }
        Ok(ids)
    }

    /// Evaluates `ids` from position 0 in chunks of the backend's batch (positions 0.. are
    /// rewritten: the cache keeps what this evaluates) and calls `each(position, row)` with
    /// every token's logits or final hidden state (`rows`). Between chunks, `cancel` stops it
    /// with `Aborted`, the cache keeping the chunks already evaluated.
    fn evaluate(&mut self, ids: &[u32], cancel: &AtomicBool, rows: Outputs<'static>, each: &mut dyn FnMut(usize, &[f32])) -> Result<()> {
        let batch = self.backend.max_batch();
        self.cache.tokens.clear();
        for (i, chunk) in ids.chunks(batch).enumerate() {
            if cancel.load(Ordering::Relaxed) {
                self.cache.tokens.truncate(i * batch);
                return Err(Error::Aborted);
            }
            let pos0 = i * batch;
            let mut at = |t: usize, row: &[f32]| each(pos0 + t, row);
            let (cache, be) = (&mut self.cache, &mut *self.backend);
            self.model.forward_each(chunk, pos0, AttentionMask::Causal, cache, be, rows, &mut at)?;
        }
        Ok(())
    }

    /// Runs `work` with panics caught (a panic may leave the cache half-written, so it is
    /// forgotten) and hands the result to `reply`, whose own panic is caught too.
    fn answer<T>(&mut self, work: impl FnOnce(&mut Self) -> Result<T>, reply: impl FnOnce(Result<T>)) {
        let outcome = catch_unwind(AssertUnwindSafe(|| work(self)));
        let result = match outcome {
            Ok(Err(Error::Aborted)) if self.closing.load(Ordering::SeqCst) => Err(Error::Closed),
            Ok(r) => r,
            Err(panic) => {
                self.cache.tokens.clear();
                Err(Error::from_panic(panic))
            }
        };
        let _ = catch_unwind(AssertUnwindSafe(|| reply(result)));
    }

    /// Evaluates `prompt` from position 0 and returns each token's log-probability.
    fn score(&mut self, prompt: &Prompt, chat_template: Option<&str>, cancel: &AtomicBool) -> Result<Score> {
        let ids = self.prompt_ids(prompt, chat_template, &[])?;
        if ids.len() > self.context {
            return Err(Error::ContextOverflow { tokens: ids.len(), context: self.context });
        }
        self.resolve_auto(&ids, cancel)?;
        let start = Instant::now();
        let n = ids.len().saturating_sub(1);
        let (mut logprobs, mut top_tokens, mut top_logprobs) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        self.evaluate(&ids, cancel, Outputs::Logits, &mut |p, logits| {
            if let Some(&next) = ids.get(p + 1) {
                let (lp, top, top_lp) = log_softmax_at(logits, next as usize);
                logprobs.push(lp);
                top_tokens.push(top);
                top_logprobs.push(top_lp);
            }
        })?;
        let perplexity = if logprobs.is_empty() { f64::NAN } else { (-logprobs.iter().sum::<f64>() / logprobs.len() as f64).exp() };
        let secs = start.elapsed().as_secs_f64();
        Ok(Score {
            tokens_per_second: if secs > 0.0 { ids.len() as f64 / secs } else { 0.0 },
            tokens: ids,
            logprobs,
            top_tokens,
            top_logprobs,
            perplexity,
            elbo_samples: None,
            adapters_used: self.auto_used.take(),
        })
    }

    /// The diffusion model's ELBO on the prompt ([`decode::elbo`]).
    fn score_elbo(&mut self, prompt: &Prompt, chat_template: Option<&str>, p: ElboParams, cancel: &AtomicBool) -> Result<Score> {
        let Some(dm) = self.diffusion.clone() else {
            return Err(Error::InvalidArg("elbo needs a diffusion model: load 'gemma-3-270m-diffusion', or a GGUF with { diffusion: { adapter } }".into()));
        };
        let ids = self.prompt_ids(prompt, chat_template, &[])?;
        let start = Instant::now();
        let shared = self.shared.clone();
        let mut ctx =
            DecodeContext { model: &self.model, cache: &mut self.cache, backend: &mut *self.backend, tokenizer: &shared.tokenizer, context: self.context };
        let nll = decode::elbo(&mut ctx, &dm, &ids, p, cancel)?;
        let secs = start.elapsed().as_secs_f64();
        Ok(Score {
            tokens_per_second: if secs > 0.0 { (ids.len() * p.samples) as f64 / secs } else { 0.0 },
            tokens: ids,
            logprobs: Vec::new(),
            top_tokens: Vec::new(),
            top_logprobs: Vec::new(),
            perplexity: nll.exp(),
            elbo_samples: Some(p.samples),
            adapters_used: None,
        })
    }

    /// Mean-pooled, L2-normalised final hidden states of each text (BOS added), evaluated from
    /// position 0 like `score`. A text longer than the context is an error, not truncated.
    fn embed(&mut self, texts: &[String], cancel: &AtomicBool) -> Result<Vec<Vec<f32>>> {
        if std::mem::take(&mut self.auto_pending) {
            return Err(Error::InvalidArg("adapters: 'auto' is for generate, stream and score (embed takes a list of adapters, or none)".into()));
        }
        let d = self.model.cfg.d_model;
        let mut out = Vec::with_capacity(texts.len());
        for (i, text) in texts.iter().enumerate() {
            let ids = self.shared.tokenizer.encode(text, true, true)?;
            if ids.is_empty() {
                return Err(Error::InvalidArg(format!("texts[{i}] has no tokens (empty text and no BOS token)")));
            }
            if ids.len() > self.context {
                return Err(Error::ContextOverflow { tokens: ids.len(), context: self.context });
            }
            let mut sum = vec![0.0f64; d];
            self.evaluate(&ids, cancel, Outputs::Hidden, &mut |_, h| sum.iter_mut().zip(h).for_each(|(s, &v)| *s += v as f64))?;
            let norm = sum.iter().map(|v| v * v).sum::<f64>().sqrt();
            if !(norm > 0.0 && norm.is_finite()) {
                return Err(Error::Internal(format!("texts[{i}]: the pooled hidden state has norm {norm}")));
            }
            out.push(sum.iter().map(|v| (v / norm) as f32).collect());
        }
        Ok(out)
    }

    fn generate(&mut self, req: &mut GenerateRequest) -> Result<Completion> {
        let start = Instant::now();
        let id = format!("cmpl-{}-{}", std::process::id(), REQUEST_COUNTER.fetch_add(1, Ordering::Relaxed));
        let shared = self.shared.clone();
        if req.params.constraint.is_some() || !req.params.tools.is_empty() {
            return Err(Error::InvalidArg("responseFormat, grammar and tools need an autoregressive model; a diffusion model cannot be constrained".into()));
        }
        if req.params.logprobs.is_some() {
            return Err(Error::InvalidArg("logprobs need an autoregressive model; a diffusion model commits tokens out of order".into()));
        }
        let ids = self.prompt_ids(&req.prompt, req.params.chat_template.as_deref(), &req.params.tools)?;
        if ids.len() >= self.context {
            return Err(Error::ContextOverflow { tokens: ids.len(), context: self.context });
        }
        self.resolve_auto(&ids, &req.cancel)?;
        let mut c = Completion {
            id,
            text: String::new(),
            tokens: Vec::new(),
            prompt_ids: ids.clone(),
            finish_reason: FinishReason::Abort,
            prompt_tokens: ids.len(),
            cached_tokens: 0,
            completion_tokens: 0,
            ttft_ms: 0.0,
            prefill_tokens_per_second: 0.0,
            decode_tokens_per_second: 0.0,
            diffusion: None,
            adapters_used: self.auto_used.take(),
            tool_calls: Vec::new(),
            logprobs: None,
        };
        if req.cancel.load(Ordering::Relaxed) {
            return Ok(c);
        }
        let Some(model) = self.diffusion.clone() else {
            return Err(Error::Internal("generate_alone runs diffusion models only".into()));
        };
        let params = req.params.diffusion.clone().unwrap_or_default();
        let mut ctx =
            DecodeContext { model: &self.model, cache: &mut self.cache, backend: &mut *self.backend, tokenizer: &shared.tokenizer, context: self.context };
        let request = DecodeRequest { prompt: &ids, params: &req.params, cancel: &req.cancel, sink: &mut req.sink, start };
        let d = Diffusion { model: &model, params: &params }.decode(&mut ctx, request);
        // The cache now holds diffusion rows: no later request may reuse them.
        self.cache.tokens.clear();
        let d = d?;
        c.diffusion = d.diffusion.clone();
        c.completion_tokens = d.tokens.len();
        c.text = d.text;
        c.tokens = d.tokens;
        c.finish_reason = d.finish_reason;
        c.ttft_ms = d.ttft_ms;
        c.prefill_tokens_per_second = if d.prefill_s > 0.0 { d.prefill_tokens as f64 / d.prefill_s } else { 0.0 };
        let decoded = c.completion_tokens.saturating_sub(1);
        c.decode_tokens_per_second = if d.decode_s > 0.0 && decoded > 0 { decoded as f64 / d.decode_s } else { 0.0 };
        Ok(c)
    }
}
