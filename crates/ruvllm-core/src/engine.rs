//! The generation engine: one worker thread owns the model and its KV cache; requests arrive on
//! a channel, tokens stream back through each request's sink. Cancellation is a flag checked
//! every token. A panic inside the worker is caught and reported as `Error::Internal`.
//! OWNER: models owner (lead). The public interface below is what the binding uses.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::chat::ChatMessage;
use crate::sampling::SamplingParams;
use crate::{Error, Result};

/// Options for loading a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// KV cache length in tokens (default: min(model's context length, 4096)).
    pub context_size: Option<usize>,
    /// Worker threads for the kernels (default: available parallelism).
    pub threads: Option<usize>,
    /// Default seed for sampling when a request gives none.
    pub seed: Option<u64>,
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
    pub has_chat_template: bool,
    pub threads: usize,
}

/// A prompt: plain text, or chat messages rendered with the model's (or a given) template.
#[derive(Debug, Clone)]
pub enum Prompt {
    Text(String),
    Chat(Vec<ChatMessage>),
}

#[derive(Debug, Clone)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// Overrides the model's chat template for `Prompt::Chat`.
    pub chat_template: Option<String>,
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
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub ttft_ms: f64,
    pub prefill_tokens_per_second: f64,
    pub decode_tokens_per_second: f64,
}

/// What a request's sink receives, in order: zero or more `Token`, then exactly one `Done` or
/// `Error`.
#[derive(Debug)]
pub enum Event {
    Token { id: u32, text: String },
    Done(Completion),
    Error(Error),
}

pub type Sink = Box<dyn FnMut(Event) + Send>;

pub struct GenerateRequest {
    pub prompt: Prompt,
    pub params: GenerateParams,
    /// Set to true to stop the request; checked before prefill and every token.
    pub cancel: Arc<AtomicBool>,
    pub sink: Sink,
}

/// A loaded model with its worker thread. Cheap to share behind an `Arc`.
pub struct Engine { /* lead */ }

impl Engine {
    /// Opens the GGUF, builds tokenizer, template and model, and starts the worker thread.
    pub fn load(path: &Path, opts: LoadOptions) -> Result<Engine> { todo!() }
    pub fn info(&self) -> &ModelInfo { todo!() }
    /// All GGUF metadata as JSON (token arrays included).
    pub fn metadata_json(&self) -> serde_json::Value { todo!() }
    pub fn tokenize(&self, text: &str, add_special: bool) -> Result<Vec<u32>> { todo!() }
    pub fn detokenize(&self, ids: &[u32]) -> Result<String> { todo!() }
    /// Renders chat messages to the prompt text (the model's template, or `template`).
    pub fn apply_chat_template(&self, messages: &[ChatMessage], template: Option<&str>) -> Result<String> { todo!() }
    /// Queues a request. Validation errors (and `Closed`) are returned here; everything after
    /// goes to the sink.
    pub fn submit(&self, req: GenerateRequest) -> Result<()> { todo!() }
    /// Stops the worker, failing queued requests with `Closed`, and frees the model. Idempotent.
    pub fn close(&self) { todo!() }
    pub fn is_closed(&self) -> bool { todo!() }
}

#[allow(dead_code)]
fn _unused(_: Error) {}
