//! Kernels: quantized weight formats, dot products with 8-bit-quantized activations (as ggml
//! does), matrix-vector / matrix-matrix products on a thread pool, and f32 elementwise ops.
//! SIMD paths are chosen at run time (`is_x86_feature_detected!`), never at compile time, so the
//! portable binary we ship is fast on every x86-64 CPU.
//!
//! OWNER of quant.rs / dot.rs / matmul.rs: kernels helper. ops.rs: models owner.

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

/// Whether the AVX-512 kernels may be used where the CPU has them: `RUVLLM_NO_AVX512` set makes
/// every kernel take its AVX2 (or scalar) path, as on a CPU without AVX-512, so those paths can
/// be run and tested on any machine.
pub fn avx512_allowed() -> bool {
    std::env::var_os("RUVLLM_NO_AVX512").is_none()
}
