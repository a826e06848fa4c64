//! SONA: the model learns from feedback, with real gradients through the frozen quantized
//! model, in three loops (instant MicroLoRA, background BaseLoRA, EWC++ consolidation), an
//! adapter bank with retrieval, and a directory that survives restarts.
//!
//! - [`grad`]: the forward pass with saved activations and the backward pass to LoRA factors.
//! - [`micro`]: the instant step (last block, truncated softmax).
//! - [`learner`]: the threads, trajectories, rounds, Fisher, bank, persistence.
//! - [`store`], [`bank`], [`export`]: files, retrieval, adapters for the runtime and llama.cpp.
//! - [`talora`]: learning for a masked-diffusion model, one adapter per range of mask ratios.

pub mod adam;
pub mod bank;
pub mod error;
pub mod export;
pub mod federate;
pub mod grad;
pub mod learner;
pub mod micro;
pub mod store;
pub mod talora;

pub use error::{Error, Result};
pub use learner::{offline_export, offline_status, FeedbackOutcome, InstantReport, Learner, LearningOptions, LearningStats, RoundReport};
pub use store::reset;
pub use talora::TaLearner;
