//! The one place where errors become JavaScript errors.
//!
//! Every error that reaches JavaScript is an `Error` (or `TypeError` / `RangeError` for bad
//! arguments) with a stable `code` property; `ABORT_ERR` errors are named `AbortError`, as the
//! DOM's `AbortSignal` errors are. Each crate's error enum converts here (`From`, so call sites
//! use `?`) keeping its own `code()`, and the JS class follows from the code alone: the same
//! code is the same class whichever crate or method it comes from. A panic anywhere becomes
//! `ERR_INTERNAL`. `CodedError` is plain data (`Send`), so it can be made on any thread; it
//! turns into a JS object only on the JS thread (`into_napi`), where the `Env` is.

use std::panic::{catch_unwind, AssertUnwindSafe};

use napi::bindgen_prelude::{JsObjectValue, Object, ToNapiValue, Unknown};
use napi::{sys, Env, JsError, JsRangeError, JsTypeError};

pub const ERR_INVALID_ARG: &str = "ERR_INVALID_ARG";
pub const ERR_CLOSED: &str = "ERR_CLOSED";
pub const ERR_INTERNAL: &str = "ERR_INTERNAL";
pub const ABORT_ERR: &str = "ABORT_ERR";

/// Which JS constructor the error gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
  Error,
  /// A value of the wrong type (still `code: 'ERR_INVALID_ARG'`).
  TypeError,
  /// A value of the right type outside its range (still `code: 'ERR_INVALID_ARG'`).
  RangeError,
}

/// What an aborted generation had produced before it stopped (`err.partial` in JS).
#[derive(Debug, Clone, Default)]
pub struct Partial {
  pub text: String,
  pub tokens: Vec<u32>,
}

/// An error on its way to JavaScript.
#[derive(Debug, Clone)]
pub struct CodedError {
  pub code: &'static str,
  pub message: String,
  pub kind: Kind,
  pub partial: Option<Partial>,
}

pub type Res<T> = std::result::Result<T, CodedError>;

impl CodedError {
  pub fn new(code: &'static str, message: impl Into<String>) -> Self {
    CodedError { code, message: message.into(), kind: Kind::Error, partial: None }
  }

  /// A value of the wrong type: `TypeError` with code `ERR_INVALID_ARG`.
  pub fn invalid_type(message: impl Into<String>) -> Self {
    CodedError { kind: Kind::TypeError, ..Self::new(ERR_INVALID_ARG, message) }
  }

  /// A value out of range: `RangeError` with code `ERR_INVALID_ARG`.
  pub fn out_of_range(message: impl Into<String>) -> Self {
    CodedError { kind: Kind::RangeError, ..Self::new(ERR_INVALID_ARG, message) }
  }

  pub fn closed() -> Self {
    Self::new(ERR_CLOSED, "the model was closed")
  }

  pub fn aborted(partial: Option<Partial>) -> Self {
    CodedError { partial, ..Self::new(ABORT_ERR, "the operation was aborted") }
  }

  pub fn internal(message: impl Into<String>) -> Self {
    Self::new(ERR_INTERNAL, message)
  }

  /// A crate's error by its stable code. A crate's `ERR_INVALID_ARG` is a value of the right
  /// type that the crate refused (the binding has checked the types before calling it), so it is
  /// a `RangeError`; every other code is a plain `Error` (`ABORT_ERR` gets its name in
  /// `to_js_value`).
  fn from_code(code: &'static str, message: String) -> Self {
    let kind = if code == ERR_INVALID_ARG { Kind::RangeError } else { Kind::Error };
    CodedError { kind, ..Self::new(code, message) }
  }

  pub fn from_panic(payload: Box<dyn std::any::Any + Send>) -> Self {
    Self::from(ruvllm_core::Error::from_panic(payload))
  }

  pub fn is_abort(&self) -> bool {
    self.code == ABORT_ERR
  }

  /// Builds the JS error object. Call on the JS thread only.
  pub fn to_js_value(&self, env: &Env) -> napi::Result<sys::napi_value> {
    let base = napi::Error::new(self.code, self.message.clone());
    // SAFETY: `env` is the JS thread's env (this is only called there).
    let raw = unsafe {
      match self.kind {
        Kind::Error => JsError::from(base).into_value(env.raw()),
        Kind::TypeError => JsTypeError::from(base).into_value(env.raw()),
        Kind::RangeError => JsRangeError::from(base).into_value(env.raw()),
      }
    };
    if raw.is_null() {
      return Err(napi::Error::from_reason(self.message.clone()));
    }
    let mut obj = Object::from_raw(env.raw(), raw);
    if self.is_abort() {
      obj.set_named_property("name", "AbortError")?;
    }
    if let Some(partial) = &self.partial {
      let p = crate::types::PartialCompletion { text: partial.text.clone(), tokens: partial.tokens.clone() };
      obj.set_named_property("partial", p)?;
    }
    Ok(raw)
  }

