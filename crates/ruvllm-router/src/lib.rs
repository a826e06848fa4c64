//! ruvllm agent router: a nearest-pattern index (exact SIMD scan, HNSW through
//! `instant-distance` above a threshold), a learning k-NN + centroid router with calibrated
//! confidence, the Claude Flow agent catalogue, and hook state persistence. The routing benchmark
//! is `ruvllm-eval`'s.
//!
//! Texts are embedded by any [`Embedder`] (`ruvllm-embed`: all-MiniLM-L6-v2 by default, or the
//! mean-pooled hidden states of a loaded LLM).

pub mod catalogue;
pub mod error;
pub mod hooks;
pub mod index;
pub mod keyword;
pub mod lexical;
pub mod linear;
pub mod router;
pub mod simd;

pub use error::{Error, Result};
pub use router::{AgentScore, AgentSpec, FeedbackEffect, Params, Route, Router};
/// The embedder API a router is built with, so that a caller of the router names one crate.
pub use ruvllm_embed::{default_embedder, router_default_embedder, routing_embedder, Adapter, BertEmbedder, BertOptions, Embedder, WeightFormat};
