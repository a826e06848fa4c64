//! Agent routing for Claude Flow: `embed`, the `Embedder` and `Router` classes, the
//! hook commands and the routing benchmark. Wrappers only; the logic lives in `ruvllm-router`.
//! Embedding and routing run on tokio's blocking pool; the JS thread validates and awaits.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use napi::bindgen_prelude::{ClassInstance, Float32Array, FromNapiValue, Object, PromiseRaw, Unknown};
use napi::{Env, JsValue, ValueType};
use napi_derive::napi;

use ruvllm_embed as emb;
use ruvllm_router as rr;

use crate::error::{sync_call, CodedError, Res};
use crate::options::{self, Val};
use crate::task::spawn;

fn to_f32_arrays(vs: Vec<Vec<f32>>) -> Vec<Float32Array> {
  vs.into_iter().map(Float32Array::new).collect()
}

fn json_arg(env: &Env, v: &Unknown, what: &str) -> Res<serde_json::Value> {
  match v.get_type() {
    Ok(ValueType::Undefined) | Ok(ValueType::Null) => Ok(serde_json::Value::Null),
    Ok(_) => env.from_js_value::<serde_json::Value, _>(*v).map_err(|e| CodedError::invalid_type(format!("{what}: {e}"))),
    Err(e) => Err(CodedError::invalid_type(format!("{what}: {e}"))),
  }
}

fn string_arg(env: &Env, v: &Unknown, what: &str) -> Res<String> {
  let s = options::string(&Val::new(env, v), what)?;
  if s.trim().is_empty() {
    return Err(CodedError::out_of_range(format!("{what} must not be empty")));
  }
  Ok(s)
}

fn texts_arg(env: &Env, v: &Unknown) -> Res<Vec<String>> {
  match json_arg(env, v, "texts")? {
    serde_json::Value::Array(items) => items
      .into_iter()
      .enumerate()
      .map(|(i, x)| match x {
        serde_json::Value::String(s) => Ok(s),
        _ => Err(CodedError::invalid_type(format!("texts[{i}] must be a string"))),
      })
      .collect(),
    serde_json::Value::String(_) => Err(CodedError::invalid_type("texts must be an array of strings (wrap one text in [ ])")),
    _ => Err(CodedError::invalid_type("texts must be an array of strings")),
  }
}

/// A router's embedder: the model in `dir` (as published), or the routers' default one
/// (`RUVLLM_EMBEDDER_ADAPTER=routing` adds the routing adapter).
fn load_embedder(dir: Option<String>) -> Res<Arc<dyn emb::Embedder>> {
  match dir {
    Some(d) => load_embedder_with(Some(d), emb::Adapter::Off),
    None => Ok(emb::router_default_embedder()?),
  }
}

/// Loads the embedder in `dir` (or the default model) with or without the routing adapter.
fn load_embedder_with(dir: Option<String>, adapter: emb::Adapter) -> Res<Arc<dyn emb::Embedder>> {
  match (dir, adapter) {
    (Some(d), _) => Ok(Arc::new(emb::BertEmbedder::load(&d, emb::BertOptions { adapter, ..emb::BertOptions::default() })?)),
    (None, emb::Adapter::Routing) => Ok(emb::routing_embedder()?),
    (None, emb::Adapter::Off) => Ok(emb::default_embedder()?),
  }
}

/// `{ adapter?: boolean }` of `Embedder.load` (null, as for `dir`, is no options).
fn adapter_option(env: &Env, v: &Unknown) -> Res<emb::Adapter> {
  let v = Val::new(env, v);
  let bag = if v.ty()? == ValueType::Null { None } else { options::option_bag(Some(v), "Embedder.load", &["adapter"])? };
  Ok(if options::boolean(bag, "adapter")?.unwrap_or(false) { emb::Adapter::Routing } else { emb::Adapter::Off })
}

