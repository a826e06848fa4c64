//! Errors of the router crate. Each variant has a stable `code()` that the binding hands to
//! JavaScript as `err.code`.

use std::path::PathBuf;

/// Everything that can go wrong in embedding, routing, persistence and hooks.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No embedding model was found (neither `RUVLLM_EMBEDDER` nor the pip package).
    #[error("{0}")]
    EmbedderNotFound(String),
    /// The model files exist but could not be loaded (bad safetensors, bad config, ...).
    #[error("cannot load the embedding model from {path}: {reason}")]
    EmbedderLoad { path: PathBuf, reason: String },
    /// Tokenizer failure on an input.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// A tensor operation failed while embedding.
    #[error("embedding failed: {0}")]
    Embed(String),
    /// An embedder backed by something else (a loaded LLM) failed with that component's own
    /// stable code (`ERR_CLOSED`, `ERR_CONTEXT_OVERFLOW`, ...), kept as it is.
    #[error("{message}")]
    Backend { code: &'static str, message: String },
    /// A bad argument from the caller (unknown agent, empty text, bad option).
    #[error("{0}")]
    InvalidArg(String),
    /// The router has no patterns or agents to route with.
    #[error("{0}")]
    Empty(String),
    /// A saved router or state file could not be read or is malformed.
    #[error("cannot read router state {path}: {reason}")]
    BadState { path: PathBuf, reason: String },
    /// A saved router was made with a different embedder (dimension or model id differ).
    #[error("{0}")]
    EmbedderMismatch(String),
    /// Filesystem error with the path involved.
    #[error("{op} {path}: {source}")]
    Io { op: &'static str, path: PathBuf, source: std::io::Error },
    /// Could not take the state lock in time.
    #[error("timed out waiting for the lock {0}")]
    LockTimeout(PathBuf),
    /// A panic caught at a boundary.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// Stable code for JavaScript (`err.code`).
    pub fn code(&self) -> &'static str {
        match self {
            Error::EmbedderNotFound(_) => "ERR_EMBEDDER_NOT_FOUND",
            Error::EmbedderLoad { .. } => "ERR_EMBEDDER_LOAD",
            Error::Tokenizer(_) | Error::Embed(_) => "ERR_EMBED",
            Error::InvalidArg(_) => "ERR_INVALID_ARG",
            Error::Empty(_) => "ERR_ROUTER_EMPTY",
            Error::BadState { .. } => "ERR_ROUTER_STATE",
            Error::EmbedderMismatch(_) => "ERR_EMBEDDER_MISMATCH",
            Error::Io { .. } => "ERR_IO",
            Error::LockTimeout(_) => "ERR_LOCK_TIMEOUT",
            Error::Internal(_) => "ERR_INTERNAL",
            Error::Backend { code, .. } => code,
        }
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { op, path: path.into(), source }
    }

    /// Turns a caught panic payload into `Error::Internal`.
    pub fn from_panic(payload: Box<dyn std::any::Any + Send>) -> Self {
        let msg = if let Some(s) = payload.downcast_ref::<&str>() {
            (*s).to_string()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "panic".to_string()
        };
        Error::Internal(msg)
    }
}

impl From<candle_core::Error> for Error {
    fn from(e: candle_core::Error) -> Self {
        Error::Embed(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, Error>;
