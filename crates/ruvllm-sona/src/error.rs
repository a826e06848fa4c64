//! Errors of the learning crate, each with a stable `code()` for JavaScript.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A learning file exists but cannot be used (truncated, another model's, not ours).
    #[error("learning state {path} is unusable: {msg}")]
    Corrupt { path: PathBuf, msg: String },
    /// Bad input from the caller (an unknown completion id, quality outside [0, 1], ...).
    #[error("{0}")]
    InvalidArg(String),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The learner was closed.
    #[error("the learner is closed")]
    Closed,
    /// The engine failed (keeps its code).
    #[error(transparent)]
    Core(#[from] ruvllm_core::Error),
    #[error("internal error: {0}")]
    Internal(String),
    /// Federation was asked for without consent (`learning.federate` is off).
    #[error("{0}")]
    NoConsent(String),
    /// The federation failed (keeps its code).
    #[error(transparent)]
    Federation(#[from] ruvllm_daf::Error),
}

impl Error {
    pub fn code(&self) -> &'static str {
        match self {
            Error::Corrupt { .. } => "ERR_LEARNING_STATE",
            Error::InvalidArg(_) => "ERR_INVALID_ARG",
            Error::Io { .. } => "ERR_IO",
            Error::Closed => "ERR_CLOSED",
            Error::Core(e) => e.code(),
            Error::Internal(_) => "ERR_INTERNAL",
            Error::NoConsent(_) => "ERR_FEDERATION_CONSENT",
            Error::Federation(e) => e.code(),
        }
    }

    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Error::Io { path: path.to_path_buf(), source }
    }

    pub fn corrupt(path: &Path, msg: String) -> Self {
        Error::Corrupt { path: path.to_path_buf(), msg }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