/// Embeds texts with the default sentence-embedding model (all-MiniLM-L6-v2 from
/// `$RUVLLM_EMBEDDER`, else the model cache, which the first call fills with the model
/// manager's download of `all-minilm-l6-v2`, ~90 MB, with a one-line notice on stderr): one
/// L2-normalised `Float32Array` (384 numbers) per text, in order. The model is loaded once per
/// process. Rejects with `ERR_EMBEDDER_NOT_FOUND` (not cached and `HF_HUB_OFFLINE` set, or the
/// download failed; the message says `npx ruvllm models download all-minilm-l6-v2`),
/// `ERR_EMBEDDER_LOAD` or `ERR_INVALID_ARG`.
#[napi(ts_args_type = "texts: string[]", ts_return_type = "Promise<Float32Array[]>")]
pub fn embed<'env>(env: &'env Env, texts: Unknown) -> napi::Result<PromiseRaw<'env, Vec<Float32Array>>> {
  let texts = texts_arg(env, &texts);
  spawn(
    env,
    texts,
    move |texts| {
      let e = emb::default_embedder()?;
      let refs: Vec<&str> = texts.iter().map(|s| s.as_str()).collect();
      if refs.is_empty() {
        return Ok(Vec::new());
      }
      Ok(e.embed(&refs)?)
    },
    |_, v| Ok(to_f32_arrays(v)),
  )
}

/// A loaded LLM's mean-pooled final hidden states as an embedder (`Embedder.fromModel`,
/// `LLM.embed`). The id names the GGUF file and its fingerprint, so a router saved with it is
/// only reused with the same model.
struct LlmEmbedder {
  engine: Arc<ruvllm_core::engine::Engine>,
  id: String,
  dim: usize,
}

impl emb::Embedder for LlmEmbedder {
  fn id(&self) -> &str {
    &self.id
  }
  fn dim(&self) -> usize {
    self.dim
  }
  fn embed(&self, texts: &[&str]) -> ruvllm_embed::Result<Vec<Vec<f32>>> {
    self.engine.embed_blocking(texts).map_err(|e| ruvllm_embed::Error::Backend { code: e.code(), message: e.to_string() })
  }
}

pub(crate) fn llm_embedder(engine: Arc<ruvllm_core::engine::Engine>, info: &ruvllm_core::engine::ModelInfo) -> Arc<dyn emb::Embedder> {
  let path = std::path::Path::new(&info.path);
  let file = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
  let id = format!("llm-mean:{file}:{}", ruvllm_embed::fingerprint(path));
  Arc::new(LlmEmbedder { engine, id, dim: info.embedding_length })
}

/// Validates `texts` on the JS thread, embeds them with `inner` on the blocking pool.
pub(crate) fn embed_promise<'env>(env: &'env Env, inner: Res<Arc<dyn emb::Embedder>>, texts: Unknown) -> napi::Result<PromiseRaw<'env, Vec<Float32Array>>> {
  let checked = inner.and_then(|e| texts_arg(env, &texts).map(|t| (e, t)));
  spawn(
    env,
    checked,
    move |(inner, texts)| {
      let refs: Vec<&str> = texts.iter().map(|s| s.as_str()).collect();
      if refs.is_empty() {
        return Ok(Vec::new());
      }
      Ok(inner.embed(&refs)?)
    },
    |_, v| Ok(to_f32_arrays(v)),
  )
}

/// A sentence-embedding model: by default all-MiniLM-L6-v2 (BERT with mean pooling and L2
/// normalisation, run by our own forward in this process), or a loaded LLM's pooled hidden
/// states (`Embedder.fromModel`). `Embedder.load()` gives the default (as published),
/// `Embedder.load(null, { adapter: true })` the routing-adapted one; pass an `Embedder` to
/// `new Router({ embedder })` to share one loaded model between routers.
#[napi]
pub struct Embedder {
  inner: Arc<dyn emb::Embedder>,
}

