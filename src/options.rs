//! Reading and validating what JavaScript passes in: prompts and option bags. Every bad value
//! becomes `ERR_INVALID_ARG` naming the option (a `TypeError` for a wrong type, a `RangeError`
//! for a value out of range); unknown keys are rejected too, so a typo (`max_tokens`) is not
//! silently ignored. Defaults for sampling live here (documented on `GenerateOptions`).

use std::path::PathBuf;
use std::ptr;

use napi::bindgen_prelude::{FromNapiValue, Unknown};
use napi::{sys, Env, JsValue, ValueType};

use ruvllm_core::chat::ChatMessage;
use ruvllm_core::engine::{DiffusionParams, ElboParams, GenerateParams, GpuMode, LoadOptions, Prompt, Remasking, Schedule, MAX_TOP_LOGPROBS};
use ruvllm_core::kv::KvType;
use ruvllm_core::sampling::SamplingParams;
use ruvllm_core::structured::{Constraint, Tool, ToolChoice};

use crate::error::{CodedError, Res};

/// Largest integer a JS number holds exactly.
pub const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_991.0;

pub const DEFAULT_MAX_TOKENS: usize = 256;

/// Largest `contextSize` that `LLM.load` accepts.
pub const MAX_CONTEXT_SIZE: usize = 1_048_576;

/// A JS value seen from Rust, on the JS thread.
#[derive(Clone, Copy)]
pub struct Val {
  pub env: sys::napi_env,
  pub raw: sys::napi_value,
}

impl Val {
  pub fn new(env: &Env, v: &Unknown) -> Self {
    Val { env: env.raw(), raw: v.raw() }
  }

  pub fn ty(&self) -> Res<ValueType> {
    let mut t = 0;
    // SAFETY: `env` and the values are the live napi_env and handles of the current call on the
    // JS thread (a `Val` never outlives the call it was read in); out-pointers are locals.
    let status = unsafe { sys::napi_typeof(self.env, self.raw, &mut t) };
    if status != sys::Status::napi_ok {
      return Err(CodedError::internal("napi_typeof failed"));
    }
    Ok(ValueType::from(t))
  }

  pub fn is_array(&self) -> bool {
    let mut b = false;
    // SAFETY: `env` and the values are the live napi_env and handles of the current call on the
    // JS thread (a `Val` never outlives the call it was read in); out-pointers are locals.
    unsafe { sys::napi_is_array(self.env, self.raw, &mut b) };
    b
  }

  pub fn get<T: FromNapiValue>(&self) -> Res<T> {
    // SAFETY: a napi value of the current call on the JS thread; `from_napi_value` checks its type
    // and returns an error for anything else.
    Ok(unsafe { T::from_napi_value(self.env, self.raw) }?)
  }

  /// `obj[key]` (undefined when missing).
  pub fn prop(&self, key: &str) -> Res<Val> {
    let key_c = std::ffi::CString::new(key).map_err(|_| CodedError::internal("bad key"))?;
    let mut out = ptr::null_mut();
    // SAFETY: `env` and the values are the live napi_env and handles of the current call on the
    // JS thread (a `Val` never outlives the call it was read in); out-pointers are locals.
    let status = unsafe { sys::napi_get_named_property(self.env, self.raw, key_c.as_ptr(), &mut out) };
    if status != sys::Status::napi_ok {
      clear_exception(self.env);
      return Err(CodedError::invalid_type(format!("could not read option '{key}'")));
    }
    Ok(Val { env: self.env, raw: out })
  }

  /// Own enumerable string keys.
  pub fn keys(&self) -> Res<Vec<String>> {
    let mut names = ptr::null_mut();
    // SAFETY: `env` and the values are the live napi_env and handles of the current call on the
    // JS thread (a `Val` never outlives the call it was read in); out-pointers are locals.
    let status = unsafe { sys::napi_get_property_names(self.env, self.raw, &mut names) };
    if status != sys::Status::napi_ok {
      clear_exception(self.env);
      return Err(CodedError::invalid_type("could not list the options' keys"));
    }
    let arr = Val { env: self.env, raw: names };
    (0..arr.len()?).map(|i| arr.index(i)?.get::<String>()).collect()
  }

  pub fn len(&self) -> Res<u32> {
    let mut n = 0u32;
    // SAFETY: `env` and the values are the live napi_env and handles of the current call on the
    // JS thread (a `Val` never outlives the call it was read in); out-pointers are locals.
    let status = unsafe { sys::napi_get_array_length(self.env, self.raw, &mut n) };
    if status != sys::Status::napi_ok {
      return Err(CodedError::internal("napi_get_array_length failed"));
    }
    Ok(n)
  }

  pub fn index(&self, i: u32) -> Res<Val> {
    let mut out = ptr::null_mut();
    // SAFETY: `env` and the values are the live napi_env and handles of the current call on the
    // JS thread (a `Val` never outlives the call it was read in); out-pointers are locals.
    let status = unsafe { sys::napi_get_element(self.env, self.raw, i, &mut out) };
    if status != sys::Status::napi_ok {
      clear_exception(self.env);
      return Err(CodedError::internal("napi_get_element failed"));
    }
    Ok(Val { env: self.env, raw: out })
  }

  pub fn is_undefined(&self) -> Res<bool> {
    Ok(self.ty()? == ValueType::Undefined)
  }
}

fn clear_exception(env: sys::napi_env) {
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
}

fn type_name(v: &Val) -> String {
  match v.ty() {
    Ok(ValueType::Object) if v.is_array() => "an array".into(),
    Ok(ValueType::Null) => "null".into(),
    Ok(ValueType::Undefined) => "undefined".into(),
    Ok(ValueType::Object) => "an object".into(),
    Ok(ValueType::String) => "a string".into(),
    Ok(ValueType::Number) => format!("the number {}", v.get::<f64>().unwrap_or(f64::NAN)),
    Ok(ValueType::Boolean) => "a boolean".into(),
    Ok(ValueType::Function) => "a function".into(),
    Ok(ValueType::BigInt) => "a bigint".into(),
    Ok(ValueType::Symbol) => "a symbol".into(),
    _ => "an unsupported value".into(),
  }
}

