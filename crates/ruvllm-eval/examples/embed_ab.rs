//! `cargo run --release -p ruvllm-eval --example embed_ab [-- rounds]`
//!
//! A/B of the embedder's weight formats in one process, one thread: f32, f16 and bf16 panels
//! (bf16 loads as f16 on a CPU without AVX512-BF16), over the 104 held-out test tasks
//! (`data/test.json`). Each round embeds every task once with each format, rotating which
//! format goes first; p50 / p99 are over all (task, round) samples per format. Two regimes:
//! - warm: tasks back to back, as the routing benchmark times them (weights may stay in cache);
//! - cold: before each call a 64 MiB buffer is rewritten, so the weights come from DRAM (a hook
//!   call that arrives after other work).
//!
//! Also prints how far the f16 and bf16 embeddings are from the f32 ones (max |difference| of a
//! coordinate of the unit vectors, and the cosine between them).
use ruvllm_embed::{BertEmbedder, BertOptions, Embedder, WeightFormat};

fn quantiles(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    (q(0.5), q(0.99))
}

fn main() {
    let rounds: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(10);
    let dir = ruvllm_embed::discover_model_dir().unwrap_or_else(|e| {
        eprintln!("error [{}]: {e}", e.code());
        std::process::exit(1);
    });
    let load = |weights| BertEmbedder::load(&dir, BertOptions { weights, threads_batch: 1, ..BertOptions::default() }).expect("load");
    let models = [("f32", load(WeightFormat::F32)), ("f16", load(WeightFormat::F16)), ("bf16", load(WeightFormat::Bf16))];
    let tests: serde_json::Value = serde_json::from_str(include_str!("../../ruvllm-router/data/test.json")).expect("test.json");
    let tasks: Vec<String> = tests["tests"].as_array().expect("tests").iter().map(|t| t["text"].as_str().expect("text").to_string()).collect();

    for m in 1..models.len() {
        let (mut max_diff, mut min_cos, mut sum_cos) = (0.0f32, 1.0f32, 0.0f64);
        for t in &tasks {
            let a = models[0].1.embed(&[t]).expect("embed").pop().expect("one");
            let b = models[m].1.embed(&[t]).expect("embed").pop().expect("one");
            max_diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(max_diff, f32::max);
            let c = ruvllm_embed::cosine(&a, &b);
            min_cos = min_cos.min(c);
            sum_cos += c as f64;
        }
        println!(
            "{} tasks: {} vs f32 embeddings: max |diff| {max_diff:.2e}, cosine min {min_cos:.7}, mean {:.7}",
            tasks.len(),
            models[m].0,
            sum_cos / tasks.len() as f64
        );
    }

    let mut evict = vec![0u8; 64 << 20];
    for cold in [false, true] {
        let mut times = vec![Vec::new(); models.len()];
        for round in 0..rounds + 1 {
            for k in 0..models.len() {
                let m = (k + round) % models.len();
                for t in &tasks {
                    if cold {
                        evict.iter_mut().step_by(64).for_each(|b| *b = b.wrapping_add(1));
                    }
                    let start = std::time::Instant::now();
                    std::hint::black_box(models[m].1.embed(&[t]).expect("embed"));
                    if round > 0 {
                        times[m].push(start.elapsed().as_secs_f64() * 1e3);
                    }
                }
            }
        }
        for (m, (name, _)) in models.iter().enumerate() {
            let (p50, p99) = quantiles(times[m].clone());
            println!("{}: {name}: p50 {p50:.2} ms, p99 {p99:.2} ms ({} samples, {rounds} rounds)", if cold { "cold" } else { "warm" }, times[m].len());
        }
    }
    std::hint::black_box(&evict);
}