#[napi]
impl Embedder {
  /// Loads a sentence-transformers BERT model from `dir` (a folder with `model.safetensors`,
  /// `tokenizer.json` and `config.json`), or the default model when `dir` is omitted.
  /// With `{ adapter: true }`, all-MiniLM-L6-v2 gets ruvllm's routing adapter (a low-rank delta
  /// trained on the agent catalogue; higher routing accuracy, see the README; pass the embedder
  /// to `new Router({ embedder })`); other models never do. Rejects with
  /// `ERR_EMBEDDER_NOT_FOUND`, `ERR_EMBEDDER_LOAD` or `ERR_INVALID_ARG`.
  #[napi(ts_args_type = "dir?: string | null, options?: { adapter?: boolean }", ts_return_type = "Promise<Embedder>")]
  pub fn load<'env>(env: &'env Env, dir: Unknown, options: Option<Unknown>) -> napi::Result<PromiseRaw<'env, Embedder>> {
    let args = match json_arg(env, &dir, "dir") {
      Ok(serde_json::Value::Null) => Ok(None),
      Ok(serde_json::Value::String(s)) => Ok(Some(s)),
      Ok(_) => Err(CodedError::invalid_type("dir must be a string")),
      Err(e) => Err(e),
    }
    .and_then(|dir| Ok((dir, options.as_ref().map(|o| adapter_option(env, o)).transpose()?.unwrap_or_default())));
    spawn(env, args, move |(dir, adapter)| load_embedder_with(dir, adapter), |_, inner| Ok(Embedder { inner }))
  }

  /// A loaded `LLM` as an embedder: the mean over a text's tokens (BOS included) of the model's
  /// final hidden states after the output norm, L2-normalised (`dim` = the model's hidden
  /// width, 640 for Gemma 3 270M). Embedding runs on the model's engine thread; the model must
  /// stay open while the embedder is used (else `ERR_CLOSED`). Throws `ERR_INVALID_ARG` when
  /// `model` is not an `LLM`, `ERR_CLOSED` when it is closed.
  #[napi(factory, ts_args_type = "model: LLM")]
  pub fn from_model(env: Env, model: Unknown) -> napi::Result<Embedder> {
    sync_call(&env, || {
      if model.get_type().ok() != Some(ValueType::Object) {
        return Err(CodedError::invalid_type("model must be an LLM (from LLM.load)"));
      }
      // SAFETY: a napi value of the current call on the JS thread; `from_napi_value` checks its type
      // and returns an error for anything else.
      let llm = unsafe { ClassInstance::<crate::llm::Llm>::from_napi_value(env.raw(), model.raw()) }
        .map_err(|_| CodedError::invalid_type("model must be an LLM (from LLM.load)"))?;
      let (engine, info) = llm.engine_and_info()?;
      Ok(Embedder { inner: llm_embedder(engine, &info) })
    })
  }

  /// Embeds texts: one L2-normalised `Float32Array` of `dim` numbers per text, in order.
  #[napi(ts_args_type = "texts: string[]", ts_return_type = "Promise<Float32Array[]>")]
  pub fn embed<'env>(&self, env: &'env Env, texts: Unknown) -> napi::Result<PromiseRaw<'env, Vec<Float32Array>>> {
    embed_promise(env, Ok(self.inner.clone()), texts)
  }

  /// Length of each embedding (384 for all-MiniLM-L6-v2).
  #[napi(getter)]
  pub fn dim(&self) -> u32 {
    self.inner.dim() as u32
  }

  /// Identifies the model; a saved router records it.
  #[napi(getter)]
  pub fn id(&self) -> String {
    self.inner.id().to_string()
  }
}

/// An agent for `new Router({ agents })`.
#[napi(object, object_to_js = false)]
#[allow(dead_code)] // declared for its TypeScript type; read field by field
pub struct RouterAgent {
  /// Agent type, e.g. `'coder'`.
  pub name: String,
  /// What the agent does (embedded as one more pattern).
  pub description: Option<String>,
  /// Example tasks for this agent.
  pub examples: Option<Vec<String>>,
}

/// Options for `new Router(options)` and `Router.load(path, options)`.
#[napi(object, object_to_js = false)]
#[allow(dead_code)] // declared for its TypeScript type; read field by field
pub struct RouterOptions {
  /// The agents to choose from. Default: the 13 Claude Flow agent types (`coder`, `researcher`,
  /// `reviewer`, `tester`, `architect`, `security-architect`, `debugger`, `documenter`,
  /// `refactorer`, `optimizer`, `devops`, `api-docs`, `planner`) with their built-in examples.
  #[napi(ts_type = "RouterAgent[]")]
  pub agents: Option<Vec<RouterAgent>>,
  /// An `Embedder`, or a model directory. Default: the process-wide default embedder.
  #[napi(ts_type = "Embedder | string")]
  pub embedder: Option<String>,
}

