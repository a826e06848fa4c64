//! `createServer`: the OpenAI- and Ollama-compatible HTTP server of `ruvllm-server` over an `LLM` (shared
//! with the caller) or a model loaded for the server alone (closed with it). The server runs
//! on its own tokio runtime; loading, starting and closing run on the blocking pool, so the JS
//! thread only validates and awaits.

use std::path::Path;
use std::sync::{Arc, Mutex};

use napi::bindgen_prelude::{ClassInstance, FromNapiValue, Function, PromiseRaw, Unknown};
use napi::threadsafe_function::ThreadsafeFunction;
use napi::{Env, Status, ValueType};
use napi_derive::napi;

use ruvllm_core::engine::Engine;

use crate::error::{guard, CodedError};
use crate::models::JsOpts;
use crate::options::{self, Val};
use crate::task::spawn;

/// A running OpenAI- and Ollama-compatible server (from `createServer`). `close()` stops it.
#[napi]
pub struct Server {
  url: String,
  port: u32,
  /// `None` once closed.
  inner: Arc<Mutex<Option<ruvllm_server::Server>>>,
  /// The model loaded for this server alone (a path or id was given), closed with it.
  owned: Option<Arc<Engine>>,
  /// Keeps Node's event loop alive while the server listens (its sockets are not libuv
  /// handles), as a listening `net.Server` does; released by `close()`.
  keep_alive: Mutex<Option<KeepAlive>>,
}

type KeepAlive = ThreadsafeFunction<(), (), (), Status, false>;

/// Where the model comes from.
enum Source {
  Shared(Arc<Engine>, String),
  Load(String, ruvllm_core::engine::LoadOptions, JsOpts),
}

/// The name a model file is served under: its file name without `.gguf`.
fn file_stem(path: &str) -> String {
  Path::new(path).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| path.to_string())
}

/// Starts an HTTP server for `model` with OpenAI's endpoints (`/v1/chat/completions`,
/// `/v1/completions`, `/v1/embeddings`, `/v1/models`), Ollama's (`/api/generate`, `/api/chat`,
/// `/api/embed`, `/api/tags`, `/api/show`, `/api/version`), llama-server's `/tokenize` and
/// `/detokenize`, `/health` and `/metrics` (Prometheus). `cors` (`'*'` or comma-separated
/// origins) turns CORS on. `model` is an `LLM` (which stays the caller's
/// to close), or a path or model id loaded as `LLM.load` does (with `load` options) and closed
/// with the server. Binds `host` (default `127.0.0.1`) and `port` (default 8080; 0 picks a free
/// one). Resolves once it listens. Rejects with `ERR_INVALID_ARG`, `ERR_ADDR_IN_USE`, `ERR_IO`
/// or a load error.
#[napi(ts_args_type = "options: ServerOptions", ts_return_type = "Promise<Server>")]
pub fn create_server<'env>(env: &'env Env, options: Unknown) -> napi::Result<PromiseRaw<'env, Server>> {
  let parsed = guard(|| {
    let args = options::server_options(Some(Val::new(env, &options)))?;
    let source = if args.model.ty()? == ValueType::Object {
      // SAFETY: a napi value of the current call on the JS thread; `from_napi_value` checks its
      // type and returns an error for anything else.
      let llm = unsafe { ClassInstance::<crate::llm::Llm>::from_napi_value(args.model.env, args.model.raw) }
        .map_err(|_| CodedError::invalid_type("model must be an LLM (from LLM.load), a path to a .gguf or a model id"))?;
      let (engine, info) = llm.engine_and_info()?;
      let name = args.name.clone().unwrap_or_else(|| if info.name.is_empty() { file_stem(&info.path) } else { info.name.clone() });
      Source::Shared(engine, name)
    } else {
      let id = options::path_or_id(Some(args.model))?;
      let mut load = options::load_options(args.load)?;
      // The engine decodes as many requests together as the server hands it, unless `load` says.
      load.parallel = load.parallel.or(Some(args.opts.parallel.min(ruvllm_core::engine::MAX_PARALLEL)));
      let fetch = JsOpts::new(env, options::load_fetch_options(args.load)?)?;
      Source::Load(id, load, fetch)
    };
    Ok((source, args.opts, args.name))
  });
  spawn(
    env,
    parsed,
    |(source, mut opts, name)| {
      let (engine, owned) = match source {
        Source::Shared(engine, model_id) => {
          opts.model_id = model_id;
          (engine, false)
        }
        Source::Load(id, load, fetch) => {
          let path = fetch.resolve(&id)?;
          drop(fetch);
          opts.model_id = name.unwrap_or_else(|| if path.to_string_lossy() == id { file_stem(&id) } else { id.clone() });
          (Arc::new(Engine::load(&path, load)?), true)
        }
      };
      match ruvllm_server::Server::start(engine.clone(), opts) {
        Ok(s) => Ok((s, owned.then_some(engine))),
        Err(e) => {
          if owned {
            engine.close();
          }
          Err(e.into())
        }
      }
    },
    |env, (server, owned)| {
      let addr = server.local_addr();
      let noop: Function<(), ()> = env.create_function_from_closure("ruvllmServerKeepAlive", |_| Ok(()))?;
      let keep_alive: KeepAlive = noop.build_threadsafe_function().build()?;
      Ok(Server {
        url: format!("http://{addr}"),
        port: u32::from(addr.port()),
        inner: Arc::new(Mutex::new(Some(server))),
        owned,
        keep_alive: Mutex::new(Some(keep_alive)),
      })
    },
  )
}

/// A server dropped without `close()` (its JS object collected) closes on a thread of its own:
/// closing waits for connections, which must not stall the JS thread running the finalizer.
impl Drop for Server {
  fn drop(&mut self) {
    if let Some(server) = self.inner.lock().unwrap_or_else(|e| e.into_inner()).take() {
      let owned = self.owned.take();
      let _ = std::thread::Builder::new().name("ruvllm-server-close".into()).spawn(move || {
        drop(server);
        if let Some(engine) = owned {
          engine.close();
        }
      });
    }
  }
}

#[napi]
impl Server {
  /// The base URL, e.g. `http://127.0.0.1:8080` (an OpenAI client's `baseURL` is this + `/v1`).
  #[napi(getter)]
  pub fn url(&self) -> String {
    self.url.clone()
  }

  /// The port it listens on (the one picked when 0 was asked).
  #[napi(getter)]
  pub fn port(&self) -> u32 {
    self.port
  }

  /// Stops accepting connections, cancels running and queued requests (their clients get an
  /// error) and resolves when the server has stopped; a model the server loaded is closed too.
  /// Safe to call more than once.
  #[napi(ts_return_type = "Promise<void>")]
  pub fn close<'env>(&self, env: &'env Env) -> napi::Result<PromiseRaw<'env, ()>> {
    let (inner, owned) = (self.inner.clone(), self.owned.clone());
    drop(self.keep_alive.lock().unwrap_or_else(|e| e.into_inner()).take());
    spawn(
      env,
      Ok(()),
      move |()| {
        let server = inner.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut s) = server {
          s.close();
        }
        if let Some(engine) = owned {
          engine.close();
        }
        Ok(())
      },
      |_, ()| Ok(()),
    )
  }
}