/// Reads an optional option bag: `undefined` is no options, anything but a plain object is an error.
pub fn option_bag(v: Option<Val>, what: &str, allowed: &[&str]) -> Res<Option<Val>> {
  let Some(v) = v else { return Ok(None) };
  match v.ty()? {
    ValueType::Undefined => Ok(None),
    ValueType::Object if !v.is_array() => {
      for k in v.keys()? {
        if !allowed.contains(&k.as_str()) {
          return Err(CodedError::invalid_type(format!("unknown option '{k}' for {what} (known options: {})", allowed.join(", "))));
        }
      }
      Ok(Some(v))
    }
    _ => Err(CodedError::invalid_type(format!("{what} options must be an object, got {}", type_name(&v)))),
  }
}

fn field(bag: Option<Val>, key: &str) -> Res<Option<Val>> {
  match bag {
    None => Ok(None),
    Some(b) => {
      let v = b.prop(key)?;
      if v.is_undefined()? {
        Ok(None)
      } else {
        Ok(Some(v))
      }
    }
  }
}

fn number(v: &Val, key: &str, expect: &str) -> Res<f64> {
  if v.ty()? != ValueType::Number {
    return Err(CodedError::invalid_type(format!("{key} must be {expect}, got {}", type_name(v))));
  }
  v.get::<f64>()
}

/// An integer option in `min..=max`.
pub fn int_in(bag: Option<Val>, key: &str, min: f64, max: f64) -> Res<Option<f64>> {
  field(bag, key)?.map(|v| int_value(&v, key, min, max)).transpose()
}

/// An array option of integers in `min..=max`, each named `key[i]` in the messages.
pub fn int_list(bag: Option<Val>, key: &str, min: f64, max: f64) -> Res<Option<Vec<f64>>> {
  let Some(v) = field(bag, key)? else { return Ok(None) };
  if !v.is_array() {
    return Err(CodedError::invalid_type(format!("{key} must be an array of integers, got {}", type_name(&v))));
  }
  (0..v.len()?).map(|i| int_value(&v.index(i)?, &format!("{key}[{i}]"), min, max)).collect::<Res<Vec<_>>>().map(Some)
}

fn int_value(v: &Val, key: &str, min: f64, max: f64) -> Res<f64> {
  let expect = if max >= MAX_SAFE_INTEGER { format!("an integer >= {min}") } else { format!("an integer in {min}..={max}") };
  let n = number(v, key, &expect)?;
  if !n.is_finite() || n.fract() != 0.0 || n < min || n > max {
    return Err(CodedError::out_of_range(format!("{key} must be {expect}, got {n}")));
  }
  Ok(n)
}

/// A required integer argument in `min..=max`.
pub fn int_arg(v: Option<Val>, key: &str, min: f64, max: f64) -> Res<f64> {
  match v {
    Some(v) if !v.is_undefined()? => int_value(&v, key, min, max),
    _ => Err(CodedError::invalid_type(format!("{key} must be an integer, got undefined"))),
  }
}

/// A finite number option for which `ok` holds (`expect` says what that is).
pub fn num(bag: Option<Val>, key: &str, expect: &str, ok: impl Fn(f64) -> bool) -> Res<Option<f64>> {
  num_named(bag, key, key, expect, ok)
}

/// [`num`] for `bag[key]`, named `name` in the messages (e.g. `adapters[0].scale`).
pub fn num_named(bag: Option<Val>, key: &str, name: &str, expect: &str, ok: impl Fn(f64) -> bool) -> Res<Option<f64>> {
  let Some(v) = field(bag, key)? else { return Ok(None) };
  let n = number(&v, name, expect)?;
  if !n.is_finite() || !ok(n) {
    return Err(CodedError::out_of_range(format!("{name} must be {expect}, got {n}")));
  }
  Ok(Some(n))
}

pub fn boolean(bag: Option<Val>, key: &str) -> Res<Option<bool>> {
  let Some(v) = field(bag, key)? else { return Ok(None) };
  if v.ty()? != ValueType::Boolean {
    return Err(CodedError::invalid_type(format!("{key} must be a boolean, got {}", type_name(&v))));
  }
  Ok(Some(v.get::<bool>()?))
}

/// A function option (a callback such as `onToken` or `onProgress`).
pub fn function(bag: Option<Val>, key: &str) -> Res<Option<Val>> {
  let Some(v) = field(bag, key)? else { return Ok(None) };
  if v.ty()? != ValueType::Function {
    return Err(CodedError::invalid_type(format!("{key} must be a function, got {}", type_name(&v))));
  }
  Ok(Some(v))
}

/// The `signal` option: an `AbortSignal` (wired up by `signal::attach`).
pub fn signal(bag: Option<Val>) -> Res<Option<Val>> {
  field(bag, "signal")?.map(check_signal).transpose()
}

pub fn string(v: &Val, key: &str) -> Res<String> {
  if v.ty()? != ValueType::String {
    return Err(CodedError::invalid_type(format!("{key} must be a string, got {}", type_name(v))));
  }
  v.get::<String>()
}

// ---------------------------------------------------------------------------------------------

/// `LLM.load(pathOrId)`.
pub fn path_or_id(v: Option<Val>) -> Res<String> {
  match v {
    Some(v) => string(&v, "pathOrId"),
    None => Err(CodedError::invalid_type("pathOrId must be a string, got undefined")),
  }
}

const LOAD_KEYS: &[&str] = &[
  "contextSize",
  "threads",
  "seed",
  "adapters",
  "download",
  "source",
  "onProgress",
  "onNotice",
  "signal",
  "diffusion",
  "learning",
  "gpu",
  "parallel",
  "prefixCacheMb",
  "kvCacheType",
];

const LEARNING_KEYS: &[&str] = &[
  "dir",
  "microRank",
  "baseRank",
  "microLr",
  "baseLr",
  "qualityGate",
  "microCandidates",
  "background",
  "backgroundMin",
  "roundSeconds",
  "epochs",
  "ewc",
  "ewcLambda",
  "microEwcLambda",
  "ewcDecay",
  "generalText",
  "maxSeq",
  "seed",
  "federate",
];