  /// Turns this into a `napi::Error` that carries the JS object made by `to_js_value`, so that
  /// a throw or a promise rejection hands JavaScript exactly that object. JS thread only.
  pub fn into_napi(self, env: &Env) -> napi::Error {
    match self.to_js_value(env) {
      // SAFETY: `raw` is the error object just created on this env.
      Ok(raw) => napi::Error::from(unsafe { Unknown::from_raw_unchecked(env.raw(), raw) }),
      Err(e) => e,
    }
  }
}

impl From<ruvllm_core::Error> for CodedError {
  fn from(err: ruvllm_core::Error) -> Self {
    match err {
      ruvllm_core::Error::Closed => CodedError::closed(),
      ruvllm_core::Error::Aborted => CodedError::aborted(None),
      other => CodedError::from_code(other.code(), other.to_string()),
    }
  }
}

impl From<ruvllm_models::HubError> for CodedError {
  fn from(err: ruvllm_models::HubError) -> Self {
    match err {
      ruvllm_models::HubError::Aborted => CodedError::aborted(None),
      other => CodedError::from_code(other.code(), other.to_string()),
    }
  }
}

impl From<ruvllm_embed::Error> for CodedError {
  fn from(err: ruvllm_embed::Error) -> Self {
    CodedError::from_code(err.code(), err.to_string())
  }
}

impl From<ruvllm_sona::Error> for CodedError {
  fn from(err: ruvllm_sona::Error) -> Self {
    match err {
      ruvllm_sona::Error::Core(e) => CodedError::from(e),
      other => CodedError::from_code(other.code(), other.to_string()),
    }
  }
}

impl From<ruvllm_daf::Error> for CodedError {
  fn from(err: ruvllm_daf::Error) -> Self {
    match err {
      ruvllm_daf::Error::Closed => CodedError::new(ERR_CLOSED, "the federation node is closed"),
      other => CodedError::from_code(other.code(), other.to_string()),
    }
  }
}

impl From<ruvllm_router::Error> for CodedError {
  fn from(err: ruvllm_router::Error) -> Self {
    CodedError::from_code(err.code(), err.to_string())
  }
}

impl From<ruvllm_server::ServerError> for CodedError {
  fn from(err: ruvllm_server::ServerError) -> Self {
    CodedError::from_code(err.code(), err.to_string())
  }
}

/// A failed napi call (making a function, reading a value whose type was checked): our bug or
/// the runtime's, not the caller's.
impl From<napi::Error> for CodedError {
  fn from(err: napi::Error) -> Self {
    CodedError::internal(err.reason)
  }
}

/// A value that did not turn into JSON on its way to JavaScript: our bug, not the caller's.
impl From<serde_json::Error> for CodedError {
  fn from(err: serde_json::Error) -> Self {
    CodedError::internal(err.to_string())
  }
}

/// Runs `f`, turning a panic into `ERR_INTERNAL`.
pub fn guard<T>(f: impl FnOnce() -> Res<T>) -> Res<T> {
  catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(CodedError::from_panic(p)))
}

/// For synchronous exports: runs `f` with panics caught and converts its error to the JS object.
pub fn sync_call<T>(env: &Env, f: impl FnOnce() -> Res<T>) -> napi::Result<T> {
  guard(f).map_err(|e| e.into_napi(env))
}

/// A value that is either `T`, or an error to be built on the JS thread when converted. Used
/// where napi converts a value on the JS thread without giving us the `Env` first (async
/// iterator items).
pub enum OrError<T> {
  Value(T),
  Error(CodedError),
  /// What a user callback threw, handed back as it was.
  Thrown(napi::Error),
}

impl<T: ToNapiValue> ToNapiValue for OrError<T> {
  unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> napi::Result<sys::napi_value> {
    match val {
      // SAFETY: napi calls this with the live env of the JS thread.
      OrError::Value(v) => unsafe { T::to_napi_value(env, v) },
      OrError::Error(e) => Err(e.into_napi(&Env::from_raw(env))),
      OrError::Thrown(e) => Err(e),
    }
  }
}