/// An agent and its probability.
#[napi(object)]
pub struct AgentScore {
  pub agent: String,
  pub score: f64,
}

/// What `router.route(task)` resolves to.
#[napi(object)]
pub struct RouteResult {
  /// The chosen agent.
  pub agent: String,
  /// Calibrated probability that `agent` is the right choice (0..1).
  pub confidence: f64,
  /// Up to three runners-up with their probabilities, best first.
  pub alternatives: Vec<AgentScore>,
  /// Time spent in `route`, embedding included, in milliseconds.
  pub latency_ms: f64,
}

/// What `router.feedback` did: `'added'` (new pattern), `'reinforced'` (an existing
/// near-identical pattern got more weight) or `'penalised'` (patterns lost weight).
#[napi(object)]
pub struct FeedbackResult {
  pub effect: String,
  /// Patterns touched.
  pub patterns: Vec<u32>,
}

/// An outcome for `router.feedback`.
#[napi(object, object_to_js = false)]
#[allow(dead_code)] // declared for its TypeScript type; read field by field
pub struct Outcome {
  /// The agent that handled the task.
  pub agent: String,
  /// Whether it went well.
  pub success: bool,
}

/// A labelled example for `router.addExamples`.
#[napi(object, object_to_js = false)]
#[allow(dead_code)] // declared for its TypeScript type; read field by field
pub struct RouterExample {
  pub text: String,
  pub agent: String,
}

enum State {
  /// Built on first use, off the JS thread.
  Pending {
    agents: Option<Vec<rr::AgentSpec>>,
    embedder: Option<Arc<dyn emb::Embedder>>,
    dir: Option<String>,
  },
  Ready(Box<rr::Router>),
}

type Shared = Arc<Mutex<State>>;

fn with_router<T>(shared: &Shared, f: impl FnOnce(&mut rr::Router) -> Res<T>) -> Res<T> {
  let mut g = shared.lock().unwrap_or_else(|p| p.into_inner());
  if let State::Pending { agents, embedder, dir } = &mut *g {
    let emb = match embedder.take() {
      Some(e) => e,
      None => load_embedder(dir.take())?,
    };
    let specs = match agents.take() {
      Some(a) => a,
      None => rr::catalogue::default_agent_specs()?,
    };
    *g = State::Ready(Box::new(rr::Router::new(specs, emb)?));
  }
  match &mut *g {
    State::Ready(r) => f(r),
    State::Pending { .. } => Err(CodedError::internal("router not built")),
  }
}

/// A router's `{ agents?, embedder? }`: the agents, an embedder object or an embedder folder.
type ParsedRouterOptions = (Option<Vec<rr::AgentSpec>>, Option<Arc<dyn emb::Embedder>>, Option<String>);