/// `LLM.load(_, { learning: { dir, ... } })`: SONA's options (see `ruvllm_sona::LearningOptions`).
pub fn learning_options(v: Option<Val>) -> Res<Option<ruvllm_sona::LearningOptions>> {
  let bag = option_bag(v, "LLM.load", LOAD_KEYS)?;
  let Some(l) = field(bag, "learning")? else { return Ok(None) };
  let bag = option_bag(Some(l), "learning", LEARNING_KEYS)?;
  let dir = match field(bag, "dir")? {
    Some(d) => string(&d, "learning.dir")?,
    None => return Err(CodedError::invalid_type("learning.dir must be a directory path, got undefined")),
  };
  if dir.is_empty() {
    return Err(CodedError::out_of_range("learning.dir must not be empty"));
  }
  let mut o = ruvllm_sona::LearningOptions::new(PathBuf::from(dir));
  let lr = |x: f64| x.is_finite() && x > 0.0 && x <= 1.0;
  let n = |k: &str, ok: &dyn Fn(f64) -> bool, expect: &str| nested("learning", num(bag, k, expect, ok));
  if let Some(v) = nested("learning", int_in(bag, "microRank", 1.0, 2.0))? {
    o.micro_rank = v as usize;
  }
  if let Some(v) = nested("learning", int_in(bag, "baseRank", 1.0, 64.0))? {
    o.base_rank = v as usize;
  }
  if let Some(v) = n("microLr", &lr, "a number in (0, 1]")? {
    o.micro_lr = v as f32;
  }
  if let Some(v) = n("baseLr", &lr, "a number in (0, 1]")? {
    o.base_lr = v as f32;
  }
  if let Some(v) = n("qualityGate", &|x| (0.0..=1.0).contains(&x), "a number in [0, 1]")? {
    o.quality_gate = v as f32;
  }
  if let Some(v) = nested("learning", int_in(bag, "microCandidates", 1.0, 4096.0))? {
    o.micro_candidates = v as usize;
  }
  if let Some(v) = nested("learning", boolean(bag, "background"))? {
    o.background = v;
  }
  if let Some(v) = nested("learning", int_in(bag, "backgroundMin", 1.0, 1e6))? {
    o.background_min = v as usize;
  }
  if let Some(v) = n("roundSeconds", &|x| x.is_finite() && x > 0.0 && x <= 86400.0, "a number of seconds in (0, 86400]")? {
    o.round_seconds = v;
  }
  if let Some(v) = nested("learning", int_in(bag, "epochs", 1.0, 100.0))? {
    o.epochs = v as usize;
  }
  if let Some(v) = nested("learning", boolean(bag, "ewc"))? {
    o.ewc = v;
  }
  if let Some(v) = n("ewcLambda", &|x| x.is_finite() && (0.0..=1e6).contains(&x), "a number in [0, 1e6]")? {
    o.ewc_lambda = v as f32;
  }
  if let Some(v) = n("microEwcLambda", &|x| x.is_finite() && (0.0..=1e6).contains(&x), "a number in [0, 1e6]")? {
    o.micro_ewc_lambda = v as f32;
  }
  if let Some(v) = n("ewcDecay", &|x| (0.0..1.0).contains(&x), "a number in [0, 1)")? {
    o.ewc_decay = v as f32;
  }
  if let Some(t) = field(bag, "generalText")? {
    if !t.is_array() {
      return Err(CodedError::invalid_type("learning.generalText must be an array of strings"));
    }
    o.general_text = (0..t.len()?).map(|i| string(&t.index(i)?, &format!("learning.generalText[{i}]"))).collect::<Res<_>>()?;
  }
  if let Some(v) = nested("learning", int_in(bag, "maxSeq", 16.0, 4096.0))? {
    o.max_seq = v as usize;
  }
  if let Some(v) = nested("learning", int_in(bag, "seed", 0.0, MAX_SAFE_INTEGER))? {
    o.seed = v as u64;
  }
  if let Some(v) = nested("learning", boolean(bag, "federate"))? {
    o.federate = v;
  }
  Ok(Some(o))
}

/// `llm.feedback(id, { quality, correction? })`.
pub fn feedback_options(v: Option<Val>) -> Res<(f32, Option<String>)> {
  let bag = option_bag(v, "feedback", &["quality", "correction"])?;
  let Some(q) = num(bag, "quality", "a number in [0, 1]", |x| (0.0..=1.0).contains(&x))? else {
    return Err(CodedError::invalid_type("feedback needs { quality } (a number in [0, 1])"));
  };
  let correction = match field(bag, "correction")? {
    Some(c) => Some(string(&c, "correction")?),
    None => None,
  };
  if correction.as_deref() == Some("") {
    return Err(CodedError::out_of_range("correction must not be empty"));
  }
  Ok((q as f32, correction))
}

/// `LLM.load(_, { diffusion: { adapter } })`: a path or a non-empty list of paths.
fn diffusion_load(v: Option<Val>) -> Res<Vec<PathBuf>> {
  let Some(v) = v else { return Ok(Vec::new()) };
  let bag = option_bag(Some(v), "diffusion", &["adapter"])?;
  let Some(a) = field(bag, "adapter")? else {
    return Err(CodedError::invalid_type("diffusion.adapter must be a path or a list of paths, got undefined"));
  };
  let paths = if a.is_array() {
    (0..a.len()?).map(|i| string(&a.index(i)?, &format!("diffusion.adapter[{i}]"))).collect::<Res<Vec<_>>>()?
  } else {
    vec![string(&a, "diffusion.adapter")?]
  };
  if paths.is_empty() || paths.iter().any(|p| p.is_empty()) {
    return Err(CodedError::out_of_range("diffusion.adapter must name at least one file, and no empty path"));
  }
  Ok(paths.into_iter().map(PathBuf::from).collect())
}

