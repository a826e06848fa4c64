//! The CPU backend's kernels, laid out by level as ggml's `ggml-cpu/`: quantized weight
//! formats (`types`, `quant`), portable scalar references (`dot`, `vec`, `gemm::gemm_ref`), the
//! x86 SIMD variants under `arch/x86`, the table that picks them once (`dispatch`), and the
//! drivers the forward pass calls: matrix products on the thread pool (`matmul`), f32
//! elementwise ops (`ops`) and attention over the KV cache (`attention`). SIMD paths are chosen
//! at run time from [`crate::runtime::cpu`] (detection and the `RUVLLM_*` switches in one
//! place), never at compile time, so the portable binary we ship is fast on every x86-64 CPU.

mod types;
pub use types::GgmlType;

pub mod arch;
pub mod attention;
pub mod dispatch;
#[doc(hidden)]
pub mod dot;
#[doc(hidden)]
pub mod gemm;
pub mod matmul;
pub mod ops;
pub mod quant;
pub mod vec;

pub use matmul::{matmul, QWeight};
