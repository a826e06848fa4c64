//! ruvllm agent router (issue 5): sentence embeddings (all-MiniLM-L6-v2 on our own f32 BERT forward),
//! a nearest-pattern index (exact SIMD scan, HNSW through `instant-distance` above a threshold),
//! a learning k-NN + centroid router with calibrated confidence, the Claude Flow agent catalogue,
//! hook state persistence, and the routing benchmark.
//!
//! An LLM-hidden-state embedder plugs in by implementing [`embed::Embedder`] (mean-pool the
//! final hidden states of a loaded LLM over the prompt's tokens, then L2-normalise).

pub mod bench;
mod bert;
pub mod catalogue;
pub mod embed;
pub mod error;
pub mod hooks;
pub mod index;
pub mod keyword;
pub mod lexical;
pub mod linear;
pub mod router;
pub mod simd;

pub use embed::{default_embedder, router_default_embedder, routing_embedder, Adapter, BertEmbedder, BertOptions, Embedder, WeightFormat};
pub use error::{Error, Result};
pub use router::{AgentScore, AgentSpec, FeedbackEffect, Params, Route, Router};