/// `LLM.load(_, opts)`.
/// `download`, `source`, `onProgress`, `onNotice` and `signal` are read by [`load_fetch_options`].
pub fn load_options(v: Option<Val>) -> Res<LoadOptions> {
  let bag = option_bag(v, "LLM.load", LOAD_KEYS)?;
  Ok(LoadOptions {
    adapters: crate::adapter::load_adapters(field(bag, "adapters")?)?,
    context_size: int_in(bag, "contextSize", 1.0, MAX_CONTEXT_SIZE as f64)?.map(|n| n as usize),
    threads: int_in(bag, "threads", 1.0, 1024.0)?.map(|n| n as usize),
    seed: int_in(bag, "seed", 0.0, MAX_SAFE_INTEGER)?.map(|n| n as u64),
    diffusion: diffusion_load(field(bag, "diffusion")?)?,
    gpu: gpu_mode(field(bag, "gpu")?)?,
    parallel: int_in(bag, "parallel", 1.0, ruvllm_core::engine::MAX_PARALLEL as f64)?.map(|n| n as usize),
    prefix_cache_mb: int_in(bag, "prefixCacheMb", 0.0, 1048576.0)?.map(|n| n as usize),
    kv_type: kv_cache_type(field(bag, "kvCacheType")?)?,
    merge_diffusion: None,
  })
}

/// `LLM.load(_, { kvCacheType })`: `'f16'`, `'q8_0'` or `'f32'`.
fn kv_cache_type(v: Option<Val>) -> Res<Option<KvType>> {
  let Some(v) = v else { return Ok(None) };
  if v.ty()? != ValueType::String {
    return Err(CodedError::invalid_type(format!("kvCacheType must be 'f16', 'q8_0' or 'f32', got {}", type_name(&v))));
  }
  let s = string(&v, "kvCacheType")?;
  KvType::parse(&s).map(Some).ok_or_else(|| CodedError::out_of_range(format!("kvCacheType must be 'f16', 'q8_0' or 'f32', got '{s}'")))
}

/// `LLM.load(_, { gpu })`: `'auto'` (default), `'cuda'`, or `false` (the CPU).
fn gpu_mode(v: Option<Val>) -> Res<GpuMode> {
  let Some(v) = v else { return Ok(GpuMode::Auto) };
  let bad = || CodedError::invalid_type(format!("gpu must be 'auto', 'cuda' or false, got {}", type_name(&v)));
  match v.ty()? {
    ValueType::Boolean => match v.get::<bool>()? {
      false => Ok(GpuMode::Off),
      true => Err(bad()),
    },
    ValueType::String => match string(&v, "gpu")?.as_str() {
      "auto" => Ok(GpuMode::Auto),
      "cuda" => Ok(GpuMode::Cuda),
      other => Err(CodedError::out_of_range(format!("gpu must be 'auto', 'cuda' or false, got '{other}'"))),
    },
    _ => Err(bad()),
  }
}

/// The model manager's options: where a model may come from and how the caller follows it.
pub struct FetchOptions {
  pub source: ruvllm_models::Source,
  /// Whether a missing model may be downloaded (`download`, default true).
  pub download: bool,
  pub on_progress: Option<Val>,
  pub on_notice: Option<Val>,
  pub signal: Option<Val>,
}

fn fetch_options(v: Option<Val>, what: &str, allowed: &[&str]) -> Res<FetchOptions> {
  let bag = option_bag(v, what, allowed)?;
  let source = match field(bag, "source")? {
    Some(s) => string(&s, "source")?.parse::<ruvllm_models::Source>()?,
    None => ruvllm_models::Source::Auto,
  };
  Ok(FetchOptions {
    source,
    download: boolean(bag, "download")?.unwrap_or(true),
    on_progress: function(bag, "onProgress")?,
    on_notice: function(bag, "onNotice")?,
    signal: signal(bag)?,
  })
}

/// `models.download(_, opts)`.
pub fn download_options(v: Option<Val>) -> Res<FetchOptions> {
  fetch_options(v, "models.download", &["source", "onProgress", "onNotice", "signal"])
}

/// `models.resolve(_, opts)`.
pub fn resolve_options(v: Option<Val>) -> Res<FetchOptions> {
  fetch_options(v, "models.resolve", &["download", "source", "onProgress", "onNotice", "signal"])
}

/// The model manager's part of `LLM.load(_, opts)`.
pub fn load_fetch_options(v: Option<Val>) -> Res<FetchOptions> {
  fetch_options(v, "LLM.load", LOAD_KEYS)
}

/// `llm.tokenize(_, opts)`.
/// `llm.tokenize(_, opts)`: whether to add special tokens (text), the chat template and the
/// tools (chat messages).
pub fn tokenize_options(v: Option<Val>) -> Res<(bool, Option<String>, Vec<Tool>)> {
  let bag = option_bag(v, "tokenize", &["addSpecial", "chatTemplate", "tools"])?;
  Ok((boolean(bag, "addSpecial")?.unwrap_or(true), chat_template_opt(bag)?, tool_options(bag)?.0))
}

/// `llm.tokenize(text)`.
pub fn text_arg(v: Option<Val>, key: &str) -> Res<String> {
  match v {
    Some(v) => string(&v, key),
    None => Err(CodedError::invalid_type(format!("{key} must be a string, got undefined"))),
  }
}

/// `llm.detokenize(tokens)`: an array of token ids (integers in 0..vocabSize).
pub fn token_ids(v: Option<Val>, vocab_size: usize) -> Res<Vec<u32>> {
  named_token_ids(v, vocab_size, "tokens")
}

/// [`token_ids`] with the argument's name for the messages.
fn named_token_ids(v: Option<Val>, vocab_size: usize, name: &str) -> Res<Vec<u32>> {
  let Some(v) = v else { return Err(CodedError::invalid_type(format!("{name} must be an array of token ids, got undefined"))) };
  if !v.is_array() {
    return Err(CodedError::invalid_type(format!("{name} must be an array of token ids, got {}", type_name(&v))));
  }
  let n = v.len()?;
  let mut out = Vec::with_capacity(n as usize);
  for i in 0..n {
    let e = v.index(i)?;
    let key = format!("{name}[{i}]");
    let x = number(&e, &key, "a token id")?;
    if x.fract() != 0.0 || x < 0.0 || x >= vocab_size as f64 {
      return Err(CodedError::out_of_range(format!("{key} must be a token id in 0..{vocab_size}, got {x}")));
    }
    out.push(x as u32);
  }
  Ok(out)
}

