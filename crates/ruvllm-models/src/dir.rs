//! Directory models: a model that is a folder of files (the sentence embedder's
//! `model.safetensors`, `tokenizer.json`, `config.json`) rather than one GGUF. The files live in
//! the same Hugging Face layout as GGUF downloads (`blobs/<etag or sha256>`, with
//! `snapshots/<commit>/<file>` or `snapshots/ruvllm-pypi/<file>` linking to them), so a copy
//! made by `huggingface_hub` is found too. Every file is pinned by SHA-256 in the registry and
//! checked whichever source it comes from; a file is renamed into `blobs/` only after its check,
//! so an interrupted download keeps what was verified and resumes the rest.

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::error::{HubError, Result};
use crate::registry::{DirFile, KnownDir};
use crate::{hub, pypi, Cached, DownloadOptions, Downloaded, Hooks, ModelRef};

/// One file of the model as a Hub file reference at `revision`, pinned.
pub(crate) fn file_ref(m: &KnownDir, f: &DirFile, revision: &str) -> ModelRef {
    ModelRef {
        id: m.id.to_string(),
        repo: m.repo.to_string(),
        file: f.path.to_string(),
        revision: revision.to_string(),
        sha256: Some(f.sha256.to_string()),
        known: None,
    }
}

/// Whether `dir` holds every file of `m` at its pinned size (no hashing: this runs on every
/// embedder start; `verify` hashes).
fn complete(m: &KnownDir, dir: &Path) -> bool {
    m.files.iter().all(|f| std::fs::metadata(dir.join(f.path)).is_ok_and(|md| md.is_file() && md.len() == f.size))
}

/// The cached copy of `m`: a snapshot folder holding all its files (a Hub snapshot first, then
/// the PyPI one). No network.
pub fn cached(cfg: &Config, m: &KnownDir) -> Option<Cached> {
    let snaps = hub::repo_dir(cfg, m.repo).join("snapshots");
    let mut found: Vec<(String, PathBuf)> = std::fs::read_dir(&snaps)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .filter(|(_, p)| complete(m, p))
        .collect();
    found.sort_by_key(|(name, _)| (name == pypi::PYPI_SNAPSHOT, name.clone()));
    found.into_iter().next().map(|(name, path)| Cached { path, origin: if name == pypi::PYPI_SNAPSHOT { "pypi" } else { "hub" }, size: m.size() })
}

/// Downloads `m` into the cache (a no-op when it is there) from the source `opts.source` names.
pub fn download(cfg: &Config, m: &KnownDir, opts: &DownloadOptions) -> Result<Downloaded> {
    let hooks = &opts.hooks;
    hooks.check()?;
    let done = |path: PathBuf, source: &'static str| Downloaded { id: m.id.to_string(), path, source, size: m.size() };
    if let Some(c) = cached(cfg, m) {
        return Ok(done(c.path, "cache"));
    }
    if cfg.offline {
        return Err(crate::offline_error(cfg, m.id));
    }
    let from_pypi = m.pypi.as_ref().map(|src| move || pypi::download_dir(cfg, m, src, hooks));
    let (path, source) = crate::fetch_from_sources(cfg, m.id, opts.source, hooks, || download_hub(cfg, m, hooks), from_pypi)?;
    Ok(done(path, source))
}

/// Each file from the Hub; the first one's snapshot names the commit the others are taken from,
/// so all of them come from one commit even if the branch moves meanwhile.
fn download_hub(cfg: &Config, m: &KnownDir, hooks: &Hooks) -> Result<PathBuf> {
    let snaps = hub::repo_dir(cfg, m.repo).join("snapshots");
    let mut revision = m.revision.to_string();
    for (i, f) in m.files.iter().enumerate() {
        let pointer = hub::download(cfg, &file_ref(m, f, &revision), hooks)?;
        if i == 0 {
            revision = pointer
                .strip_prefix(&snaps)
                .ok()
                .and_then(|rel| rel.components().next())
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .ok_or_else(|| HubError::Internal(format!("{} is not in {}", pointer.display(), snaps.display())))?;
        }
    }
    Ok(snaps.join(revision))
}

/// Removes `m`'s files from the cache (every snapshot's links, their blobs, unfinished downloads,
/// its staged wheel); returns the paths removed. Nothing there is `ERR_MODEL_NOT_FOUND`.
pub fn delete(cfg: &Config, m: &KnownDir) -> Result<Vec<PathBuf>> {
    let packages: Vec<&str> = m.pypi.iter().map(|w| w.package).collect();
    let removed = crate::remove_from_repo(&hub::repo_dir(cfg, m.repo), snapshot_files(cfg, m), &cfg.state_dir.join("pypi"), &packages)?;
    if removed.is_empty() {
        return Err(HubError::NotFound(format!("model '{}' is not in the cache {}", m.id, cfg.cache_dir.display())));
    }
    Ok(removed)
}

/// The model's snapshot files (every snapshot), for `delete`.
fn snapshot_files(cfg: &Config, m: &KnownDir) -> Vec<PathBuf> {
    let snaps = hub::repo_dir(cfg, m.repo).join("snapshots");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&snaps).into_iter().flatten().flatten() {
        for f in m.files {
            let p = e.path().join(f.path);
            if std::fs::symlink_metadata(&p).is_ok() {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Hashes every file of the cached copy against its pin. Returns the folder and the bytes
/// checked; a missing model is `ERR_MODEL_NOT_FOUND`, a file that does not match is
/// `ERR_CHECKSUM_MISMATCH` naming each bad file.
pub fn verify(cfg: &Config, m: &KnownDir, hooks: &Hooks) -> Result<(PathBuf, u64)> {
    let c = cached(cfg, m).ok_or_else(|| not_downloaded(cfg, m.id))?;
    let mut bad = Vec::new();
    for f in m.files {
        let p = c.path.join(f.path);
        let got = crate::http::sha256_file_with(&p, hooks)?;
        if !got.eq_ignore_ascii_case(f.sha256) {
            bad.push(format!("{} has SHA-256 {got}, expected {}", p.display(), f.sha256));
        }
    }
    if bad.is_empty() {
        Ok((c.path, m.size()))
    } else {
        Err(HubError::ChecksumMismatch(format!("{}: {}; remove it with `npx ruvllm models delete {}` and download it again", m.id, bad.join("; "), m.id)))
    }
}

pub(crate) fn not_downloaded(cfg: &Config, id: &str) -> HubError {
    HubError::NotFound(format!("model '{id}' is not downloaded (looked in {}); download it with `npx ruvllm models download {id}`", cfg.cache_dir.display()))
}
