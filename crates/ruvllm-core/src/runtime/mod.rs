//! What the process may use of the machine, decided once. [`cpu`] detects the CPU's SIMD
//! features and applies every `RUVLLM_*` switch, so the kernels of the core and of the sentence
//! embedder choose their paths from one answer:
//!
//! | switch | effect |
//! |---|---|
//! | `RUVLLM_FORCE_SCALAR` | no SIMD at all: the scalar reference kernels everywhere |
//! | `RUVLLM_PORTABLE` | no x86 SIMD: the portable auto-vectorized dot products (`arch::portable`, what aarch64 runs), scalar references elsewhere, as on a CPU with no `arch` variant |
//! | `RUVLLM_NO_AVX512` | no AVX-512 (F, BW, VL, VNNI): the AVX2 paths, as on a CPU without it |
//! | `RUVLLM_NO_VNNI` | no VNNI, AVX-512 or AVX (so no VNNI dot products; the AVX2 tile GEMM emulates `vpdpbusd`) |
//! | `RUVLLM_NO_GEMM` | no tile GEMM (AVX-512 or AVX2): the per-row kernels for prefill too |
//! | `RUVLLM_NO_FLASH` | no tiled attention: prefill's attention runs the per-query kernels decode runs |
//! | `RUVLLM_CPU_AHEAD=1` | an engine loaded on the CPU decodes greedily ahead, as on a GPU ([`cpu_run_ahead`]) |
//! | `RUVLLM_DIFFUSION_MERGE=0\|1` | a diffusion model's conversion adapter is (1) or is not (0) folded into a copy of the weights, whatever the backend prefers ([`diffusion_merge`]) |
//!
//! The switches are read once, when [`cpu`] is first called (`RUVLLM_CPU_AHEAD` and `RUVLLM_DIFFUSION_MERGE` at each load). [`ThreadPool`] is the workers the
//! kernels split their work over.

pub mod mem;
mod pool;

pub(crate) use pool::SharedMut;
pub use pool::ThreadPool;

/// CPU features the kernels may use (detected and allowed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuFeatures {
    pub avx2: bool,
    pub fma: bool,
    pub f16c: bool,
    pub avx512f: bool,
    pub avx512bw: bool,
    pub avx512vl: bool,
    pub avx512vnni: bool,
    /// AVX-VNNI (the VEX-encoded `vpdpbusd` on 256-bit vectors).
    pub avxvnni: bool,
    /// The tile GEMM may be used (AVX-512 F, BW and VNNI, or else AVX2, FMA and F16C).
    pub gemm: bool,
    /// Prefill's attention may run tiled (`backend::cpu::flash`).
    pub flash: bool,
    /// The portable vector dot products may be used where no `arch` variant is (every CPU
    /// unless `RUVLLM_FORCE_SCALAR`).
    pub portable: bool,
}

impl CpuFeatures {
    /// The features of this CPU with the switches applied; `env` reads a switch.
    pub fn detect(env: impl Fn(&str) -> bool) -> CpuFeatures {
        #[cfg(target_arch = "x86_64")]
        {
            let flash = !env("RUVLLM_NO_FLASH");
            if env("RUVLLM_FORCE_SCALAR") {
                return CpuFeatures { flash, ..CpuFeatures::default() };
            }
            if env("RUVLLM_PORTABLE") {
                return CpuFeatures { portable: true, flash, ..CpuFeatures::default() };
            }
            let avx512 = !env("RUVLLM_NO_AVX512");
            return CpuFeatures {
                avx2: is_x86_feature_detected!("avx2"),
                fma: is_x86_feature_detected!("fma"),
                f16c: is_x86_feature_detected!("f16c"),
                avx512f: avx512 && is_x86_feature_detected!("avx512f"),
                avx512bw: avx512 && is_x86_feature_detected!("avx512bw"),
                avx512vl: avx512 && is_x86_feature_detected!("avx512vl"),
                avx512vnni: avx512 && !env("RUVLLM_NO_VNNI") && is_x86_feature_detected!("avx512vnni"),
                avxvnni: !env("RUVLLM_NO_VNNI") && is_x86_feature_detected!("avxvnni"),
                gemm: !env("RUVLLM_NO_GEMM"),
                flash,
                portable: true,
            };
        }
        #[allow(unreachable_code)]
        {
            CpuFeatures { portable: !env("RUVLLM_FORCE_SCALAR"), flash: !env("RUVLLM_NO_FLASH"), ..CpuFeatures::default() }
        }
    }

    /// AVX2 with FMA: the per-row SIMD kernels.
    pub fn avx2_fma(&self) -> bool {
        self.avx2 && self.fma
    }
}

/// This process's CPU features, detected once (see the module docs for the switches).
pub fn cpu() -> &'static CpuFeatures {
    static CPU: std::sync::OnceLock<CpuFeatures> = std::sync::OnceLock::new();
    CPU.get_or_init(|| CpuFeatures::detect(|k| std::env::var_os(k).is_some()))
}

/// Whether an engine loaded now on the CPU queues its greedy picks as a GPU does
/// (`backend::host_picks`), so that the engine's run-ahead decoding runs without a GPU (its
/// test); read at each load.
pub fn cpu_run_ahead() -> bool {
    std::env::var("RUVLLM_CPU_AHEAD").is_ok_and(|v| v == "1")
}

/// Whether a diffusion model loaded now folds its one conversion adapter into a copy of the
/// weights (`DiffusionModel::merge`), when `RUVLLM_DIFFUSION_MERGE` says; `None`: as the
/// backend prefers (`Memory::prefers_merged_adapters`). Read at each load.
pub fn diffusion_merge() -> Option<bool> {
    match std::env::var("RUVLLM_DIFFUSION_MERGE").as_deref() {
        Ok("1") => Some(true),
        Ok("0") => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::CpuFeatures;

    #[test]
    fn switches() {
        let none = CpuFeatures::detect(|_| false);
        assert_eq!(CpuFeatures::detect(|k| k == "RUVLLM_FORCE_SCALAR"), CpuFeatures { flash: true, ..CpuFeatures::default() });
        assert!(none.flash && !CpuFeatures::detect(|k| k == "RUVLLM_NO_FLASH").flash);
        let no512 = CpuFeatures::detect(|k| k == "RUVLLM_NO_AVX512");
        assert!(!no512.avx512f && !no512.avx512bw && !no512.avx512vl && !no512.avx512vnni);
        assert_eq!((no512.avx2, no512.fma, no512.f16c), (none.avx2, none.fma, none.f16c));
        let no_vnni = CpuFeatures::detect(|k| k == "RUVLLM_NO_VNNI");
        assert!(!no_vnni.avx512vnni && !no_vnni.avxvnni);
        assert_eq!(no_vnni.avx512f, none.avx512f);
        assert!(!CpuFeatures::detect(|k| k == "RUVLLM_NO_GEMM").gemm);
        assert!(none.gemm);
        assert!(none.portable);
        let portable = CpuFeatures::detect(|k| k == "RUVLLM_PORTABLE");
        assert_eq!(portable, CpuFeatures { portable: true, flash: true, ..CpuFeatures::default() });
    }
}
