//! Aggregate decode speed of the engine's continuous batching, without HTTP: for each
//! concurrency C, C requests (distinct prompts, greedy, N new tokens each) submitted at once;
//! completion tokens of all of them over the wall time, next to C = 1.
//! `cargo run --release -p ruvllm-eval --example batching -- MODEL.gguf [threads] [new tokens] [concurrencies, e.g. 1,4,8,16]`
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::Instant;

use ruvllm_core::engine::{Engine, Event, GenerateParams, GenerateRequest, LoadOptions, Prompt};
use ruvllm_core::sampling::SamplingParams;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).expect("usage: batching MODEL.gguf [threads] [new tokens] [concurrencies]");
    let threads: usize = args.get(2).map_or(2, |s| s.parse().expect("threads"));
    let new: usize = args.get(3).map_or(64, |s| s.parse().expect("new tokens"));
    let levels: Vec<usize> = args.get(4).map_or("1,4,8,16", |s| s.as_str()).split(',').map(|s| s.parse().expect("concurrency")).collect();
    let parallel = *levels.iter().max().unwrap_or(&1);
    let opts = LoadOptions { context_size: Some(1024), threads: Some(threads), parallel: Some(parallel), prefix_cache_mb: Some(0), ..Default::default() };
    let engine = Engine::load(std::path::Path::new(path), opts).expect("load");
    // Warm-up: the first request after load faults in the weights' pages.
    let warm = GenerateParams { max_tokens: 16, sampling: SamplingParams::greedy(), ..Default::default() };
    engine.generate_blocking(Prompt::Text("Warm-up".into()), warm).expect("warm-up");
    println!("| concurrent requests | completion tokens | wall s | aggregate tok/s | × one request |");
    println!("|---|---|---|---|---|");
    let mut single = None;
    for &c in &levels {
        let (tx, rx) = channel();
        let start = Instant::now();
        for i in 0..c {
            let tx = tx.clone();
            // Distinct 32-token prompts, so no prefix is shared.
            let ids: Vec<u32> = (0..32u32).map(|k| 2 + (k * 7919 + i as u32 * 104729) % 200000).collect();
            let params = GenerateParams { max_tokens: new, sampling: SamplingParams::greedy(), ..Default::default() };
            let sink = Box::new(move |e| {
                let _ = tx.send(e);
            });
            engine
                .submit(GenerateRequest { prompt: Prompt::Tokens(ids), params, adapters: None, cancel: Arc::new(AtomicBool::new(false)), sink })
                .expect("submit");
        }
        drop(tx);
        let mut tokens = 0;
        for e in rx {
            match e {
                Event::Done(d) => tokens += d.completion_tokens,
                Event::Error(e) => panic!("{e}"),
                _ => {}
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let rate = tokens as f64 / secs;
        let base = *single.get_or_insert(rate);
        println!("| {c} | {tokens} | {secs:.2} | {rate:.1} | {:.2} |", rate / base);
    }
}
