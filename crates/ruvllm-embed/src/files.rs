//! Per-user directories and atomic file writes, for the router (which depends on this crate) to
//! save its state.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A non-empty environment variable as a path.
pub fn env_path(k: &str) -> Option<PathBuf> {
    std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// A per-user base directory: `$<xdg>`, else `$HOME/<home_dir>` (`$USERPROFILE/<home_dir>` on
/// systems without HOME), with `ruvllm/` appended.
pub fn user_dir(xdg: &str, home_dir: &str) -> Option<PathBuf> {
    env_path(xdg).or_else(|| env_path("HOME").or_else(|| env_path("USERPROFILE")).map(|h| h.join(home_dir))).map(|b| b.join("ruvllm"))
}

/// Writes `bytes` to `path` atomically: a temp file in the same directory, fsync, rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| Error::io("creating directory", dir, e))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "router".into());
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let tmp = dir.join(format!(".{name}.{}.{nanos}.tmp", std::process::id()));
    let res = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(|e| Error::io("creating", &tmp, e))?;
        f.write_all(bytes).map_err(|e| Error::io("writing", &tmp, e))?;
        f.sync_all().map_err(|e| Error::io("syncing", &tmp, e))?;
        drop(f);
        std::fs::rename(&tmp, path).map_err(|e| Error::io("renaming into", path, e))
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}