/// Parses `{ agents?, embedder? }`.
fn router_options(env: &Env, options: &Unknown) -> Res<ParsedRouterOptions> {
  let ty = options.get_type().map_err(|e| CodedError::invalid_type(e.to_string()))?;
  if matches!(ty, ValueType::Undefined | ValueType::Null) {
    return Ok((None, None, None));
  }
  if ty != ValueType::Object {
    return Err(CodedError::invalid_type("options must be an object"));
  }
  // SAFETY: a napi value of the current call on the JS thread; `from_napi_value` checks its type
  // and returns an error for anything else.
  let obj = unsafe { Object::from_napi_value(env.raw(), options.raw()) }.map_err(|e| CodedError::invalid_type(e.to_string()))?;
  let mut embedder = None;
  let mut dir = None;
  if let Ok(Some(e)) = obj.get::<Unknown>("embedder") {
    match e.get_type() {
      Ok(ValueType::Undefined) | Ok(ValueType::Null) => {}
      Ok(ValueType::String) => dir = Some(string_arg(env, &e, "options.embedder")?),
      Ok(ValueType::Object) => {
        // SAFETY: a napi value of the current call on the JS thread; `from_napi_value` checks its type
        // and returns an error for anything else.
        let inst = unsafe { ClassInstance::<Embedder>::from_napi_value(env.raw(), e.raw()) }
          .map_err(|_| CodedError::invalid_type("options.embedder must be an Embedder or a model directory"))?;
        embedder = Some(inst.inner.clone());
      }
      _ => return Err(CodedError::invalid_type("options.embedder must be an Embedder or a model directory")),
    }
  }
  let mut agents = None;
  if let Ok(Some(a)) = obj.get::<Unknown>("agents") {
    match json_arg(env, &a, "options.agents")? {
      serde_json::Value::Null => {}
      serde_json::Value::Array(items) => {
        let mut specs = Vec::new();
        for (i, it) in items.into_iter().enumerate() {
          let name = it.get("name").and_then(|n| n.as_str()).ok_or_else(|| CodedError::invalid_type(format!("options.agents[{i}].name must be a string")))?;
          let description = match it.get("description") {
            None | Some(serde_json::Value::Null) => String::new(),
            Some(serde_json::Value::String(s)) => s.clone(),
            _ => return Err(CodedError::invalid_type(format!("options.agents[{i}].description must be a string"))),
          };
          let examples = match it.get("examples") {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(serde_json::Value::Array(xs)) => xs
              .iter()
              .map(|x| x.as_str().map(String::from).ok_or_else(|| CodedError::invalid_type(format!("options.agents[{i}].examples must be strings"))))
              .collect::<Res<Vec<_>>>()?,
            _ => return Err(CodedError::invalid_type(format!("options.agents[{i}].examples must be an array of strings"))),
          };
          specs.push(rr::AgentSpec { name: name.to_string(), description, examples });
        }
        if specs.is_empty() {
          return Err(CodedError::out_of_range("options.agents must not be empty"));
        }
        agents = Some(specs);
      }
      _ => return Err(CodedError::invalid_type("options.agents must be an array")),
    }
  }
  Ok((agents, embedder, dir))
}

/// Routes tasks to agents from sentence embeddings (a softmax-regression head over the
/// embedding and the task's words, trained on the stored patterns; calibrated confidence) and
/// learns from outcomes. Construction is instant; the examples are embedded off the JS thread
/// on the first call that needs them.
#[napi]
pub struct Router {
  shared: Shared,
}

#[napi]
impl Router {
  /// `new Router({ agents?, embedder? })`. Default agents: the 13 Claude Flow agent types with
  /// built-in examples; default embedder: all-MiniLM-L6-v2. Throws `ERR_INVALID_ARG` on bad options.
  #[napi(constructor, catch_unwind, ts_args_type = "options?: RouterOptions")]
  pub fn new(env: Env, options: Unknown) -> napi::Result<Self> {
    sync_call(&env, || {
      let (agents, embedder, dir) = router_options(&env, &options)?;
      if let Some(a) = &agents {
        let mut seen = std::collections::HashSet::new();
        for x in a {
          if x.name.trim().is_empty() || !seen.insert(x.name.clone()) {
            return Err(CodedError::invalid_type(format!("agent names must be non-empty and unique ('{}')", x.name)));
          }
        }
      }
      Ok(Router { shared: Arc::new(Mutex::new(State::Pending { agents, embedder, dir })) })
    })
  }

