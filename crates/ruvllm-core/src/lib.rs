//! ruvllm core: GGUF models on our own kernels, tokenizer, chat templates, sampling and the
//! generation engine. Knows nothing of napi or Node; the binding at the repo root wraps it.

pub mod backend;
pub mod chat;
pub mod engine;
pub mod error;
pub mod gguf;
pub mod kv;
pub mod models;
pub mod nn;
pub mod runtime;
pub mod sampling;
pub mod structured;
pub mod tokenizer;

pub use error::{Error, Result};
