//! DAF: federation of the adapters ruvllm nodes learn (SONA's LoRA adapters, the diffusion
//! model's per-timestep-bucket TALoRA adapters).
//!
//! - [`update`]: signed, canonically encoded adapter updates (Ed25519).
//! - [`validate`]: what a node refuses (unsigned, forged, replayed, oversized, mis-shaped,
//!   non-finite, wrong tier, not a tenant member), each with a counted reason.
//! - [`aggregate`]: factor averaging (the inexact baseline) and exact aggregation (FLoRA
//!   stacking; truncated SVD with its reported error; FedEx-LoRA's residual discussed there).
//! - [`weighting`]: per-bucket aggregation with FedAvg, quality, timestep-aligned (DAF) and
//!   hybrid weights; k-anonymity of public aggregates.
//! - [`privacy`] and [`accountant`]: the tiers (private, group, tenant, public), the wire
//!   envelopes (XChaCha20-Poly1305), and the public tier's clipping, Gaussian noise and RDP
//!   accountant.
//! - [`federation`]: one node's state, independent of the transport.
//! - [`node`]: the node on rust-libp2p (gossipsub, Noise, yamux, request-response catch-up).
//! - [`flat`]: factors from and into SONA's flat parameter layout; [`demo`]: synthetic
//!   adapters for tests and smoke runs.
//!
//! The crate knows nothing of napi or of the model: factors are plain `Vec<f32>` with shapes.
//! What a binding calls, each a line or two:
//!
//! ```text
//! let node = Node::join(FederationConfig { federate: true, identity, adapters, keys, .. }).await?;
//! let report = node.round(k, updates).await?;   // publish, collect, aggregate (RoundReport)
//! node.sync(k + 1).await?;                       // catch up rounds missed while offline
//! let stats = node.stats();                      // accepted, rejected by reason, bytes per round, ε
//! flat::into_flat(&report.output.aggregates[0], rank, scale, &slots, &mut w)?;
//! let state = node.stop().await?;                // Node::start(state) comes back
//! ```

pub mod accountant;
pub mod aggregate;
pub mod demo;
pub mod error;
pub mod federation;
pub mod flat;
pub mod linalg;
pub mod node;
pub mod privacy;
pub mod update;
pub mod validate;
pub mod weighting;

pub use error::{Error, Result};
pub use federation::{Federation, FederationConfig, Stats};
pub use node::Node;
