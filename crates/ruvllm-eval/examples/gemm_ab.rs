//! Per-weight A/B of the tile GEMM vs the per-row kernels (min of repeated runs), 1 thread.
use std::sync::Arc;
use std::time::Instant;

use ruvllm_core::backend::cpu::dispatch::kernels;
use ruvllm_core::backend::cpu::matmul::{matmul_with, WeightData};
use ruvllm_core::backend::cpu::quant::quantize;
use ruvllm_core::backend::cpu::{GgmlType, QWeight};
use ruvllm_core::runtime::ThreadPool;

fn main() {
    let pool = ThreadPool::new(1);
    let k = *kernels();
    let mut rowk = k;
    rowk.gemm = None;
    rowk.gemm_k = None;
    println!("isa {}", k.isa);
    let shapes =
        [(GgmlType::Q8_0, 65536, 640), (GgmlType::Q5_0, 2048, 640), (GgmlType::Q4_K, 640, 1024), (GgmlType::Q6_K, 640, 2048), (GgmlType::Q8_0, 256, 640)];
    for (ty, rows, cols) in shapes {
        let w: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.7548).sin() * 0.05).collect();
        let qw = QWeight::new(ty, rows, cols, WeightData::Owned(Arc::new(quantize(ty, &w)))).unwrap();
        qw.prepare(&pool);
        for n in [1usize, 64] {
            let x: Vec<f32> = (0..n * cols).map(|i| (i as f32 * 0.31).cos()).collect();
            let mut y = vec![0f32; n * rows];
            let mut best = [f64::MAX; 2];
            let iters = if n == 1 { 40 } else { 8 };
            for _ in 0..iters {
                for (j, kk) in [&k, &rowk].into_iter().enumerate() {
                    let t = Instant::now();
                    matmul_with(&pool, &qw, &x, n, &mut y, kk);
                    best[j] = best[j].min(t.elapsed().as_secs_f64());
                }
            }
            println!("{} {rows}x{cols} n={n}: tile {:.3} ms, per-row {:.3} ms, ratio {:.2}", ty.name(), best[0] * 1e3, best[1] * 1e3, best[1] / best[0]);
        }
    }
}
