//! The `Adapter` class (a LoRA adapter loaded for one `LLM`) and the `adapters` options that
//! name adapters: `LLM.load(_, { adapters: [{ path, scale? }] })` and the per-request
//! `adapters: [adapter, { adapter, scale }]` of `generate`, `stream` and `score`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use napi::bindgen_prelude::{ClassInstance, FromNapiValue};
use napi::{Env, ValueType};
use napi_derive::napi;

use ruvllm_core::nn::lora::AdapterFormat;
use ruvllm_core::nn::{AdapterSet, LoraAdapter};

use crate::error::{CodedError, Res};
use crate::options::{self, Val};

/// A LoRA adapter loaded for one model with `llm.loadAdapter(path)`. Pass it in a request's
/// `adapters` option to apply it to that request only; the base model is not changed.
#[napi]
pub struct Adapter {
  inner: Mutex<Option<Arc<LoraAdapter>>>,
  /// Identifies the model it was loaded for.
  pub(crate) owner: usize,
  id: String,
  rank: u32,
  targets: Vec<String>,
  path: String,
  format: String,
  scale: f64,
}

impl Adapter {
  pub(crate) fn new(inner: Arc<LoraAdapter>, owner: usize, scale: f64) -> Self {
    Adapter {
      id: format!("lora-{}", inner.id),
      rank: inner.rank as u32,
      targets: inner.targets.iter().map(|p| p.hf_name().to_string()).collect(),
      path: inner.path.display().to_string(),
      format: match inner.format {
        AdapterFormat::Gguf => "gguf".into(),
        AdapterFormat::Peft => "peft".into(),
        AdapterFormat::Learned => "learned".into(),
      },
      inner: Mutex::new(Some(inner)),
      owner,
      scale,
    }
  }

  fn get(&self) -> Res<Arc<LoraAdapter>> {
    self.inner.lock().unwrap_or_else(|e| e.into_inner()).clone().ok_or_else(|| CodedError::invalid_type(format!("adapter {} was unloaded", self.id)))
  }
}

#[napi]
impl Adapter {
  /// Unique id of this loaded adapter, e.g. `'lora-3'`.
  #[napi(getter)]
  pub fn id(&self) -> String {
    self.id.clone()
  }

  /// The largest rank of its low-rank factors.
  #[napi(getter)]
  pub fn rank(&self) -> u32 {
    self.rank
  }

  /// The projections it changes, as PEFT names them: `q_proj`, `k_proj`, `v_proj`, `o_proj`,
  /// `gate_proj`, `up_proj`, `down_proj`.
  #[napi(getter)]
  pub fn targets(&self) -> Vec<String> {
    self.targets.clone()
  }

  /// The file it was loaded from.
  #[napi(getter)]
  pub fn path(&self) -> String {
    self.path.clone()
  }

  /// `'gguf'` (llama.cpp LoRA GGUF) or `'peft'` (adapter_model.safetensors).
  #[napi(getter)]
  pub fn format(&self) -> String {
    self.format.clone()
  }

  /// The scale it is applied with when a request names it without one (`loadAdapter`'s
  /// `scale`, default 1).
  #[napi(getter)]
  pub fn scale(&self) -> f64 {
    self.scale
  }

  /// False after `unload()`.
  #[napi(getter)]
  pub fn loaded(&self) -> bool {
    self.inner.lock().unwrap_or_else(|e| e.into_inner()).is_some()
  }

  /// Frees the adapter (requests already running keep it until they end); a request that names
  /// it afterwards is rejected with `ERR_INVALID_ARG`. Unloading twice does nothing.
  #[napi]
  pub fn unload(&self) {
    self.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
  }
}

/// `bag.scale`: absent, or a finite number (`key` names the bag in the message).
fn scale_of(bag: Val, key: &str) -> Res<Option<f64>> {
  options::num_named(Some(bag), "scale", &format!("{key}.scale"), "a finite number", |_| true)
}

