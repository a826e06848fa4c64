//! `learning`: what `ruvllm learn status|export|reset --dir …` does to a learning directory
//! without loading a model (static methods; the class is never instantiated). Loading a model
//! with `learning: { dir }` is in `llm.rs`.

use napi::Env;
use napi_derive::napi;

use crate::error::sync_call;
use crate::options::{self, Val};

#[napi(js_name = "learning")]
pub struct Learning {}

#[napi]
impl Learning {
  /// What a learning directory holds: the model it belongs to, trajectories, counters, bank size,
  /// file sizes. Throws `ERR_LEARNING_STATE` for unreadable state, `ERR_IO`.
  #[napi(catch_unwind, ts_args_type = "dir: string", ts_return_type = "Record<string, unknown>")]
  pub fn status(env: &Env, dir: napi::bindgen_prelude::Unknown) -> napi::Result<serde_json::Value> {
    sync_call(env, || {
      let dir = options::text_arg(Some(Val::new(env, &dir)), "dir")?;
      Ok(ruvllm_sona::offline_status(std::path::Path::new(&dir))?)
    })
  }

  /// Writes the learned adapter of `dir` (BaseLoRA and MicroLoRA summed) to `out` as a llama.cpp
  /// LoRA GGUF. Throws `ERR_INVALID_ARG` when nothing was learned, `ERR_LEARNING_STATE`, `ERR_IO`.
  #[napi(catch_unwind, ts_args_type = "dir: string, out: string")]
  pub fn export(env: &Env, dir: napi::bindgen_prelude::Unknown, out: napi::bindgen_prelude::Unknown) -> napi::Result<()> {
    sync_call(env, || {
      let dir = options::text_arg(Some(Val::new(env, &dir)), "dir")?;
      let out = options::text_arg(Some(Val::new(env, &out)), "out")?;
      Ok(ruvllm_sona::offline_export(std::path::Path::new(&dir), std::path::Path::new(&out))?)
    })
  }

  /// Deletes everything learning wrote in `dir` (other files stay); returns the paths removed.
  #[napi(catch_unwind, ts_args_type = "dir: string")]
  pub fn reset(env: &Env, dir: napi::bindgen_prelude::Unknown) -> napi::Result<Vec<String>> {
    sync_call(env, || {
      let dir = options::text_arg(Some(Val::new(env, &dir)), "dir")?;
      Ok(ruvllm_sona::reset(std::path::Path::new(&dir))?.into_iter().map(|p| p.display().to_string()).collect())
    })
  }
}
