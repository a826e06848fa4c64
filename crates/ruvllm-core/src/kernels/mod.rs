//! Kernels: quantized weight formats, dot products with 8-bit-quantized activations (as ggml
//! does), matrix-vector / matrix-matrix products on a thread pool, and f32 elementwise ops.
//! SIMD paths are chosen at run time from [`crate::runtime::cpu`] (detection and the `RUVLLM_*`
//! switches in one place), never at compile time, so the portable binary we ship is fast on
//! every x86-64 CPU.

mod types;
pub use types::GgmlType;

pub mod ops;
pub mod quant;
pub mod matmul;
#[doc(hidden)]
pub mod dot;
#[cfg(target_arch = "x86_64")]
mod simd_avx2;
#[cfg(target_arch = "x86_64")]
mod simd_vnni;
#[cfg(target_arch = "x86_64")]
mod simd_avx512;
#[doc(hidden)]
pub mod gemm;
pub mod mem;

pub use matmul::{matmul, QWeight, ThreadPool};
