//! The one way the binding runs work off the JS thread: on tokio's blocking pool (never the
//! JS thread, never libuv's pool, which fs/dns/zlib need), with panics caught, settling a
//! promise on the JS thread. Loads, downloads, embedding and routing go through it; generation
//! runs on the engine's own thread instead.

use napi::bindgen_prelude::{PromiseRaw, ToNapiValue};
use napi::Env;

use crate::error::{guard, CodedError, Res};

/// Runs `work(args)` on the blocking pool; the promise resolves with `map(env, value)` (built on
/// the JS thread) or rejects with the coded error. `args` is what the caller validated on the
/// JS thread: its error rejects the promise without running anything.
pub fn spawn<'env, P, T, V>(
  env: &'env Env,
  args: Res<P>,
  work: impl FnOnce(P) -> Res<T> + Send + 'static,
  map: impl FnOnce(&Env, T) -> Res<V> + 'static,
) -> napi::Result<PromiseRaw<'env, V>>
where
  P: Send + 'static,
  T: Send + 'static,
  V: ToNapiValue,
{
  let fut = async move {
    let args = args?;
    tokio::task::spawn_blocking(move || guard(|| work(args))).await.unwrap_or_else(|e| Err(CodedError::internal(format!("worker stopped: {e}"))))
  };
  env.spawn_future_with_callback(async move { Ok(fut.await) }, move |env, r: Res<T>| r.and_then(|v| guard(|| map(env, v))).map_err(|e| e.into_napi(env)))
}