/// `LLM.load`'s `adapters`: `[{ path, scale? }]` (or path strings).
pub(crate) fn load_adapters(v: Option<Val>) -> Res<Vec<(PathBuf, f32)>> {
  let Some(v) = v else { return Ok(Vec::new()) };
  if !v.is_array() {
    return Err(CodedError::invalid_type("adapters must be an array of { path, scale? }"));
  }
  let mut out = Vec::new();
  for i in 0..v.len()? {
    let e = v.index(i)?;
    let key = format!("adapters[{i}]");
    match e.ty()? {
      ValueType::String => out.push((PathBuf::from(e.get::<String>()?), 1.0)),
      ValueType::Object if !e.is_array() => {
        let bag =
          options::option_bag(Some(e), &key, &["path", "scale"])?.ok_or_else(|| CodedError::invalid_type(format!("{key} must be {{ path, scale? }}")))?;
        let path = options::string(&bag.prop("path")?, &format!("{key}.path"))?;
        if path.is_empty() {
          return Err(CodedError::out_of_range(format!("{key}.path must not be empty")));
        }
        let scale = scale_of(bag, &key)?.unwrap_or(1.0);
        out.push((PathBuf::from(path), scale as f32));
      }
      _ => return Err(CodedError::invalid_type(format!("{key} must be {{ path, scale? }} or a path string"))),
    }
  }
  Ok(out)
}

/// A request's `adapters`: `[adapter | { adapter, scale? }]`, each loaded for the model
/// `owner`; `[]` applies none (not even the load-time ones). `None` when the option is absent.
pub(crate) fn request_adapters(env: &Env, v: Option<Val>, owner: usize) -> Res<Option<AdapterSet>> {
  let Some(v) = v else { return Ok(None) };
  if v.ty()? == ValueType::String {
    return match v.get::<String>()?.as_str() {
      "auto" => Ok(Some(AdapterSet::auto())),
      other => Err(CodedError::out_of_range(format!("adapters must be 'auto' or an array of adapters, got '{other}'"))),
    };
  }
  if !v.is_array() {
    return Err(CodedError::invalid_type("adapters must be 'auto' or an array of Adapter objects (from llm.loadAdapter) or { adapter, scale }"));
  }
  let mut out = Vec::new();
  for i in 0..v.len()? {
    let e = v.index(i)?;
    let key = format!("adapters[{i}]");
    let bad = || CodedError::invalid_type(format!("{key} must be an Adapter (from llm.loadAdapter) or {{ adapter, scale? }}"));
    if e.ty()? != ValueType::Object || e.is_array() {
      return Err(bad());
    }
    // An Adapter, or { adapter, scale }.
    // SAFETY: a napi value of the current call on the JS thread; `from_napi_value` checks its type
    // and returns an error for anything else.
    let (inst, scale) = match unsafe { ClassInstance::<Adapter>::from_napi_value(env.raw(), e.raw) } {
      Ok(a) => (a, None),
      Err(_) => {
        let bag = options::option_bag(Some(e), &key, &["adapter", "scale"])?.ok_or_else(bad)?;
        let a = bag.prop("adapter")?;
        // SAFETY: a napi value of the current call on the JS thread; `from_napi_value` checks its type
        // and returns an error for anything else.
        let inst = unsafe { ClassInstance::<Adapter>::from_napi_value(env.raw(), a.raw) }.map_err(|_| bad())?;
        (inst, scale_of(bag, &key)?)
      }
    };
    if inst.owner != owner {
      return Err(CodedError::invalid_type(format!("{key} was loaded for another model")));
    }
    out.push((inst.get()?, scale.unwrap_or(inst.scale) as f32));
  }
  Ok(Some(AdapterSet::new(out)))
}

/// Validates `loadAdapter`'s options: `{ scale? }`.
pub(crate) fn load_adapter_options(env: &Env, v: &napi::bindgen_prelude::Unknown) -> Res<f64> {
  let bag = options::option_bag(Some(Val::new(env, v)), "loadAdapter", &["scale"])?;
  match bag {
    Some(b) => Ok(scale_of(b, "loadAdapter")?.unwrap_or(1.0)),
    None => Ok(1.0),
  }
}
