//! Greedy generation through the engine (its own thread, sampling, detokenizing), as the Node
//! binding drives it but without Node: decode speed of the whole engine next to `forward`.
//! `cargo run --release -p ruvllm-eval --example generate -- MODEL.gguf [threads] [prompt tokens] [new tokens]`
use ruvllm_core::engine::{Engine, GenerateParams, LoadOptions, Prompt};
use ruvllm_core::sampling::SamplingParams;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).expect("usage: generate MODEL.gguf [threads] [prompt tokens] [new tokens]");
    let threads: usize = args.get(2).map_or(2, |s| s.parse().expect("threads"));
    let prompt: u32 = args.get(3).map_or(128, |s| s.parse().expect("prompt tokens"));
    let new: usize = args.get(4).map_or(128, |s| s.parse().expect("new tokens"));
    let engine = Engine::load(std::path::Path::new(path), LoadOptions { context_size: Some(1024), threads: Some(threads), seed: None, ..Default::default() })
        .expect("load");
    let ids: Vec<u32> = (0..prompt).map(|i| 2 + (i * 7919) % 20000).collect();
    let params =
        GenerateParams { max_tokens: new, sampling: SamplingParams::greedy(), stop: vec![], chat_template: None, diffusion: None, ..Default::default() };
    let c = engine.generate_blocking(Prompt::Tokens(ids), params).expect("generate");
    println!("prefill {:.1} tok/s, decode {:.1} tok/s ({} tokens)", c.prefill_tokens_per_second, c.decode_tokens_per_second, c.completion_tokens);
}
