//! DAF: federation of the adapters ruvllm nodes learn (SONA's LoRA adapters, the diffusion
//! model's per-timestep-bucket TALoRA adapters).
//!
//! - [`update`]: signed, canonically encoded adapter updates.
//! - [`validate`]: what a node refuses (unsigned, forged, replayed, oversized, mis-shaped,
//!   non-finite), with a counted reason.
//! - [`aggregate`]: factor averaging (baseline) and exact aggregation (FLoRA stacking, truncated
//!   SVD with its error).
//! - [`weighting`]: per-bucket aggregation with FedAvg, quality, timestep-aligned and hybrid
//!   weights.
//! - [`privacy`] and [`accountant`]: the tiers (private, group, tenant, public), the wire
//!   envelopes, and the differential privacy of the public tier.
//!
//! The crate knows nothing of napi or of the model: factors are plain `Vec<f32>` with shapes.

pub mod accountant;
pub mod aggregate;
pub mod demo;
pub mod error;
pub mod federation;
pub mod linalg;
pub mod node;
pub mod privacy;
pub mod update;
pub mod validate;
pub mod weighting;

pub use error::{Error, Result};