/// `generate(prompt)`: a string, a non-empty array of `{ role, content }`, or a non-empty array
/// of token ids (used as given: no BOS is added).
pub fn prompt(v: Option<Val>, vocab_size: usize) -> Res<Prompt> {
  const EXPECT: &str = "prompt must be a string, an array of { role, content } chat messages or an array of token ids";
  let Some(v) = v else { return Err(CodedError::invalid_type(format!("{EXPECT}, got undefined"))) };
  match v.ty()? {
    ValueType::String => Ok(Prompt::Text(v.get::<String>()?)),
    ValueType::Object if v.is_array() => {
      let n = v.len()?;
      if n == 0 {
        return Err(CodedError::out_of_range("prompt must not be an empty array"));
      }
      if v.index(0)?.ty()? == ValueType::Number {
        return Ok(Prompt::Tokens(named_token_ids(Some(v), vocab_size, "prompt")?));
      }
      let mut msgs = Vec::with_capacity(n as usize);
      for i in 0..n {
        let m = v.index(i)?;
        if m.ty()? != ValueType::Object || m.is_array() {
          return Err(CodedError::invalid_type(format!("prompt[{i}] must be a {{ role, content }} object, got {}", type_name(&m))));
        }
        let role = string(&m.prop("role")?, &format!("prompt[{i}].role"))?;
        if role.is_empty() {
          return Err(CodedError::out_of_range(format!("prompt[{i}].role must not be empty")));
        }
        msgs.push(chat_message(&m, i, role)?);
      }
      Ok(Prompt::Chat(msgs))
    }
    _ => Err(CodedError::invalid_type(format!("{EXPECT}, got {}", type_name(&v)))),
  }
}

/// One chat message: `{ role, content, toolCalls?, toolCallId?, name? }`; `content` may be
/// left out (or null) on an assistant message that only calls tools.
fn chat_message(m: &Val, i: u32, role: String) -> Res<ChatMessage> {
  let tool_calls = match m.prop("toolCalls")?.ty()? {
    ValueType::Undefined | ValueType::Null => Vec::new(),
    _ => {
      let v = json(&m.prop("toolCalls")?)?;
      let calls = v.as_array().ok_or_else(|| CodedError::invalid_type(format!("prompt[{i}].toolCalls must be an array of {{ id, name, arguments }}")))?;
      let mut out = Vec::with_capacity(calls.len());
      for (j, c) in calls.iter().enumerate() {
        let field = |k: &str| c.get(k).and_then(serde_json::Value::as_str).map(str::to_string);
        let (Some(id), Some(name), Some(arguments)) = (field("id"), field("name"), field("arguments")) else {
          return Err(CodedError::invalid_type(format!("prompt[{i}].toolCalls[{j}] must be {{ id, name, arguments }} strings")));
        };
        out.push(ruvllm_core::structured::ToolCall { id, name, arguments });
      }
      out
    }
  };
  let optional = |key: &str| -> Res<Option<String>> {
    let v = m.prop(key)?;
    match v.ty()? {
      ValueType::Undefined | ValueType::Null => Ok(None),
      _ => string(&v, &format!("prompt[{i}].{key}")).map(Some),
    }
  };
  let content = match optional("content")? {
    Some(c) => c,
    None if !tool_calls.is_empty() => String::new(),
    None => return Err(CodedError::invalid_type(format!("prompt[{i}].content must be a string, got undefined"))),
  };
  let mut msg = ChatMessage::new(role, content);
  msg.tool_calls = tool_calls;
  msg.tool_call_id = optional("toolCallId")?;
  msg.name = optional("name")?;
  Ok(msg)
}

/// A plain JS value (object, array, string...) as JSON.
fn json(v: &Val) -> Res<serde_json::Value> {
  v.get::<serde_json::Value>()
}

/// `responseFormat` and `grammar` (at most one): the output constraint.
fn constraint_options(bag: Option<Val>) -> Res<Option<Constraint>> {
  let format = match field(bag, "responseFormat")? {
    None => None,
    Some(v) => {
      if v.ty()? != ValueType::Object || v.is_array() {
        return Err(CodedError::invalid_type(format!(
          "responseFormat must be {{ type: 'json_object' }} or {{ type: 'json_schema', schema }}, got {}",
          type_name(&v)
        )));
      }
      Constraint::from_response_format(&json(&v)?, "responseFormat")?
    }
  };
  let grammar = match field(bag, "grammar")? {
    None => None,
    Some(v) => Some(match v.ty()? {
      ValueType::String => Constraint::Gbnf(string(&v, "grammar")?),
      ValueType::Object if !v.is_array() => {
        let g = option_bag(Some(v), "grammar", &["lark", "gbnf"])?;
        match (field(g, "lark")?, field(g, "gbnf")?) {
          (Some(l), None) => Constraint::Lark(string(&l, "grammar.lark")?),
          (None, Some(b)) => Constraint::Gbnf(string(&b, "grammar.gbnf")?),
          _ => return Err(CodedError::invalid_type("grammar must have exactly one of lark or gbnf")),
        }
      }
      _ => return Err(CodedError::invalid_type(format!("grammar must be a GBNF string, {{ gbnf }} or {{ lark }}, got {}", type_name(&v)))),
    }),
  };
  match (format, grammar) {
    (Some(_), Some(_)) => Err(CodedError::out_of_range("give responseFormat or grammar, not both")),
    (f, g) => Ok(f.or(g)),
  }
}

/// `tools` (OpenAI function tools) and `toolChoice`.
fn tool_options(bag: Option<Val>) -> Res<(Vec<Tool>, ToolChoice)> {
  let tools = match field(bag, "tools")? {
    None => Vec::new(),
    Some(v) => {
      if !v.is_array() {
        return Err(CodedError::invalid_type(format!("tools must be an array of {{ type: 'function', function }}, got {}", type_name(&v))));
      }
      let list = json(&v)?;
      let items = list.as_array().map(Vec::as_slice).unwrap_or_default();
      items.iter().enumerate().map(|(i, t)| Tool::from_openai(t, &format!("tools[{i}]"))).collect::<Result<Vec<_>, _>>()?
    }
  };
  let choice = match field(bag, "toolChoice")? {
    None => ToolChoice::Auto,
    Some(v) => ToolChoice::from_openai(&json(&v)?, "toolChoice")?,
  };
  Ok((tools, choice))
}

