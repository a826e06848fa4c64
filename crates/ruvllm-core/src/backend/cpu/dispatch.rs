//! The kernel table for this CPU, chosen once (as ggml's `type_traits_cpu`): the portable
//! references of [`dot`] and [`gemm`] unless [`crate::runtime::cpu`] (detection and every
//! `RUVLLM_*` switch) allows an `arch` variant.

use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
use super::arch::x86;
use super::dot::{Kernels, SCALAR};
use super::gemm::{GemmFn, GemmKFn};

/// The best kernels for this CPU, detected once.
pub fn kernels() -> &'static Kernels {
    static BEST: OnceLock<Kernels> = OnceLock::new();
    BEST.get_or_init(detect)
}

fn detect() -> Kernels {
    #[cfg(target_arch = "x86_64")]
    {
        let cpu = crate::runtime::cpu();
        if cpu.avx2_fma() {
            let f16c = cpu.f16c;
            let mut k = x86::avx2::kernels(f16c);
            if f16c && cpu.avx512vnni && cpu.avx512vl {
                k.q8_0_x4 = x86::vnni::dot_q8_0_x4;
                k.isa = "avx2+avx512vnni";
                k.gemm = gemm_kernel();
                k.gemm_k = gemm_kernel_k();
                if k.gemm.is_some() {
                    k.isa = "avx2+avx512vnni+gemm";
                }
            }
            return k;
        }
    }
    if crate::runtime::cpu().portable {
        return super::arch::portable::KERNELS;
    }
    SCALAR
}

/// The SIMD tile GEMM for this CPU, if there is one (AVX-512 F/BW with VNNI). `RUVLLM_NO_GEMM`
/// (or `RUVLLM_NO_AVX512`) turns it off (the per-row kernels are used instead).
pub fn gemm_kernel() -> Option<GemmFn> {
    #[cfg(target_arch = "x86_64")]
    {
        let cpu = crate::runtime::cpu();
        if cpu.gemm && cpu.avx512f && cpu.avx512bw && cpu.avx512vnni && cpu.fma {
            return Some(x86::avx512::gemm);
        }
    }
    None
}

/// The SIMD K-quant tile GEMM for this CPU, if there is one (as [`gemm_kernel`]).
pub fn gemm_kernel_k() -> Option<GemmKFn> {
    gemm_kernel()?;
    #[cfg(target_arch = "x86_64")]
    return Some(x86::avx512::gemm_k);
    #[allow(unreachable_code)]
    None
}
