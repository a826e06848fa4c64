//! Helpers shared by the integration tests on the real model.
#![allow(dead_code)]

use std::path::PathBuf;

use ruvllm_core::gguf::GgufFile;
use ruvllm_core::models::{config_from_gguf, TransformerConfig};

/// The real Gemma 3 270M, found as `LLM.load('gemma-3-270m')` finds it.
pub fn model_path() -> PathBuf {
    ruvllm_models::real_test_model().unwrap_or_else(|e| panic!("{e}"))
}

pub fn config() -> TransformerConfig {
    config_from_gguf(&GgufFile::open(model_path()).expect("open model")).expect("config")
}

/// xorshift64*: the same numbers in every run.
pub struct Rng(pub u64);

impl Rng {
    /// Uniform in `[-1, 1)`.
    pub fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let v = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((v >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}