pub const GENERATE_KEYS: &[&str] = &[
  "maxTokens",
  "temperature",
  "topK",
  "topP",
  "minP",
  "repeatPenalty",
  "presencePenalty",
  "frequencyPenalty",
  "repeatLastN",
  "seed",
  "stop",
  "signal",
  "chatTemplate",
  "onToken",
  "adapters",
  "diffusion",
  "onStep",
  "responseFormat",
  "grammar",
  "tools",
  "toolChoice",
  "logprobs",
  "topLogprobs",
];

/// The parts of a generate option bag that are JS objects, for the caller to wire up.
pub struct JsHooks {
  pub signal: Option<Val>,
  pub on_token: Option<Val>,
  /// The `adapters` option, read by `adapter::request_adapters`.
  pub adapters: Option<Val>,
  pub on_step: Option<Val>,
}

/// Errors about a key of a nested bag name it with the bag: `diffusion.steps must be ...`.
fn nested<T>(bag: &str, r: Res<T>) -> Res<T> {
  r.map_err(|mut e| {
    e.message = format!("{bag}.{}", e.message);
    e
  })
}

/// The `diffusion` option of `generate` / `stream`.
fn diffusion_options(v: Option<Val>) -> Res<Option<DiffusionParams>> {
  let Some(v) = v else { return Ok(None) };
  let bag = option_bag(Some(v), "diffusion", &["steps", "blockSize", "threshold", "schedule", "remasking", "noRepeatNgram", "reuseRows"])?;
  let d = DiffusionParams::default();
  let p = nested(
    "diffusion",
    (|| {
      let steps = int_in(bag, "steps", 1.0, MAX_CONTEXT_SIZE as f64)?.map(|n| n as usize);
      let block_size = int_in(bag, "blockSize", 1.0, 512.0)?.map_or(d.block_size, |n| n as usize);
      let threshold = num(bag, "threshold", "a number in (0, 1)", |x| x > 0.0 && x < 1.0)?.map(|x| x as f32);
      let word = |key: &str, allowed: &[&str]| -> Res<Option<String>> {
        let Some(v) = field(bag, key)? else { return Ok(None) };
        let s = string(&v, key)?;
        if !allowed.contains(&s.as_str()) {
          return Err(CodedError::out_of_range(format!("{key} must be one of {}, got {s:?}", allowed.join(", "))));
        }
        Ok(Some(s))
      };
      let schedule = match word("schedule", &["linear", "cosine"])?.as_deref() {
        Some("cosine") => Schedule::Cosine,
        _ => Schedule::Linear,
      };
      let remasking = match word("remasking", &["confidence", "random"])?.as_deref() {
        Some("random") => Remasking::Random,
        _ => Remasking::Confidence,
      };
      let no_repeat_ngram = int_in(bag, "noRepeatNgram", 0.0, 64.0)?.map_or(d.no_repeat_ngram, |n| n as usize);
      let reuse_rows = boolean(bag, "reuseRows")?.unwrap_or(d.reuse_rows);
      Ok(DiffusionParams { steps, block_size, threshold, schedule, remasking, no_repeat_ngram, reuse_rows })
    })(),
  )?;
  Ok(Some(p))
}

/// The `chatTemplate` option: a non-empty Jinja template, or none.
fn chat_template_opt(bag: Option<Val>) -> Res<Option<String>> {
  match field(bag, "chatTemplate")? {
    None => Ok(None),
    Some(v) => {
      let s = string(&v, "chatTemplate")?;
      if s.trim().is_empty() {
        return Err(CodedError::out_of_range("chatTemplate must be a non-empty Jinja template"));
      }
      Ok(Some(s))
    }
  }
}

/// `score(_, opts)`: `{ chatTemplate?, signal?, adapters? }` (the adapters for
/// `adapter::request_adapters`).
/// `score(_, opts)`'s parts: chat template, signal, adapters (for `adapter::request_adapters`), ELBO.
pub type ParsedScoreOptions = (Option<String>, Option<Val>, Option<Val>, Option<ElboParams>);

pub fn score_options(v: Option<Val>) -> Res<ParsedScoreOptions> {
  let bag = option_bag(v, "score", &["chatTemplate", "signal", "adapters", "elbo"])?;
  let elbo = match field(bag, "elbo")? {
    None => None,
    Some(v) => {
      let e = option_bag(Some(v), "elbo", &["samples", "seed"])?;
      let (samples, seed) = nested("elbo", (|| Ok((int_in(e, "samples", 1.0, 1024.0)?, int_in(e, "seed", 0.0, MAX_SAFE_INTEGER)?)))())?;
      Some(ElboParams { samples: samples.map_or(8, |n| n as usize), seed: seed.map_or(0, |n| n as u64) })
    }
  };
  Ok((chat_template_opt(bag)?, signal(bag)?, field(bag, "adapters")?, elbo))
}

