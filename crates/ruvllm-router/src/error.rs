//! Errors of the router crate. Each variant has a stable `code()` that the binding hands to
//! JavaScript as `err.code`; an embedder's error keeps the code it has in `ruvllm-embed`.

use std::path::PathBuf;

/// Everything that can go wrong in routing, persistence and hooks, and in the embedder they use.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The embedder failed (not found, not loadable, an input it cannot embed, its backend's
    /// error).
    #[error(transparent)]
    Embedder(ruvllm_embed::Error),
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
            Error::Embedder(e) => e.code(),
            Error::InvalidArg(_) => "ERR_INVALID_ARG",
            Error::Empty(_) => "ERR_ROUTER_EMPTY",
            Error::BadState { .. } => "ERR_ROUTER_STATE",
            Error::EmbedderMismatch(_) => "ERR_EMBEDDER_MISMATCH",
            Error::Io { .. } => "ERR_IO",
            Error::LockTimeout(_) => "ERR_LOCK_TIMEOUT",
            Error::Internal(_) => "ERR_INTERNAL",
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

/// A file error stays `Io` whichever crate hit it (the router saves through
/// `ruvllm_embed::files`); anything else is the embedder's.
impl From<ruvllm_embed::Error> for Error {
    fn from(e: ruvllm_embed::Error) -> Self {
        match e {
            ruvllm_embed::Error::Io { op, path, source } => Error::Io { op, path, source },
            other => Error::Embedder(other),
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
