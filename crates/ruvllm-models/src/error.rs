//! One error enum for the model manager. Every variant has a stable `code()` that the binding
//! passes to JavaScript as `err.code` and the CLI prints with `--json`.

use std::path::PathBuf;

pub type Result<T, E = HubError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// Unknown id, repo or file (404), or a known model that is not in the cache and may not be
    /// downloaded.
    #[error("{0}")]
    NotFound(String),
    /// A server could not be reached, dropped the connection, or answered with a server error.
    #[error("{0}")]
    Network(String),
    /// 401/403: the file needs a token (gated or private repo).
    #[error("{0}")]
    AuthRequired(String),
    /// The bytes do not hash to what the registry or the server promised. Nothing was kept.
    #[error("{0}")]
    ChecksumMismatch(String),
    /// Not enough free space where the file goes.
    #[error("{0}")]
    DiskFull(String),
    /// A local file (import) is not a valid GGUF.
    #[error("{0}")]
    GgufInvalid(String),
    #[error("{0}")]
    InvalidArg(String),
    #[error("I/O error on {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("the download was aborted")]
    Aborted,
    #[error("internal error: {0}")]
    Internal(String),
}

impl HubError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            HubError::NotFound(_) => "ERR_MODEL_NOT_FOUND",
            HubError::Network(_) => "ERR_NETWORK",
            HubError::AuthRequired(_) => "ERR_AUTH_REQUIRED",
            HubError::ChecksumMismatch(_) => "ERR_CHECKSUM_MISMATCH",
            HubError::DiskFull(_) => "ERR_DISK_FULL",
            HubError::GgufInvalid(_) => "ERR_GGUF_INVALID",
            HubError::InvalidArg(_) => "ERR_INVALID_ARG",
            HubError::Io { source, .. } if is_disk_full(source) => "ERR_DISK_FULL",
            HubError::Io { .. } => "ERR_IO",
            HubError::Aborted => "ABORT_ERR",
            HubError::Internal(_) => "ERR_INTERNAL",
        }
    }

    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        HubError::Io { path: path.into(), source }
    }

    /// Errors after which trying another source makes sense.
    pub fn is_source_failure(&self) -> bool {
        !matches!(self, HubError::Aborted | HubError::InvalidArg(_) | HubError::DiskFull(_)) && self.code() != "ERR_DISK_FULL"
    }
}

fn is_disk_full(e: &std::io::Error) -> bool {
    // ENOSPC (28) / EDQUOT (122 on Linux, 69 on macOS); ERROR_DISK_FULL (112) on Windows.
    matches!(e.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded) || matches!(e.raw_os_error(), Some(28))
}

/// Extension to attach a path to I/O errors.
pub(crate) trait IoCtx<T> {
    fn at(self, path: &std::path::Path) -> Result<T>;
}

impl<T> IoCtx<T> for std::io::Result<T> {
    fn at(self, path: &std::path::Path) -> Result<T> {
        self.map_err(|e| HubError::io(path, e))
    }
}
