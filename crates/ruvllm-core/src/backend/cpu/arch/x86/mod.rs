//! x86-64: AVX2/FMA/F16C dot products (`avx2`), the AVX-512 VNNI Q8_0 dot (`vnni`), the AVX-512
//! tile GEMM (`avx512`), the AVX2 tile GEMM (`avx2_gemm`, with or without AVX-VNNI) and the f32
//! vector ops and attention kernels (`vec`).

pub mod avx2;
pub mod avx2_gemm;
pub mod avx512;
pub mod vec;
pub mod vnni;
