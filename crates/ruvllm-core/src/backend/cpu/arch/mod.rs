//! Per-architecture SIMD variants of the portable kernels, each chosen at run time by
//! [`super::dispatch`], `ops` or `attention` after [`crate::runtime::cpu`] allowed it. x86-64
//! has intrinsic variants; [`portable`] is the auto-vectorized dot-product set every other CPU
//! gets (NEON on aarch64), and x86-64 without AVX2 or with `RUVLLM_PORTABLE=1`.

pub mod portable;
#[cfg(target_arch = "x86_64")]
pub mod x86;
