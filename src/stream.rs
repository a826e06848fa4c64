//! `llm.stream()`: a native async iterable (napi 3 `AsyncGenerator`), so `for await` works on
//! the value the addon returns, with no JS wrapper. Generation starts at the first `next()`;
//! `return()` (what `break` calls) cancels it, and so does dropping the stream.

use std::future::Future;
use std::sync::Arc;

use napi::bindgen_prelude::AsyncGenerator;
use napi_derive::napi;
use tokio::sync::Mutex;

use ruvllm_core::engine::{Engine, GenerateParams, Prompt};
use ruvllm_core::nn::AdapterSet;

use crate::error::{CodedError, OrError};
use crate::request::{Request, Step, StepCallback};
use crate::signal::{CancelState, SignalHook};
use crate::types::Completion;

/// The iterator's item. Named `TokenChunk` on purpose: napi's type generator writes the Rust name
/// of `Yield` into `index.d.ts`, and what JavaScript receives is exactly a `TokenChunk` (an error
/// variant never becomes a value: it rejects the `next()` promise with the coded error, built on
/// the JS thread).
type TokenChunk = OrError<crate::types::TokenChunk>;

enum State {
  // The params are boxed: with tools and schemas they dwarf the other states.
  Pending {
    engine: Arc<Engine>,
    prompt: Prompt,
    params: Box<GenerateParams>,
    adapters: Option<AdapterSet>,
    hook: Option<SignalHook>,
    on_step: Option<StepCallback>,
  },
  Running(Request),
  Failed(CodedError),
  Finished(Option<Box<ruvllm_core::engine::Completion>>),
}

/// A running (or not yet started) generation, consumed with `for await (const chunk of stream)`.
/// After the loop ends normally, `completion` holds the finished `Completion`.
#[napi(async_iterator)]
pub struct TokenStream {
  state: Arc<Mutex<State>>,
  cancel: Arc<CancelState>,
}

impl TokenStream {
  pub(crate) fn pending(
    engine: Arc<Engine>,
    prompt: Prompt,
    params: GenerateParams,
    adapters: Option<AdapterSet>,
    cancel: Arc<CancelState>,
    hook: Option<SignalHook>,
    on_step: Option<StepCallback>,
  ) -> Self {
    TokenStream { state: Arc::new(Mutex::new(State::Pending { engine, prompt, params: Box::new(params), adapters, hook, on_step })), cancel }
  }

  pub(crate) fn failed(err: CodedError) -> Self {
    TokenStream { state: Arc::new(Mutex::new(State::Failed(err))), cancel: Arc::new(CancelState::default()) }
  }
}

#[napi]
impl TokenStream {
  /// The finished completion (id, full text, usage, timings) once the stream has ended
  /// normally; `null` before that, or when it ended with an error or early.
  #[napi(getter)]
  pub fn completion(&self) -> Option<Completion> {
    match self.state.try_lock() {
      Ok(st) => match &*st {
        State::Finished(Some(c)) => Some(Completion::from((**c).clone())),
        _ => None,
      },
      Err(_) => None,
    }
  }
}

#[napi]
impl AsyncGenerator for TokenStream {
  type Yield = TokenChunk;
  type Next = ();
  type Return = ();

  fn next(&mut self, _value: Option<()>) -> impl Future<Output = napi::Result<Option<TokenChunk>>> + Send + 'static {
    let state = self.state.clone();
    let cancel = self.cancel.clone();
    async move {
      let mut st = state.lock().await;
      loop {
        match std::mem::replace(&mut *st, State::Finished(None)) {
          State::Pending { engine, prompt, params, adapters, hook, on_step } => {
            *st = if engine.is_closed() {
              State::Failed(CodedError::closed())
            } else if cancel.aborted() {
              State::Failed(CodedError::aborted(None))
            } else {
              match Request::submit(&engine, prompt, *params, adapters, cancel.clone(), hook, on_step) {
                Ok(r) => State::Running(r),
                Err(e) => State::Failed(e),
              }
            };
          }
          State::Running(mut req) => {
            return Ok(match req.next().await {
              Step::Token { id, text, logprob } => {
                *st = State::Running(req);
                Some(OrError::Value(crate::types::TokenChunk { text, token: id, logprob: logprob.map(Into::into) }))
              }
              Step::Done(c) => {
                *st = State::Finished(Some(Box::new(c)));
                None
              }
              Step::Failed(e) => Some(OrError::Error(e)),
              Step::Thrown(e) => Some(OrError::Thrown(e)),
            });
          }
          State::Failed(e) => return Ok(Some(OrError::Error(e))),
          State::Finished(c) => {
            *st = State::Finished(c);
            return Ok(None);
          }
        }
      }
    }
  }

  fn complete(&mut self, _value: Option<()>) -> impl Future<Output = napi::Result<Option<TokenChunk>>> + Send + 'static {
    // Cancel before taking the lock, so a `next()` in flight ends within a token.
    self.cancel.cancel();
    let state = self.state.clone();
    async move {
      let mut st = state.lock().await;
      if let State::Running(req) = &mut *st {
        req.cancel();
      }
      if !matches!(&*st, State::Finished(Some(_))) {
        *st = State::Finished(None);
      }
      Ok(None)
    }
  }
}