/// `generate(_, opts)` / `stream(_, opts)`.
pub fn generate_options(v: Option<Val>, context: usize, default_seed: Option<u64>) -> Res<(GenerateParams, JsHooks)> {
  let bag = option_bag(v, "generate", GENERATE_KEYS)?;
  let max_tokens = int_in(bag, "maxTokens", 1.0, context.max(1) as f64)?.map(|n| n as usize).unwrap_or(DEFAULT_MAX_TOKENS.min(context.max(1)));
  let d = SamplingParams::default();
  let temperature = num(bag, "temperature", "a finite number >= 0", |x| x >= 0.0)?.map_or(d.temperature, |x| x as f32);
  let top_k = int_in(bag, "topK", 0.0, MAX_SAFE_INTEGER)?.map_or(d.top_k, |n| n as usize);
  let top_p = num(bag, "topP", "a number in (0, 1]", |x| x > 0.0 && x <= 1.0)?.map_or(d.top_p, |x| x as f32);
  let min_p = num(bag, "minP", "a number in [0, 1]", |x| (0.0..=1.0).contains(&x))?.map_or(d.min_p, |x| x as f32);
  let repeat_penalty = num(bag, "repeatPenalty", "a finite number > 0", |x| x > 0.0)?.map_or(d.repeat_penalty, |x| x as f32);
  let presence_penalty = num(bag, "presencePenalty", "a finite number", |_| true)?.map_or(d.presence_penalty, |x| x as f32);
  let frequency_penalty = num(bag, "frequencyPenalty", "a finite number", |_| true)?.map_or(d.frequency_penalty, |x| x as f32);
  let repeat_last_n = int_in(bag, "repeatLastN", 0.0, MAX_SAFE_INTEGER)?.map_or(d.repeat_last_n, |n| n as usize);
  let seed = match int_in(bag, "seed", 0.0, MAX_SAFE_INTEGER)? {
    Some(s) => s as u64,
    None => default_seed.unwrap_or_else(random_seed),
  };
  let stop = stop_strings(field(bag, "stop")?)?;
  let chat_template = chat_template_opt(bag)?;
  let signal = signal(bag)?;
  let on_token = function(bag, "onToken")?;
  let sampling = SamplingParams { temperature, top_k, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty, repeat_last_n, seed };
  let adapters = field(bag, "adapters")?;
  let diffusion = diffusion_options(field(bag, "diffusion")?)?;
  let on_step = function(bag, "onStep")?;
  let constraint = constraint_options(bag)?;
  let (tools, tool_choice) = tool_options(bag)?;
  let logprobs = logprob_options(bag)?;
  Ok((
    GenerateParams { max_tokens, sampling, stop, chat_template, diffusion, constraint, tools, tool_choice, logprobs },
    JsHooks { signal, on_token, adapters, on_step },
  ))
}

/// `logprobs` (a boolean) and `topLogprobs` (0..=20, which implies `logprobs`): how many
/// alternatives each token's log-probability comes with, `None` for none.
fn logprob_options(bag: Option<Val>) -> Res<Option<usize>> {
  let top = int_in(bag, "topLogprobs", 0.0, MAX_TOP_LOGPROBS as f64)?.map(|n| n as usize);
  match (boolean(bag, "logprobs")?, top) {
    (Some(false), Some(_)) => Err(CodedError::out_of_range("topLogprobs needs logprobs: true (or no logprobs option)")),
    (Some(false), None) | (None, None) => Ok(None),
    (_, top) => Ok(Some(top.unwrap_or(0))),
  }
}

fn stop_strings(v: Option<Val>) -> Res<Vec<String>> {
  let Some(v) = v else { return Ok(Vec::new()) };
  let one = |v: &Val, key: &str| -> Res<String> {
    let s = string(v, key)?;
    if s.is_empty() {
      return Err(CodedError::out_of_range(format!("{key} must be a non-empty string")));
    }
    Ok(s)
  };
  match v.ty()? {
    ValueType::String => Ok(vec![one(&v, "stop")?]),
    ValueType::Object if v.is_array() => (0..v.len()?).map(|i| one(&v.index(i)?, &format!("stop[{i}]"))).collect(),
    _ => Err(CodedError::invalid_type(format!("stop must be a string or an array of strings, got {}", type_name(&v)))),
  }
}

fn check_signal(v: Val) -> Res<Val> {
  let bad = || CodedError::invalid_type(format!("signal must be an AbortSignal, got {}", type_name(&v)));
  if v.ty()? != ValueType::Object {
    return Err(bad());
  }
  if v.prop("aborted")?.ty()? != ValueType::Boolean || v.prop("addEventListener")?.ty()? != ValueType::Function {
    return Err(bad());
  }
  Ok(v)
}

fn random_seed() -> u64 {
  use std::collections::hash_map::RandomState;
  use std::hash::{BuildHasher, Hasher};
  let mut h = RandomState::new().build_hasher();
  h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
  h.finish() & ((1u64 << 53) - 1)
}

/// `createServer(opts)` without its `model` (read by the caller: an `LLM` or a path/id) and its
/// `load` bag (`LLM.load`'s options, for a model given by path or id).
pub struct ServerArgs {
  pub model: Val,
  pub load: Option<Val>,
  pub opts: ruvllm_server::ServerOptions,
  /// `name`, when given; else the caller names the model.
  pub name: Option<String>,
}

const SERVER_KEYS: &[&str] = &["model", "load", "name", "host", "port", "apiKey", "parallel", "maxQueue", "maxBodyBytes", "chatTemplate", "stop", "cors"];

/// `createServer(opts)`.
pub fn server_options(v: Option<Val>) -> Res<ServerArgs> {
  let bag = option_bag(v, "createServer", SERVER_KEYS)?;
  let model = field(bag, "model")?.ok_or_else(|| CodedError::invalid_type("createServer needs a model: an LLM, a path to a .gguf or a model id"))?;
  let text = |key: &str| field(bag, key)?.map(|v| string(&v, key)).transpose();
  let d = ruvllm_server::ServerOptions::default();
  let opts = ruvllm_server::ServerOptions {
    host: text("host")?.unwrap_or(d.host),
    port: int_in(bag, "port", 0.0, 65535.0)?.map(|n| n as u16).unwrap_or(d.port),
    api_key: text("apiKey")?.filter(|k| !k.is_empty()),
    parallel: int_in(bag, "parallel", 1.0, 4096.0)?.map(|n| n as usize).unwrap_or(d.parallel),
    max_queue: int_in(bag, "maxQueue", 0.0, 1_000_000.0)?.map(|n| n as usize).unwrap_or(d.max_queue),
    max_body_bytes: int_in(bag, "maxBodyBytes", 1.0, MAX_SAFE_INTEGER)?.map(|n| n as usize).unwrap_or(d.max_body_bytes),
    chat_template: text("chatTemplate")?,
    chat_stops: stop_strings(field(bag, "stop")?)?,
    // Checked by the server when it starts (`*` or origins), so both callers share one message.
    cors: text("cors")?,
    ..d
  };
  Ok(ServerArgs { model, load: field(bag, "load")?, opts, name: text("name")? })
}