  /// Loads a router written by `save`. If it was saved with another embedder, its patterns are
  /// embedded again. Rejects with `ERR_IO`, `ERR_ROUTER_STATE` or an embedder error.
  #[napi(ts_args_type = "path: string, options?: { embedder?: Embedder | string }", ts_return_type = "Promise<Router>")]
  pub fn load<'env>(env: &'env Env, path: Unknown, options: Unknown) -> napi::Result<PromiseRaw<'env, Router>> {
    let parsed = string_arg(env, &path, "path").and_then(|p| Ok((p, router_options(env, &options)?)));
    spawn(
      env,
      parsed,
      move |(path, (_, embedder, dir))| {
        let emb = match embedder {
          Some(e) => e,
          None => load_embedder(dir)?,
        };
        Ok(rr::Router::load(&PathBuf::from(path), emb, Default::default())?)
      },
      |_, r| Ok(Router { shared: Arc::new(Mutex::new(State::Ready(Box::new(r)))) }),
    )
  }

  /// Routes a task description: `{ agent, confidence, alternatives, latencyMs }`.
  #[napi(ts_args_type = "task: string", ts_return_type = "Promise<RouteResult>")]
  pub fn route<'env>(&self, env: &'env Env, task: Unknown) -> napi::Result<PromiseRaw<'env, RouteResult>> {
    let shared = self.shared.clone();
    spawn(
      env,
      string_arg(env, &task, "task"),
      move |task| {
        // Build (first use) and embed outside the timed part only for the build.
        let emb = with_router(&shared, |r| Ok(r.embedder().clone()))?;
        let t = std::time::Instant::now();
        let v = emb.embed(&[&task])?.pop().ok_or_else(|| CodedError::internal("no embedding"))?;
        let route = with_router(&shared, |r| Ok(r.route_vector(&task, &v)?))?;
        Ok((route, t.elapsed().as_secs_f64() * 1e3))
      },
      |_, (r, ms)| {
        Ok(RouteResult {
          agent: r.agent,
          confidence: r.confidence as f64,
          alternatives: r.alternatives.into_iter().map(|a| AgentScore { agent: a.agent, score: a.score as f64 }).collect(),
          latency_ms: ms,
        })
      },
    )
  }

  /// Adds labelled examples `[{ text, agent }]` (agents must exist). Resolves to the count added.
  #[napi(ts_args_type = "examples: RouterExample[]", ts_return_type = "Promise<number>")]
  pub fn add_examples<'env>(&self, env: &'env Env, examples: Unknown) -> napi::Result<PromiseRaw<'env, u32>> {
    let shared = self.shared.clone();
    let parsed = match json_arg(env, &examples, "examples") {
      Ok(serde_json::Value::Array(items)) => items
        .into_iter()
        .enumerate()
        .map(|(i, it)| {
          let text = it.get("text").and_then(|x| x.as_str());
          let agent = it.get("agent").and_then(|x| x.as_str());
          match (text, agent) {
            (Some(t), Some(a)) => Ok((t.to_string(), a.to_string())),
            _ => Err(CodedError::invalid_type(format!("examples[{i}] must be {{ text: string, agent: string }}"))),
          }
        })
        .collect::<Res<Vec<_>>>(),
      Ok(_) => Err(CodedError::invalid_type("examples must be an array of { text, agent }")),
      Err(e) => Err(e),
    };
    spawn(
      env,
      parsed,
      move |items| {
        with_router(&shared, |r| {
          let n = r.add_examples(&items)?;
          r.fit();
          Ok(n as u32)
        })
      },
      |_, n| Ok(n),
    )
  }

  /// Learns from an outcome: `agent` handled `task` and it went well (`success: true`: the task
  /// becomes a pattern of that agent) or not (the agent's patterns near the task lose weight).
  #[napi(ts_args_type = "task: string, outcome: Outcome", ts_return_type = "Promise<FeedbackResult>")]
  pub fn feedback<'env>(&self, env: &'env Env, task: Unknown, outcome: Unknown) -> napi::Result<PromiseRaw<'env, FeedbackResult>> {
    let shared = self.shared.clone();
    let parsed = string_arg(env, &task, "task").and_then(|t| match json_arg(env, &outcome, "outcome")? {
      serde_json::Value::Object(o) => {
        let agent = o.get("agent").and_then(|x| x.as_str()).ok_or_else(|| CodedError::invalid_type("outcome.agent must be a string"))?;
        let success = o.get("success").and_then(|x| x.as_bool()).ok_or_else(|| CodedError::invalid_type("outcome.success must be a boolean"))?;
        Ok((t, agent.to_string(), success))
      }
      _ => Err(CodedError::invalid_type("outcome must be { agent, success }")),
    });
    spawn(
      env,
      parsed,
      move |(task, agent, success)| {
        let emb = with_router(&shared, |r| Ok(r.embedder().clone()))?;
        let v = emb.embed(&[&task])?.pop().ok_or_else(|| CodedError::internal("no embedding"))?;
        with_router(&shared, |r| {
          let a = r.agent_index(&agent)?;
          Ok(r.feedback_vector(&task, &v, a, success)?)
        })
      },
      |_, eff| {
        Ok(match eff {
          rr::FeedbackEffect::Added { pattern } => FeedbackResult { effect: "added".into(), patterns: vec![pattern as u32] },
          rr::FeedbackEffect::Reinforced { pattern } => FeedbackResult { effect: "reinforced".into(), patterns: vec![pattern as u32] },
          rr::FeedbackEffect::Penalised { patterns } => {
            FeedbackResult { effect: "penalised".into(), patterns: patterns.into_iter().map(|p| p as u32).collect() }
          }
        })
      },
    )
  }

  /// Saves the router (agents, parameters, patterns with vectors) as JSON, atomically (temp
  /// file + rename).
  #[napi(ts_args_type = "path: string", ts_return_type = "Promise<void>")]
  pub fn save<'env>(&self, env: &'env Env, path: Unknown) -> napi::Result<PromiseRaw<'env, ()>> {
    let shared = self.shared.clone();
    spawn(env, string_arg(env, &path, "path"), move |path| with_router(&shared, |r| Ok(r.save(&PathBuf::from(&path))?)), |_, ()| Ok(()))
  }

  /// Counts: `{ agents, patterns, indexed }` (`indexed`: patterns in the HNSW graph; 0 while
  /// searches are exact scans).
  #[napi(ts_return_type = "Promise<{ agents: string[]; patterns: number; indexed: number }>")]
  pub fn stats<'env>(&self, env: &'env Env) -> napi::Result<PromiseRaw<'env, serde_json::Value>> {
    let shared = self.shared.clone();
    spawn(
      env,
      Ok(()),
      move |()| {
        with_router(&shared, |r| {
          Ok(serde_json::json!({
            "agents": r.agents().iter().map(|a| a.name.clone()).collect::<Vec<_>>(),
            "patterns": r.patterns().len(),
            "indexed": r.index().graph_len(),
          }))
        })
      },
      |_, v| Ok(v),
    )
  }
}

