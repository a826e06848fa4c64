//! One error enum for the core. Every variant has a stable `code()` that the binding passes to
//! JavaScript as `err.code`.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file is not a valid GGUF, or is valid GGUF but inconsistent (truncated, bad offsets...).
    #[error("invalid GGUF file {path}: {msg}")]
    GgufInvalid { path: PathBuf, msg: String },
    /// The GGUF is valid but describes something we cannot run (architecture, tensor type...).
    #[error("unsupported model {path}: {msg}")]
    Unsupported { path: PathBuf, msg: String },
    #[error("model not found: {0}")]
    ModelNotFound(String),
    /// A LoRA adapter file that cannot be used with this model (format, names, shapes, rank).
    #[error("invalid adapter {path}: {msg}")]
    AdapterInvalid { path: PathBuf, msg: String },
    #[error("{0}")]
    InvalidArg(String),
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    #[error("chat template error: {0}")]
    ChatTemplate(String),
    /// A JSON schema, Lark or GBNF grammar (or a tool's parameter schema) that cannot be
    /// compiled into a constraint.
    #[error("grammar error: {0}")]
    Grammar(String),
    #[error("the prompt has {tokens} tokens but the context holds {context}")]
    ContextOverflow { tokens: usize, context: usize },
    #[error("I/O error on {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("the model was closed")]
    Closed,
    #[error("the operation was aborted")]
    Aborted,
    #[error("internal error: {0}")]
    Internal(String),
    /// The GPU backend: no usable device (`ERR_GPU_UNAVAILABLE`), out of device memory
    /// (`ERR_GPU_OOM`), or a failed kernel or driver call (`ERR_GPU`).
    #[error("{msg}")]
    Gpu { code: &'static str, msg: String },
}

impl Error {
    /// Stable machine-readable code, documented in the README.
    pub fn code(&self) -> &'static str {
        match self {
            Error::GgufInvalid { .. } => "ERR_GGUF_INVALID",
            Error::Unsupported { .. } => "ERR_MODEL_UNSUPPORTED",
            Error::ModelNotFound(_) => "ERR_MODEL_NOT_FOUND",
            Error::AdapterInvalid { .. } => "ERR_ADAPTER_INVALID",
            Error::InvalidArg(_) => "ERR_INVALID_ARG",
            Error::Tokenizer(_) => "ERR_TOKENIZER",
            Error::ChatTemplate(_) => "ERR_CHAT_TEMPLATE",
            Error::Grammar(_) => "ERR_GRAMMAR",
            Error::ContextOverflow { .. } => "ERR_CONTEXT_OVERFLOW",
            Error::Io { .. } => "ERR_IO",
            Error::Closed => "ERR_CLOSED",
            Error::Aborted => "ABORT_ERR",
            Error::Internal(_) => "ERR_INTERNAL",
            Error::Gpu { code, .. } => code,
        }
    }

    pub fn gguf(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::GgufInvalid { path: path.into(), msg: msg.into() }
    }

    pub fn adapter(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::AdapterInvalid { path: path.into(), msg: msg.into() }
    }

    pub fn unsupported(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::Unsupported { path: path.into(), msg: msg.into() }
    }

    /// Turns a caught panic payload into an `Internal` error.
    pub fn from_panic(payload: Box<dyn std::any::Any + Send>) -> Self {
        let msg = if let Some(s) = payload.downcast_ref::<&str>() {
            (*s).to_string()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "unknown panic".to_string()
        };
        Error::Internal(format!("panic: {msg}"))
    }
}
