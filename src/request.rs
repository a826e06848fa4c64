//! One generation request as seen from the binding: submitted to the engine's worker thread with
//! a sink that forwards events into a tokio channel; `next()` awaits them (never blocking the JS
//! thread or the libuv pool). Shared by `generate` and `stream`.

use std::sync::Arc;

use napi::threadsafe_function::ThreadsafeFunction;
use napi::Status;
use ruvllm_core::engine::{Completion, DiffusionStep, Engine, Event, FinishReason, GenerateParams, GenerateRequest, Prompt};
use ruvllm_core::nn::AdapterSet;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::error::{guard, CodedError, Partial, ERR_CLOSED};
use crate::llm::{call_awaited, CallbackReturn};
use crate::signal::{CancelState, SignalHook};
use crate::types::{clamp_u32, DiffusionStepInfo};

/// What `next()` yields.
pub enum Step {
  Token {
    id: u32,
    text: String,
    logprob: Option<ruvllm_core::engine::TokenLogprob>,
  },
  Done(Completion),
  Failed(CodedError),
  /// The user's `onStep` threw or rejected with this (the request is cancelled).
  Thrown(napi::Error),
}

/// A diffusion model's `onStep` callback.
pub type StepCallback = ThreadsafeFunction<DiffusionStepInfo, CallbackReturn, DiffusionStepInfo, Status, false>;

pub struct Request {
  rx: UnboundedReceiver<Event>,
  cancel: Arc<CancelState>,
  hook: Option<SignalHook>,
  partial: Partial,
  finished: bool,
  on_step: Option<StepCallback>,
}

impl Request {
  /// Queues the request on the engine. `hook` is the request's abort listener, removed when the
  /// request ends.
  pub fn submit(
    engine: &Engine,
    prompt: Prompt,
    params: GenerateParams,
    adapters: Option<AdapterSet>,
    cancel: Arc<CancelState>,
    hook: Option<SignalHook>,
    on_step: Option<StepCallback>,
  ) -> Result<Request, CodedError> {
    let (tx, rx) = unbounded_channel();
    let sink = Box::new(move |ev: Event| {
      // The receiver is gone when the caller stopped listening; the engine stops on `cancel`.
      let _ = tx.send(ev);
    });
    let req = GenerateRequest { prompt, params, adapters, cancel: cancel.flag.clone(), sink };
    guard(|| Ok(engine.submit(req)?))?;
    Ok(Request { rx, cancel, hook, partial: Partial::default(), finished: false, on_step })
  }

  /// Stops the request (if still running) and removes its abort listener.
  pub fn cancel(&mut self) {
    if !self.finished {
      self.cancel.cancel();
    }
    self.finish();
  }

  fn finish(&mut self) {
    self.finished = true;
    if let Some(mut h) = self.hook.take() {
      h.detach();
    }
  }

  fn abort_error(&mut self) -> Step {
    self.cancel.cancel();
    self.finish();
    Step::Failed(CodedError::aborted(Some(std::mem::take(&mut self.partial))))
  }

  /// The next event. After `Done` or `Failed` it keeps answering `Failed(internal)`; callers stop first.
  pub async fn next(&mut self) -> Step {
    if self.finished {
      return Step::Failed(CodedError::internal("the request has already finished"));
    }
    loop {
      if self.cancel.aborted() {
        return self.abort_error();
      }
      let ev = tokio::select! {
        biased;
        _ = self.cancel.notify.notified() => continue,
        ev = self.rx.recv() => ev,
      };
      match ev {
        Some(Event::Token { id, text, logprob }) => {
          if self.cancel.aborted() {
            return self.abort_error();
          }
          self.partial.tokens.push(id);
          self.partial.text.push_str(&text);
          return Step::Token { id, text, logprob };
        }
        Some(Event::Step(s)) => {
          if let Some(cb) = &self.on_step {
            if let Err(e) = call_awaited(cb, step_info(s)).await {
              self.cancel();
              return Step::Thrown(e);
            }
          }
        }
        Some(Event::Done(c)) => {
          if c.finish_reason == FinishReason::Abort || self.cancel.aborted() {
            self.partial = Partial { text: c.text, tokens: c.tokens };
            return self.abort_error();
          }
          self.finish();
          return Step::Done(c);
        }
        Some(Event::Error(e)) => {
          let err = CodedError::from(e);
          // Closing the engine wins over an abort that raced it, as the engine decided.
          if err.code != ERR_CLOSED && (err.is_abort() || self.cancel.aborted()) {
            return self.abort_error();
          }
          self.finish();
          return Step::Failed(err);
        }
        None => {
          self.finish();
          return Step::Failed(CodedError::internal("the engine dropped the request without finishing it"));
        }
      }
    }
  }
}

impl Drop for Request {
  fn drop(&mut self) {
    // Whoever awaited this request is gone (a stream left early, a callback threw): stop it.
    self.cancel();
  }
}

fn step_info(s: DiffusionStep) -> DiffusionStepInfo {
  DiffusionStepInfo {
    step: clamp_u32(s.step),
    block: clamp_u32(s.block),
    positions: s.committed.iter().map(|&(o, _)| clamp_u32(o)).collect(),
    tokens: s.committed.iter().map(|&(_, t)| t).collect(),
    text: s.text,
  }
}
