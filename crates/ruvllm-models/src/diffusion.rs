//! Masked-diffusion models: a base GGUF plus conversion adapters, described by a
//! `manifest.json` beside the adapter files:
//!
//! ```json
//! { "base": "gemma-3-270m", "base_sha256": "…", "mask_token_id": 4, "shift": true,
//!   "adapters": [{ "file": "talora-t0.gguf", "t_min": 0, "t_max": 0.3, "sha256": "…" }, …] }
//! ```
//!
//! The known diffusion ids (`gemma-3-270m-diffusion`) have their manifests in this crate's
//! `data/diffusion/<id>/` (`$RUVLLM_DIFFUSION_DIR/<id>/` overrides it), so a clone loads them
//! offline; the base model comes through the model manager like any other id.

use std::path::{Path, PathBuf};

use crate::{sha256_file, HubError, Result};

/// Ids of the diffusion models this build knows.
pub const KNOWN: &[&str] = &["gemma-3-270m-diffusion"];

/// A diffusion model's base and adapters, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct DiffusionManifest {
    /// The base model: a registry id or a path.
    pub base: String,
    /// The base GGUF's sha256, when the manifest gives it.
    pub base_sha256: Option<String>,
    /// The adapter files, in the manifest's order.
    pub adapters: Vec<PathBuf>,
}

/// Where the known diffusion models' folders are.
pub fn data_dir() -> PathBuf {
    match std::env::var_os("RUVLLM_DIFFUSION_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("data").join("diffusion"),
    }
}

/// The manifest of a known diffusion id, `None` for any other string.
pub fn known_manifest(id: &str) -> Option<PathBuf> {
    KNOWN.contains(&id).then(|| data_dir().join(id).join("manifest.json"))
}

/// Reads a manifest and checks that each adapter file exists and hashes to its `sha256`.
/// Problems are `ERR_MODEL_NOT_FOUND` (a missing file), `ERR_CHECKSUM_MISMATCH` or
/// `ERR_INVALID_ARG` (a malformed manifest).
pub fn read_manifest(path: &Path) -> Result<DiffusionManifest> {
    let text = std::fs::read_to_string(path).map_err(|e| HubError::NotFound(format!("cannot read the diffusion manifest {}: {e}", path.display())))?;
    let bad = |m: String| HubError::InvalidArg(format!("diffusion manifest {}: {m}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let base = v.get("base").and_then(|b| b.as_str()).filter(|s| !s.is_empty()).ok_or_else(|| bad("no \"base\" string".into()))?.to_string();
    let base_sha256 = v.get("base_sha256").and_then(|s| s.as_str()).map(str::to_string);
    let list = v.get("adapters").and_then(|a| a.as_array()).filter(|a| !a.is_empty()).ok_or_else(|| bad("no \"adapters\" list".into()))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut adapters = Vec::with_capacity(list.len());
    for (i, a) in list.iter().enumerate() {
        let file = a.get("file").and_then(|f| f.as_str()).ok_or_else(|| bad(format!("adapters[{i}] has no \"file\"")))?;
        if file.contains("..") || Path::new(file).is_absolute() {
            return Err(bad(format!("adapters[{i}].file must name a file beside the manifest, got {file:?}")));
        }
        let p = dir.join(file);
        if !p.is_file() {
            return Err(HubError::NotFound(format!("the diffusion adapter {} named by {} is missing", p.display(), path.display())));
        }
        if let Some(want) = a.get("sha256").and_then(|s| s.as_str()) {
            let got = sha256_file(&p)?;
            if !got.eq_ignore_ascii_case(want) {
                return Err(HubError::ChecksumMismatch(format!("{} has sha256 {got}, the manifest says {want}", p.display())));
            }
        }
        adapters.push(p);
    }
    Ok(DiffusionManifest { base, base_sha256, adapters })
}

/// The adapter files of `LLM.load(path, { diffusion: { adapter } })`: each entry a manifest
/// (its adapters) or an adapter file.
pub fn adapter_files(entries: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in entries {
        if p.extension().is_some_and(|x| x == "json") {
            out.extend(read_manifest(p)?.adapters);
        } else if p.is_file() {
            out.push(p.clone());
        } else {
            return Err(HubError::NotFound(format!("no diffusion adapter at {}", p.display())));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_checks_files_and_hashes() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.gguf");
        std::fs::write(&a, b"adapter bytes").unwrap();
        let sha = sha256_file(&a).unwrap();
        let m = dir.path().join("manifest.json");
        let write = |json: &str| std::fs::write(&m, json).unwrap();
        write(&format!(r#"{{"base":"gemma-3-270m","adapters":[{{"file":"a.gguf","sha256":"{sha}"}}]}}"#));
        let got = read_manifest(&m).unwrap();
        assert_eq!((got.base.as_str(), got.adapters.len()), ("gemma-3-270m", 1));
        assert_eq!(adapter_files(std::slice::from_ref(&m)).unwrap(), vec![a.clone()]);
        write(r#"{"base":"gemma-3-270m","adapters":[{"file":"a.gguf","sha256":"00"}]}"#);
        assert_eq!(read_manifest(&m).unwrap_err().code(), "ERR_CHECKSUM_MISMATCH");
        write(r#"{"base":"gemma-3-270m","adapters":[{"file":"b.gguf"}]}"#);
        assert_eq!(read_manifest(&m).unwrap_err().code(), "ERR_MODEL_NOT_FOUND");
        write(r#"{"base":"gemma-3-270m","adapters":[{"file":"../a.gguf"}]}"#);
        assert_eq!(read_manifest(&m).unwrap_err().code(), "ERR_INVALID_ARG");
        write(r#"{"adapters":[]}"#);
        assert_eq!(read_manifest(&m).unwrap_err().code(), "ERR_INVALID_ARG");
        write("not json");
        assert_eq!(read_manifest(&m).unwrap_err().code(), "ERR_INVALID_ARG");
        assert!(known_manifest("gemma-3-270m-diffusion").is_some() && known_manifest("gemma-3-270m").is_none());
    }
}
