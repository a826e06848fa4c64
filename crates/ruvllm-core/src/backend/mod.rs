//! Backends: where the forward pass's operations run.
pub mod cpu;