// ---------------------------------------------------------------------------------------------

const FEDERATION_KEYS: &[&str] = &[
  "peers",
  "listen",
  "tier",
  "key",
  "nodeKey",
  "members",
  "expectedNodes",
  "roundTimeoutMs",
  "keepRounds",
  "method",
  "globalRank",
  "serverLr",
  "weighting",
  "topic",
  "kAnonymity",
  "epsilon",
  "delta",
  "rounds",
  "clip",
];

/// `llm.federation.join({ ... })`, checked on the JS thread.
pub struct FederationArgs {
  pub peers: Vec<String>,
  pub listen: Option<String>,
  pub tier: ruvllm_daf::update::Tier,
  pub key: Option<[u8; 32]>,
  pub node_key: Option<[u8; 32]>,
  pub members: Vec<[u8; 32]>,
  pub expected_nodes: Option<usize>,
  pub round_timeout_ms: Option<u64>,
  /// Rounds whose updates the node holds for peers' catch-up (default 2).
  pub keep_rounds: Option<usize>,
  /// `fedavg`, `exact` or `svd` (checked here; resolved against the adapter's rank at join).
  pub method: String,
  /// Most components per projection the global adapter keeps (default 64).
  pub global_rank: usize,
  /// Server learning rate (default 1: the exact mean).
  pub server_lr: f64,
  pub weighting: ruvllm_daf::weighting::Weighting,
  pub topic: Option<String>,
  pub k_anonymity: Option<usize>,
  pub epsilon: Option<f64>,
  pub delta: Option<f64>,
  pub rounds: Option<u64>,
  pub clip: Option<f64>,
}

/// 32 bytes written as 64 hex digits (a key or a node id).
pub fn hex32(s: &str, key: &str) -> Res<[u8; 32]> {
  let s = s.trim();
  let bad = || CodedError::out_of_range(format!("{key} must be 32 bytes as 64 hex digits, got {} characters", s.len()));
  if s.len() != 64 || !s.is_ascii() {
    return Err(bad());
  }
  let mut out = [0u8; 32];
  for (i, b) in out.iter_mut().enumerate() {
    *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
  }
  Ok(out)
}

fn strings(bag: Option<Val>, key: &str) -> Res<Option<Vec<String>>> {
  let Some(v) = field(bag, key)? else { return Ok(None) };
  if !v.is_array() {
    return Err(CodedError::invalid_type(format!("{key} must be an array of strings, got {}", type_name(&v))));
  }
  (0..v.len()?).map(|i| string(&v.index(i)?, &format!("{key}[{i}]"))).collect::<Res<Vec<_>>>().map(Some)
}

fn opt_string(bag: Option<Val>, key: &str) -> Res<Option<String>> {
  field(bag, key)?.map(|v| string(&v, key)).transpose()
}

pub fn federation_options(v: Option<Val>) -> Res<FederationArgs> {
  let Some(bag) = option_bag(v, "federation.join", FEDERATION_KEYS)? else {
    return Err(CodedError::invalid_type("federation.join needs { peers, tier }"));
  };
  let bag = Some(bag);
  let Some(peers) = strings(bag, "peers")? else {
    return Err(CodedError::invalid_type("peers must be an array of multiaddrs (may be empty), got undefined"));
  };
  let tier = match opt_string(bag, "tier")? {
    Some(t) => ruvllm_daf::update::Tier::parse(&t).map_err(|e| CodedError::out_of_range(format!("tier: {e}")))?,
    None => return Err(CodedError::invalid_type("tier must be 'private', 'group', 'tenant' or 'public', got undefined")),
  };
  let key = opt_string(bag, "key")?.map(|k| hex32(&k, "key")).transpose()?;
  let node_key = opt_string(bag, "nodeKey")?.map(|k| hex32(&k, "nodeKey")).transpose()?;
  let members = strings(bag, "members")?.unwrap_or_default().iter().enumerate().map(|(i, m)| hex32(m, &format!("members[{i}]"))).collect::<Res<Vec<_>>>()?;
  let method = opt_string(bag, "method")?.unwrap_or_else(|| "exact".into());
  if !["fedavg", "exact", "svd"].contains(&method.as_str()) {
    return Err(CodedError::out_of_range(format!("method must be 'fedavg', 'exact' or 'svd', got '{method}'")));
  }
  let weighting = match opt_string(bag, "weighting")? {
    Some(w) => ruvllm_daf::weighting::Weighting::parse(&w)
      .ok_or_else(|| CodedError::out_of_range(format!("weighting must be 'fedavg', 'quality', 'timestep' or 'hybrid', got '{w}'")))?,
    None => ruvllm_daf::weighting::Weighting::FedAvg,
  };
  let prob = |x: f64| x > 0.0 && x < 1.0;
  Ok(FederationArgs {
    peers,
    listen: opt_string(bag, "listen")?,
    tier,
    key,
    node_key,
    members,
    expected_nodes: int_in(bag, "expectedNodes", 1.0, 10_000.0)?.map(|n| n as usize),
    round_timeout_ms: int_in(bag, "roundTimeoutMs", 1.0, 86_400_000.0)?.map(|n| n as u64),
    keep_rounds: int_in(bag, "keepRounds", 1.0, 1_000_000.0)?.map(|n| n as usize),
    method,
    global_rank: int_in(bag, "globalRank", 1.0, 256.0)?.map(|n| n as usize).unwrap_or(64),
    server_lr: num(bag, "serverLr", "a number in (0, 10]", |x| x > 0.0 && x <= 10.0)?.unwrap_or(1.0),
    weighting,
    topic: opt_string(bag, "topic")?,
    k_anonymity: int_in(bag, "kAnonymity", 1.0, 10_000.0)?.map(|n| n as usize),
    epsilon: num(bag, "epsilon", "a number > 0", |x| x > 0.0)?,
    delta: num(bag, "delta", "a number in (0, 1)", prob)?,
    rounds: int_in(bag, "rounds", 1.0, 1e9)?.map(|n| n as u64),
    clip: num(bag, "clip", "a number > 0", |x| x > 0.0)?,
  })
}
