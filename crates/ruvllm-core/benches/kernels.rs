//! One criterion benchmark per weight-type kernel: `matmul` of a 1024 × 2048 weight with one
//! token (decode: throughput in weight bytes streamed) and with 64 tokens (prefill: throughput
//! in multiply-accumulates), through the run-time dispatched kernels and the scalar reference,
//! at 1 and 2 threads. Plus the fused activation and softmax ops, and the decode attention
//! kernels over an f16 cache (four query heads on one KV head, 512 positions, head size 256, as
//! Gemma 3 270M; throughput in cache bytes read), one head per pass against four.
//! `cargo bench -p ruvllm-core --bench kernels` (add `-- Q8_0` to filter).
use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ruvllm_core::backend::cpu::matmul::{matmul, matmul_scalar, QWeight, WeightData};
use ruvllm_core::backend::cpu::{attention, ops, quant, GgmlType};
use ruvllm_core::runtime::ThreadPool;

const ROWS: usize = 1024;
const COLS: usize = 2048;

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 2001) as f32 / 1000.0 - 1.0).collect()
}

fn weight(ty: GgmlType) -> QWeight {
    let w = values(ROWS * COLS, 7);
    let bytes = if ty == GgmlType::F32 { w.iter().flat_map(|v| v.to_le_bytes()).collect() } else { quant::quantize(ty, &w) };
    QWeight::new(ty, ROWS, COLS, WeightData::Owned(Arc::new(bytes))).expect("weight")
}

fn matmuls(c: &mut Criterion) {
    let types = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::F32,
    ];
    for ty in types {
        let w = weight(ty);
        let mut g = c.benchmark_group(format!("matmul/{}", ty.name()));
        g.sample_size(20);
        for n in [1usize, 64] {
            let x = values(n * COLS, 3);
            let mut y = vec![0f32; n * ROWS];
            if n == 1 {
                g.throughput(Throughput::Bytes(w.bytes().len() as u64));
            } else {
                g.throughput(Throughput::Elements((n * ROWS * COLS) as u64));
            }
            for threads in [1usize, 2] {
                let pool = ThreadPool::new(threads);
                g.bench_function(BenchmarkId::new(format!("n{n}/dispatched"), threads), |b| b.iter(|| matmul(&pool, &w, black_box(&x), n, &mut y)));
                if threads == 1 {
                    g.bench_function(BenchmarkId::new(format!("n{n}/scalar"), threads), |b| b.iter(|| matmul_scalar(&pool, &w, black_box(&x), n, &mut y)));
                }
            }
        }
        g.finish();
    }
}

fn elementwise(c: &mut Criterion) {
    let mut g = c.benchmark_group("ops");
    let n = 64 * 2048;
    g.throughput(Throughput::Elements(n as u64));
    let up = values(n, 5);
    let mut gate = values(n, 9);
    g.bench_function("gelu_tanh_mul", |b| b.iter(|| ops::gelu_tanh_mul(black_box(&mut gate), &up)));
    let mut s = values(4096, 11);
    g.throughput(Throughput::Elements(4096));
    g.bench_function("softmax_4096", |b| b.iter(|| ops::softmax_inplace(black_box(&mut s))));
    g.finish();
}

fn attention(c: &mut Criterion) {
    use half::f16;
    let (hd, span, heads) = (256usize, 512usize, 4usize);
    let k: Vec<f16> = values(span * hd, 13).into_iter().map(f16::from_f32).collect();
    let v: Vec<f16> = values(span * hd, 17).into_iter().map(f16::from_f32).collect();
    let q: Vec<f32> = values(heads * hd, 19);
    let w: Vec<f32> = values(heads * span, 23).into_iter().map(|x| x.abs() / span as f32).collect();
    let offs: Vec<usize> = (0..span).map(|j| j * hd).collect();
    let mut sc = vec![0f32; heads * span];
    let mut out = vec![0f32; heads * hd];
    let mut g = c.benchmark_group("attention_f16_4heads_512pos");
    g.throughput(Throughput::Bytes((span * hd * 2) as u64));
    g.bench_function("scores/one_head_per_pass", |b| {
        b.iter(|| {
            for (qh, s) in q.chunks(hd).zip(sc.chunks_mut(span)) {
                attention::scores(qh, black_box(&k), &offs, 0.0625, s);
            }
        })
    });
    g.bench_function("scores/four_heads_per_pass", |b| {
        b.iter(|| {
            let qs: Vec<&[f32]> = q.chunks(hd).collect();
            let mut outs: Vec<&mut [f32]> = sc.chunks_mut(span).collect();
            attention::scores_heads(&qs, black_box(&k), &offs, 0.0625, &mut outs, None);
        })
    });
    g.bench_function("weighted_sum/one_head_per_pass", |b| {
        b.iter(|| {
            for (wh, o) in w.chunks(span).zip(out.chunks_mut(hd)) {
                attention::weighted_sum(wh, black_box(&v), &offs, o);
            }
        })
    });
    g.bench_function("weighted_sum/four_heads_per_pass", |b| {
        b.iter(|| {
            let ws: Vec<&[f32]> = w.chunks(span).collect();
            let mut outs: Vec<&mut [f32]> = out.chunks_mut(hd).collect();
            attention::weighted_sum_heads(&ws, black_box(&v), &offs, &mut outs);
        })
    });
    g.finish();
}

criterion_group!(benches, matmuls, elementwise, attention);
criterion_main!(benches);
