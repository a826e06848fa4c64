//! `@ruvector/ruvllm`: the napi-rs binding over `ruvllm-core`. Wrappers only: one file per area,
//! errors mapped in `error.rs`. Nothing long-running happens on the JS thread or the libuv pool:
//! loading runs on tokio's blocking pool, generation on the engine's own thread, and JavaScript
//! awaits promises and async iterators fed by channels.

#![deny(clippy::all)]
// `#[napi]` functions are reached only through the registrations the macro emits for the cdylib;
// the unit-test build does not see those uses.
#![cfg_attr(test, allow(dead_code))]

mod adapter;
mod error;
mod federation;
mod learning;
mod llm;
mod models;
mod options;
mod request;
mod router;
mod server;
mod signal;
mod stream;
mod task;
mod types;

pub use adapter::Adapter;
pub use federation::{Federation, FederationNode};
pub use llm::Llm;
pub use server::Server;
pub use stream::TokenStream;
pub use types::*;
