//! Errors of the embedder crate. Each variant has a stable `code()` that the binding hands to
//! JavaScript as `err.code`; the router passes these through with the same codes.

use std::path::PathBuf;

/// Everything that can go wrong in finding, loading and running an embedder.
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
    /// Filesystem error with the path involved.
    #[error("{op} {path}: {source}")]
    Io { op: &'static str, path: PathBuf, source: std::io::Error },
}

impl Error {
    /// Stable code for JavaScript (`err.code`).
    pub fn code(&self) -> &'static str {
        match self {
            Error::EmbedderNotFound(_) => "ERR_EMBEDDER_NOT_FOUND",
            Error::EmbedderLoad { .. } => "ERR_EMBEDDER_LOAD",
            Error::Tokenizer(_) | Error::Embed(_) => "ERR_EMBED",
            Error::Io { .. } => "ERR_IO",
            Error::Backend { code, .. } => code,
        }
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { op, path: path.into(), source }
    }
}

impl From<candle_core::Error> for Error {
    fn from(e: candle_core::Error) -> Self {
        Error::Embed(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, Error>;
