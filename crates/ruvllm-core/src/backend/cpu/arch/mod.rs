//! Per-architecture SIMD variants of the portable kernels, each chosen at run time by
//! [`super::dispatch`], `ops` or `attention` after [`crate::runtime::cpu`] allowed it. Only x86-64
//! has variants so far; another architecture gets a folder beside `x86`.

#[cfg(target_arch = "x86_64")]
pub mod x86;