fn state_path(p: Option<String>) -> Res<PathBuf> {
  match p {
    Some(p) => Ok(PathBuf::from(p)),
    None => Ok(rr::hooks::state_path()?),
  }
}

fn opt_string(env: &Env, v: &Unknown, what: &str) -> Res<Option<String>> {
  let v = Val::new(env, v);
  match v.ty()? {
    ValueType::Undefined | ValueType::Null => Ok(None),
    _ => options::string(&v, what).map(Some),
  }
}

/// Where the hooks keep the learning router's state: `statePath` when given, else
/// `$RUVLLM_ROUTER_STATE`, else `router-state.json` under the user's config directory. The file
/// is created, with the default router, by the first hook call.
#[napi(catch_unwind, ts_args_type = "statePath?: string")]
pub fn hooks_state_path(env: Env, state: Unknown) -> napi::Result<String> {
  sync_call(&env, || Ok(state_path(opt_string(&env, &state, "statePath")?)?.to_string_lossy().into_owned()))
}

/// Claude Flow `pre-task` hook: routes `description` with the router persisted under the
/// user's config directory (`statePath` overrides it) and suggests a Claude model tier.
/// Resolves to `{ agent, confidence, alternatives, model, latencyMs, patterns, statePath }`.
#[napi(ts_args_type = "description: string, statePath?: string", ts_return_type = "Promise<Record<string, unknown>>")]
pub fn hooks_pre_task<'env>(env: &'env Env, description: Unknown, state: Unknown) -> napi::Result<PromiseRaw<'env, serde_json::Value>> {
  let parsed = string_arg(env, &description, "description").and_then(|d| Ok((d, opt_string(env, &state, "statePath")?)));
  spawn(
    env,
    parsed,
    move |(d, s)| {
      let path = state_path(s)?;
      let emb = emb::router_default_embedder()?;
      let out = rr::hooks::pre_task(&d, emb, &path)?;
      Ok(serde_json::to_value(out)?)
    },
    |_, v| Ok(v),
  )
}

