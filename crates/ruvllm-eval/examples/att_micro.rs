//! Decode attention over a cold KV cache (as after a token's weight stream): the scores and
//! value-sum kernels of 4 query heads over `rows` positions, 18 layers, a 64 MiB read between
//! layers. `cargo run --release -p ruvllm-eval --example att_micro -- [rows]`
use half::f16;
use ruvllm_core::backend::cpu::attention::{scores_heads, weighted_sum_heads, Prefetch};
use ruvllm_core::runtime::mem::HugeVec;
use std::time::Instant;

fn cache(rows: usize, hd: usize, seed: usize) -> HugeVec<f16> {
    let mut h = HugeVec::<f16>::zeros(rows * hd);
    for (i, x) in h.iter_mut().enumerate() {
        *x = f16::from_f32(((i * 31 + seed) % 97) as f32 / 97.0 - 0.5);
    }
    h
}

fn main() {
    let rows: usize = std::env::args().nth(1).map_or(576, |s| s.parse().expect("rows"));
    let (hd, layers) = (256, 18);
    let k: Vec<HugeVec<f16>> = (0..layers).map(|l| cache(rows, hd, l)).collect();
    let v: Vec<HugeVec<f16>> = (0..layers).map(|l| cache(rows, hd, 100 + l)).collect();
    let flush: Vec<u8> = vec![1; 64 << 20];
    let offs: Vec<usize> = (0..rows).map(|p| p * hd).collect();
    let q: Vec<Vec<f32>> = (0..4).map(|h| (0..hd).map(|j| ((j + h) % 11) as f32 / 11.0).collect()).collect();
    let mut out = vec![vec![0f32; hd]; 4];
    let mut sc = vec![vec![0f32; rows]; 4];
    let (mut best_s, mut best_v) = (f64::MAX, f64::MAX);
    for _ in 0..7 {
        let (mut ts, mut tv) = (0.0, 0.0);
        for l in 0..layers {
            std::hint::black_box(flush.iter().step_by(64).map(|&x| x as u64).sum::<u64>());
            let qs: Vec<&[f32]> = q.iter().map(|x| &x[..]).collect();
            let mut ss: Vec<&mut [f32]> = sc.iter_mut().map(|x| &mut x[..]).collect();
            let t = Instant::now();
            scores_heads(&qs, &k[l], &offs, 0.1, &mut ss, Some(Prefetch { v: &v[l], offs: &offs, width: hd }));
            ts += t.elapsed().as_secs_f64();
            let ws: Vec<&[f32]> = sc.iter().map(|x| &x[..]).collect();
            let mut os: Vec<&mut [f32]> = out.iter_mut().map(|x| &mut x[..]).collect();
            let t = Instant::now();
            weighted_sum_heads(&ws, &v[l], &offs, &mut os);
            tv += t.elapsed().as_secs_f64();
        }
        best_s = best_s.min(ts);
        best_v = best_v.min(tv);
    }
    println!("{rows} positions, 18 layers: scores {:.0} us, value sums {:.0} us (check {})", best_s * 1e6, best_v * 1e6, out[0][0]);
}
