//! Evaluation code that is not product: the held-out routing benchmark ([`bench`], which
//! `npx ruvllm bench routing` runs through the binding), and the lab programs under `examples/`
//! (routing simulations, embedding A/B and latency, forward-pass fingerprints, memory
//! bandwidth).

pub mod bench;
