//! The Hugging Face Hub source: `HEAD {endpoint}/{repo}/resolve/{revision}/{file}` for the
//! commit, ETag and size, then a verified download into the hf-hub cache layout
//! (`blobs/<etag>`, `snapshots/<commit>/<file>` → relative symlink, `refs/<revision>`).

use std::path::{Path, PathBuf};

use hf_hub::{Cache, Repo, RepoType};

use crate::config::Config;
use crate::error::{HubError, IoCtx, Result};
use crate::http::{self, Fetch, Hooks, Meter, StatusContext};
use crate::ModelRef;

/// What the Hub says about one file.
#[derive(Debug, Clone)]
pub struct HubMeta {
    pub commit: String,
    pub etag: String,
    pub size: u64,
    /// Where to GET the bytes (the resolve URL, or the CDN location it redirects to).
    pub download_url: String,
    /// Whether `download_url` is on the endpoint's host (then the token is sent).
    pub same_host: bool,
}

pub(crate) fn encode_path(p: &str) -> String {
    p.split('/').map(encode_segment).collect::<Vec<_>>().join("/")
}

fn encode_segment(s: &str) -> String {
    let mut o = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => o.push(b as char),
            _ => o.push_str(&format!("%{b:02X}")),
        }
    }
    o
}

pub fn resolve_url(cfg: &Config, m: &ModelRef) -> String {
    format!("{}/{}/resolve/{}/{}", cfg.endpoint, m.repo, encode_segment(&m.revision), encode_path(&m.file))
}

pub(crate) fn auth_hint(cfg: &Config) -> String {
    if cfg.token.is_some() {
        "the token in HF_TOKEN does not grant access to it (check the token's permissions)".to_string()
    } else {
        "set HF_TOKEN to a Hugging Face access token (https://huggingface.co/settings/tokens)".to_string()
    }
}

fn header(resp: &ureq::http::Response<ureq::Body>, name: &str) -> Option<String> {
    resp.headers().get(name).and_then(|v| v.to_str().ok()).map(|s| s.trim().to_string())
}

fn clean_etag(e: &str) -> String {
    e.trim().trim_start_matches("W/").trim_matches('"').to_string()
}

/// HEAD the resolve URL without following redirects to other hosts (as huggingface_hub does).
pub fn metadata(cfg: &Config, m: &ModelRef) -> Result<HubMeta> {
    let agent = http::agent(false);
    let mut url = resolve_url(cfg, m);
    let what = format!("{}/{} (revision {})", m.repo, m.file, m.revision);
    for _ in 0..5 {
        let mut req = agent.head(&url).header("Accept-Encoding", "identity");
        if let Some(t) = &cfg.token {
            req = req.header("Authorization", &format!("Bearer {t}"));
        }
        let resp = req.call().map_err(|e| HubError::Network(format!("could not reach the Hugging Face Hub at {} ({e})", http::origin(&url))))?;
        let status = resp.status().as_u16();
        let hint = auth_hint(cfg);
        let ctx = StatusContext { what: &what, url: &url, auth_hint: &hint };
        if (300..400).contains(&status) {
            let loc = header(&resp, "location").ok_or_else(|| HubError::Network(format!("{what}: redirect without Location from {url}")))?;
            if loc.starts_with('/') {
                // Renamed repo: same host, follow.
                url = format!("{}{}", http::origin(&url), loc);
                continue;
            }
            // Redirect to a CDN: the metadata is on this response.
            return meta_from(&resp, status, &what, &url, Some(loc));
        }
        if status == 200 || status == 206 {
            return meta_from(&resp, status, &what, &url, None);
        }
        let xec = header(&resp, "x-error-code");
        return Err(http::status_error(status, xec.as_deref(), &ctx));
    }
    Err(HubError::Network(format!("{what}: too many redirects from {}", cfg.endpoint)))
}

fn meta_from(resp: &ureq::http::Response<ureq::Body>, _status: u16, what: &str, url: &str, location: Option<String>) -> Result<HubMeta> {
    let etag = header(resp, "x-linked-etag")
        .or_else(|| header(resp, "etag"))
        .map(|e| clean_etag(&e))
        .filter(|e| !e.is_empty())
        .ok_or_else(|| HubError::Network(format!("{what}: {} sent no ETag; is HF_ENDPOINT a Hugging Face Hub (or a mirror of one)?", http::origin(url))))?;
    let size = header(resp, "x-linked-size")
        .or_else(|| if location.is_none() { header(resp, "content-length") } else { None })
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| HubError::Network(format!("{what}: {} sent no file size", http::origin(url))))?;
    let commit = header(resp, "x-repo-commit").unwrap_or_default();
    let (download_url, same_host) = match location {
        Some(l) => {
            let same = http::origin(&l) == http::origin(url);
            (l, same)
        }
        None => (url.to_string(), true),
    };
    Ok(HubMeta { commit, etag, size, download_url, same_host })
}

