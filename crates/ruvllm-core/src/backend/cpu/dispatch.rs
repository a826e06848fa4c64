//! The kernel table for this CPU, chosen once (as ggml's `type_traits_cpu`): the portable
//! references of [`dot`] and [`gemm`] unless [`crate::runtime::cpu`] (detection and every
//! `RUVLLM_*` switch) allows an `arch` variant.

use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
use super::arch::x86;
use super::dot::{Kernels, SCALAR};
use super::gemm::{GemmFn, GemmKFn, ScreenFn};

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
            }
            if f16c {
                k.gemm = gemm_kernel();
                k.gemm_k = gemm_kernel_k();
                if k.gemm.is_some() {
                    k.isa = gemm_isa();
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

/// Which tile GEMMs this CPU gets (x86-64).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tiles {
    Avx512,
    AvxVnni,
    Avx2,
}

#[cfg(target_arch = "x86_64")]
fn tiles() -> Option<Tiles> {
    let cpu = crate::runtime::cpu();
    if !cpu.gemm {
        return None;
    }
    if cpu.avx512f && cpu.avx512bw && cpu.avx512vnni && cpu.fma {
        Some(Tiles::Avx512)
    } else if cpu.avx2_fma() && cpu.f16c {
        Some(if cpu.avxvnni { Tiles::AvxVnni } else { Tiles::Avx2 })
    } else {
        None
    }
}

/// The instruction-set name of the kernel set with the tile GEMM of [`gemm_kernel`].
#[cfg(target_arch = "x86_64")]
fn gemm_isa() -> &'static str {
    match tiles() {
        Some(Tiles::Avx512) => "avx2+avx512vnni+gemm",
        Some(Tiles::AvxVnni) => "avx2+avxvnni+gemm",
        _ => "avx2+gemm",
    }
}

/// The SIMD tile GEMM for this CPU, if there is one: AVX-512 F/BW with VNNI, else AVX2 with FMA
/// and F16C (with AVX-VNNI's `vpdpbusd` where present, emulated otherwise). `RUVLLM_NO_GEMM`
/// turns it off (the per-row kernels are used instead); `RUVLLM_NO_AVX512` leaves the AVX2 one.
pub fn gemm_kernel() -> Option<GemmFn> {
    #[cfg(target_arch = "x86_64")]
    return tiles().map(|t| -> GemmFn {
        match t {
            Tiles::Avx512 => x86::avx512::gemm,
            Tiles::AvxVnni => x86::avx2_gemm::vnni::gemm,
            Tiles::Avx2 => x86::avx2_gemm::emulated::gemm,
        }
    });
    #[allow(unreachable_code)]
    None
}

/// The SIMD K-quant tile GEMM for this CPU, if there is one (as [`gemm_kernel`]).
pub fn gemm_kernel_k() -> Option<GemmKFn> {
    #[cfg(target_arch = "x86_64")]
    return tiles().map(|t| -> GemmKFn {
        match t {
            Tiles::Avx512 => x86::avx512::gemm_k,
            Tiles::AvxVnni => x86::avx2_gemm::vnni::gemm_k,
            Tiles::Avx2 => x86::avx2_gemm::emulated::gemm_k,
        }
    });
    #[allow(unreachable_code)]
    None
}

/// The greedy screening kernel of `matmul::head_argmax` where this CPU has the tile GEMM and
/// AVX2 (with AVX-VNNI's `vpdpbusd` where present; an AVX-512 CPU runs the AVX2 one): `None`
/// elsewhere, and under `RUVLLM_NO_SCREEN=1`, where greedy decoding computes every logit.
pub fn screen_kernel() -> Option<ScreenFn> {
    static SCREEN: OnceLock<Option<ScreenFn>> = OnceLock::new();
    *SCREEN.get_or_init(|| {
        if std::env::var("RUVLLM_NO_SCREEN").is_ok_and(|v| v == "1") || kernels().gemm.is_none() {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let cpu = crate::runtime::cpu();
            if cpu.avx2_fma() && cpu.f16c {
                return Some(if cpu.avxvnni { x86::avx2_gemm::vnni::screen } else { x86::avx2_gemm::emulated::screen });
            }
        }
        None
    })
}
