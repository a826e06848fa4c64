//! AbortSignal glue. napi's own `AbortSignal` only cancels queued async work, ignores an
//! already-aborted signal and overwrites `signal.onabort` (napi.md pitfall 5), so we do what a JS
//! library would: read `signal.aborted` up front, `addEventListener('abort', ...)` a listener
//! that sets the request's cancel flag, and remove the listener when the request ends (from any
//! thread, through a weak threadsafe function), so that a long-lived signal shared by many
//! requests does not collect listeners.

use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use napi::bindgen_prelude::{FromNapiValue, Function, ToNapiValue};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode, UnknownReturnValue};
use napi::{sys, Env, Status};
use tokio::sync::Notify;

use crate::error::{CodedError, Res};
use crate::options::Val;

/// Cancellation state of one request, shared by the engine (the flag, which closing the engine
/// sets too), the abort listener and the task awaiting the request's events.
#[derive(Default)]
pub struct CancelState {
  /// The engine's cancel flag: checked before prefill and every token.
  pub flag: Arc<AtomicBool>,
  /// Set when the cancel came from the user's AbortSignal (the request then rejects with AbortError).
  by_signal: AtomicBool,
  /// Wakes the awaiting task at once, even while the engine is busy with other requests.
  pub notify: Notify,
}

impl CancelState {
  /// Stops the request (any reason).
  pub fn cancel(&self) {
    self.flag.store(true, Ordering::SeqCst);
  }

  /// Stops the request because its AbortSignal fired.
  pub fn abort(&self) {
    self.by_signal.store(true, Ordering::SeqCst);
    self.cancel();
    self.notify.notify_one();
  }

  pub fn aborted(&self) -> bool {
    self.by_signal.load(Ordering::SeqCst)
  }
}

type Remover = ThreadsafeFunction<(), UnknownReturnValue, (), Status, false, true>;

/// A registered abort listener. `detach` removes it; it may be called from any thread, more than once.
pub struct SignalHook {
  remover: Option<Remover>,
}

impl SignalHook {
  pub fn detach(&mut self) {
    if let Some(r) = self.remover.take() {
      let _ = r.call((), ThreadsafeFunctionCallMode::NonBlocking);
    }
  }
}

impl Drop for SignalHook {
  fn drop(&mut self) {
    self.detach();
  }
}

fn call(env: sys::napi_env, this: sys::napi_value, f: sys::napi_value, args: &[sys::napi_value]) -> Res<sys::napi_value> {
  let mut out = ptr::null_mut();
  // SAFETY: `env` and the values are the live napi_env and handles of the current call on the
  // JS thread (a `Val` never outlives the call it was read in); out-pointers are locals.
  let status = unsafe { sys::napi_call_function(env, this, f, args.len(), args.as_ptr(), &mut out) };
  if status != sys::Status::napi_ok {
    let mut pending = false;
    // SAFETY: `env` and the values are the live napi_env and handles of the current call on the
    // JS thread (a `Val` never outlives the call it was read in); out-pointers are locals.
    unsafe { sys::napi_is_exception_pending(env, &mut pending) };
    if pending {
      let mut e = ptr::null_mut();
      // SAFETY: `env` and the values are the live napi_env and handles of the current call on the
      // JS thread (a `Val` never outlives the call it was read in); out-pointers are locals.
      unsafe { sys::napi_get_and_clear_last_exception(env, &mut e) };
    }
    return Err(CodedError::invalid_type("signal must be an AbortSignal (its addEventListener/removeEventListener failed)"));
  }
  Ok(out)
}

/// Wires `signal` to `state`. An already-aborted signal is an `AbortError` right away.
pub fn attach(env: &Env, signal: Val, state: Arc<CancelState>) -> Res<SignalHook> {
  if signal.prop("aborted")?.get::<bool>()? {
    return Err(CodedError::aborted(None));
  }
  let raw_env = env.raw();
  let listener_state = state.clone();
  let listener: Function<(), ()> = env.create_function_from_closure("ruvllmAbortListener", move |_ctx| {
    listener_state.abort();
    Ok(())
  })?;
  // SAFETY: `raw_env` is this call's env, on the JS thread; the values are created here.
  let listener_raw = unsafe { ToNapiValue::to_napi_value(raw_env, listener) }?;
  let abort_str = unsafe { ToNapiValue::to_napi_value(raw_env, "abort") }?;
  let mut once = napi::bindgen_prelude::Object::new(env)?;
  once.set("once", true)?;
  // SAFETY: as above.
  let once_raw = unsafe { ToNapiValue::to_napi_value(raw_env, once) }?;

  let add = signal.prop("addEventListener")?;
  call(raw_env, signal.raw, add.raw, &[abort_str, listener_raw, once_raw])?;

  // remover = signal.removeEventListener.bind(signal, 'abort', listener)
  let remove = signal.prop("removeEventListener")?;
  let bind = remove.prop("bind")?;
  let bound = call(raw_env, remove.raw, bind.raw, &[signal.raw, abort_str, listener_raw])?;
  // SAFETY: a napi value of the current call on the JS thread; `from_napi_value` checks its type
  // and returns an error for anything else.
  let remover = unsafe { Remover::from_napi_value(raw_env, bound) }?;
  Ok(SignalHook { remover: Some(remover) })
}