pub(crate) fn cache_repo(cfg: &Config, m: &ModelRef) -> hf_hub::CacheRepo {
    Cache::new(cfg.cache_dir.clone()).repo(Repo::with_revision(m.repo.clone(), RepoType::Model, m.revision.clone()))
}

pub(crate) fn repo_dir(cfg: &Config, repo: &str) -> PathBuf {
    cfg.cache_dir.join(Repo::new(repo.to_string(), RepoType::Model).folder_name())
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Downloads one Hub file into the cache; returns the snapshot path.
pub fn download(cfg: &Config, m: &ModelRef, hooks: &Hooks) -> Result<PathBuf> {
    let meta = metadata(cfg, m)?;
    // What the bytes must hash to: the registry's pin, else the LFS SHA-256 (= the LFS ETag).
    let expected = match (&m.sha256, is_sha256(&meta.etag)) {
        (Some(pin), true) if !pin.eq_ignore_ascii_case(&meta.etag) => {
            return Err(HubError::ChecksumMismatch(format!(
                "{}/{}: the Hub now serves a file with SHA-256 {} but the registry expects {pin}; not downloading it",
                m.repo, m.file, meta.etag
            )));
        }
        (Some(pin), _) => Some(pin.to_ascii_lowercase()),
        (None, true) => Some(meta.etag.to_ascii_lowercase()),
        (None, false) => {
            hooks.notice(&format!("{}/{}: no SHA-256 known for this file (not an LFS file); checking its size only", m.repo, m.file));
            None
        }
    };
    let crepo = cache_repo(cfg, m);
    let blob = crepo.blob_path(&meta.etag);
    let commit = if meta.commit.is_empty() { m.revision.clone() } else { meta.commit.clone() };
    let what = format!("{}/{}", m.repo, m.file);
    let hint = auth_hint(cfg);
    let mut headers = Vec::new();
    if meta.same_host {
        if let Some(t) = &cfg.token {
            headers.push(("Authorization", format!("Bearer {t}")));
        }
    }
    let fetch = Fetch {
        url: &meta.download_url,
        headers,
        dest: &blob,
        size: meta.size,
        sha256: expected.as_deref(),
        ctx: StatusContext { what: &what, url: &meta.download_url, auth_hint: &hint },
        retries: cfg.retries,
        free_margin: cfg.free_margin,
    };
    let mut meter = Meter::new("hub", &m.file, meta.size);
    if let Err(e) = http::fetch_verified(&fetch, &mut meter, 0, hooks) {
        crate::prune_empty(&repo_dir(cfg, &m.repo));
        return Err(e);
    }
    meter.base.phase = "done";
    meter.update(hooks, meta.size, true);
    let pointer = link_snapshot(cfg, m, &commit, &blob)?;
    if commit != m.revision {
        crepo.create_ref(&commit).at(&cfg.cache_dir)?;
    }
    Ok(pointer)
}

/// `snapshots/<commit>/<file>` → `../../blobs/<name>` (relative, as huggingface_hub makes it).
pub(crate) fn link_snapshot(cfg: &Config, m: &ModelRef, commit: &str, blob: &Path) -> Result<PathBuf> {
    let crepo = cache_repo(cfg, m);
    let mut pointer = crepo.pointer_path(commit);
    pointer.push(&m.file);
    let parent = pointer.parent().ok_or_else(|| HubError::Internal("snapshot path has no parent".into()))?;
    std::fs::create_dir_all(parent).at(parent)?;
    if std::fs::symlink_metadata(&pointer).is_ok() {
        if std::fs::canonicalize(&pointer).ok() == std::fs::canonicalize(blob).ok() {
            return Ok(pointer);
        }
        std::fs::remove_file(&pointer).at(&pointer)?;
    }
    let depth = m.file.matches('/').count() + 2;
    let mut rel = PathBuf::new();
    for _ in 0..depth {
        rel.push("..");
    }
    rel.push("blobs");
    rel.push(blob.file_name().unwrap_or_default());
    let tmp = http::with_suffix(&pointer, &format!(".tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    #[cfg(unix)]
    let linked = std::os::unix::fs::symlink(&rel, &tmp);
    #[cfg(windows)]
    let linked = std::os::windows::fs::symlink_file(&rel, &tmp);
    #[cfg(not(any(unix, windows)))]
    let linked: std::io::Result<()> = Err(std::io::Error::other("no symlinks"));
    match linked {
        Ok(()) => std::fs::rename(&tmp, &pointer).at(&pointer)?,
        Err(_) => {
            // No symlinks (Windows without developer mode): hard link, else copy.
            if std::fs::hard_link(blob, &pointer).is_err() {
                std::fs::copy(blob, &tmp).at(&tmp)?;
                std::fs::rename(&tmp, &pointer).at(&pointer)?;
            }
        }
    }
    Ok(pointer)
}
