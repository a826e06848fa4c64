//! With the `cuda` feature: compiles `src/backend/cuda/kernels.cu` with nvcc into a fatbin
//! (sm_80 and sm_90 machine code, plus PTX for newer GPUs) that the crate embeds. No GPU and no
//! CUDA library are needed to build or to run the result; nvcc comes from PyPI's CUDA 13.0 wheels
//! (`bash scripts/cuda-toolchain.sh` puts it in `.cuda/` at the repository root).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let src = Path::new("src/backend/cuda/kernels.cu");
    println!("cargo:rerun-if-changed={}", src.display());
    println!("cargo:rerun-if-changed=src/backend/cuda/reference.cu");
    println!("cargo:rerun-if-changed=src/backend/cuda/kernels");
    println!("cargo:rerun-if-env-changed=RUVLLM_NVCC");
    println!("cargo:rerun-if-env-changed=CUDA_ROOT");
    let nvcc = find_nvcc().unwrap_or_else(|| {
        panic!(
            "ruvllm-core's `cuda` feature needs nvcc to compile its GPU kernels, and none was found \
             (RUVLLM_NVCC, $CUDA_ROOT/bin, <repo>/.cuda/cu13/bin, PATH). Run `bash scripts/cuda-toolchain.sh` \
             (installs CUDA 13.0's nvcc from PyPI into .cuda/), or build without the feature."
        )
    });
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("ruvllm_kernels.fatbin");
    let status = Command::new(&nvcc)
        .args([
            "-O3",
            "-fatbin",
            "-gencode",
            "arch=compute_80,code=sm_80",
            "-gencode",
            "arch=compute_90,code=sm_90",
            "-gencode",
            "arch=compute_90,code=compute_90",
            "-o",
        ])
        .arg(&out)
        .arg(src)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", nvcc.display()));
    assert!(status.success(), "nvcc failed to compile {}", src.display());
}

fn find_nvcc() -> Option<PathBuf> {
    let mut c: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("RUVLLM_NVCC") {
        c.push(PathBuf::from(p));
    }
    if let Some(r) = std::env::var_os("CUDA_ROOT") {
        c.push(Path::new(&r).join("bin/nvcc"));
    }
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    for up in manifest.ancestors().take(4) {
        c.push(up.join(".cuda/cu13/bin/nvcc"));
    }
    if let Some(path) = std::env::var_os("PATH") {
        c.extend(std::env::split_paths(&path).map(|d| d.join("nvcc")));
    }
    c.into_iter().find(|p| p.is_file())
}