/// Claude Flow `post-task` hook: records that `agent` handled `task` with `success`, in the
/// persisted router (exclusive lock, atomic write; safe with concurrent hook processes).
#[napi(ts_args_type = "task: string, agent: string, success: boolean, statePath?: string", ts_return_type = "Promise<Record<string, unknown>>")]
pub fn hooks_post_task<'env>(
  env: &'env Env,
  task: Unknown,
  agent: Unknown,
  success: Unknown,
  state: Unknown,
) -> napi::Result<PromiseRaw<'env, serde_json::Value>> {
  let parsed = (|| -> Res<_> {
    let t = string_arg(env, &task, "task")?;
    let a = string_arg(env, &agent, "agent")?;
    let s = match json_arg(env, &success, "success")? {
      serde_json::Value::Bool(b) => b,
      _ => return Err(CodedError::invalid_type("success must be a boolean")),
    };
    Ok((t, a, s, opt_string(env, &state, "statePath")?))
  })();
  spawn(
    env,
    parsed,
    move |(t, a, s, st)| {
      let path = state_path(st)?;
      let emb = emb::router_default_embedder()?;
      let out = rr::hooks::post_task(&t, &a, s, emb, &path)?;
      Ok(serde_json::to_value(out)?)
    },
    |_, v| Ok(v),
  )
}

/// The routing benchmark behind `ruvllm bench routing` (minutes): resolves to
/// `{ markdown, report }`. `sizes` are the pattern counts of the scale test (default
/// `[5000, 50000]`); `halvings` runs the learning protocol over that many random halvings too
/// (default 0; ~100 s of CPU each, on up to 8 threads: 40 took 33 min on 2 cores); `embedder` replaces the default embedder
/// (e.g. `Embedder.fromModel(llm)`).
#[napi(
  ts_args_type = "options?: { sizes?: number[]; halvings?: number }, embedder?: Embedder",
  ts_return_type = "Promise<{ markdown: string; report: Record<string, unknown> }>"
)]
pub fn bench_routing<'env>(env: &'env Env, options: Unknown, embedder: Option<Unknown>) -> napi::Result<PromiseRaw<'env, serde_json::Value>> {
  let custom: Res<Option<Arc<dyn emb::Embedder>>> = match embedder.map(|e| (e.get_type(), e)) {
    None | Some((Ok(ValueType::Undefined), _)) | Some((Ok(ValueType::Null), _)) => Ok(None),
    // SAFETY: a napi value of the current call on the JS thread; `from_napi_value` checks its type
    // and returns an error for anything else.
    Some((Ok(ValueType::Object), e)) => unsafe { ClassInstance::<Embedder>::from_napi_value(env.raw(), e.raw()) }
      .map(|inst| Some(inst.inner.clone()))
      .map_err(|_| CodedError::invalid_type("embedder must be an Embedder")),
    Some(_) => Err(CodedError::invalid_type("embedder must be an Embedder")),
  };
  let parsed = custom.and_then(|custom| {
    let bag = options::option_bag(Some(Val::new(env, &options)), "benchRouting", &["sizes", "halvings"])?;
    let mut opts = ruvllm_eval::bench::BenchOptions::default();
    if let Some(sizes) = options::int_list(bag, "sizes", 0.0, options::MAX_SAFE_INTEGER)? {
      opts.scale_sizes = sizes.into_iter().map(|n| n as usize).collect();
    }
    if let Some(h) = options::int_in(bag, "halvings", 0.0, 1000.0)? {
      opts.halvings = h as usize;
    }
    Ok((opts, custom))
  });
  spawn(
    env,
    parsed,
    move |(opts, custom)| {
      let emb = match custom {
        Some(e) => e,
        None => emb::router_default_embedder()?,
      };
      let report = ruvllm_eval::bench::run(emb, &opts, &mut |m| eprintln!("… {m}"))?;
      Ok(serde_json::json!({ "markdown": report.to_markdown(), "report": report }))
    },
    |_, v| Ok(v),
  )
}

/// The built-in Claude Flow agent catalogue: `[{ name, description, examples }]`.
#[napi(catch_unwind, ts_return_type = "Array<{ name: string; description: string; examples: string[] }>")]
pub fn router_agents(env: Env) -> napi::Result<serde_json::Value> {
  sync_call(&env, || {
    let specs = rr::catalogue::default_agent_specs()?;
    Ok(serde_json::to_value(specs)?)
  })
}
