//! Diffusion decoding against the autoregressive model on the same engine kind, without Node:
//! tokens/s of both (alternating, medians), tokens per step and forward passes, for profiling
//! a denoising step.
//! `cargo run --release -p ruvllm-eval --example diffusion_speed -- MODEL.gguf ADAPTER.gguf [threads] [rounds] [cpu|cuda] [threshold]`
use std::error::Error;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ruvllm_core::engine::{DiffusionParams, Engine, GenerateParams, GpuMode, LoadOptions, Prompt};
use ruvllm_core::sampling::SamplingParams;

const PROMPTS: [&str; 3] = [
    "The capital of France is Paris. The capital of Germany is",
    "Once upon a time, in a small village by the sea,",
    "The best way to learn a new language is",
];

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: diffusion_speed MODEL.gguf ADAPTER.gguf [threads] [rounds] [cpu|cuda] [threshold]";
    let (Some(model), Some(adapter)) = (args.get(1), args.get(2)) else { return Err(usage.into()) };
    let (model, adapter) = (Path::new(model), PathBuf::from(adapter));
    let threads: usize = args.get(3).map_or(Ok(2), |s| s.parse())?;
    let rounds: usize = args.get(4).map_or(Ok(3), |s| s.parse())?;
    let gpu = match args.get(5).map(String::as_str) {
        Some("cuda") => GpuMode::Cuda,
        _ => GpuMode::Off,
    };
    let threshold: f32 = args.get(6).map_or(Ok(0.9), |s| s.parse())?;
    let load =
        |diffusion: Vec<PathBuf>| Engine::load(model, LoadOptions { context_size: Some(1024), threads: Some(threads), gpu, diffusion, ..Default::default() });
    let (ar, dm) = (load(vec![])?, load(vec![adapter])?);
    let run = |e: &Engine, diffusion: Option<DiffusionParams>| -> ruvllm_core::Result<(f64, usize, usize, usize)> {
        let t = Instant::now();
        let (mut n, mut steps, mut passes) = (0usize, 0usize, 0usize);
        for p in PROMPTS {
            let params = GenerateParams { max_tokens: 128, sampling: SamplingParams::greedy(), diffusion: diffusion.clone(), ..Default::default() };
            let c = e.generate_blocking(Prompt::Text(p.into()), params)?;
            n += c.completion_tokens;
            if let Some(d) = &c.diffusion {
                steps += d.steps;
                passes += d.forward_passes;
            }
        }
        Ok((n as f64 / t.elapsed().as_secs_f64(), n, steps, passes))
    };
    // DIFF_BLOCK, DIFF_NGRAM, DIFF_REUSE=0|1 override the decoder's defaults.
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<usize>().ok());
    let def = DiffusionParams::default();
    let d = DiffusionParams {
        threshold: Some(threshold),
        block_size: env("DIFF_BLOCK").unwrap_or(def.block_size),
        no_repeat_ngram: env("DIFF_NGRAM").unwrap_or(def.no_repeat_ngram),
        reuse_rows: env("DIFF_REUSE").map_or(def.reuse_rows, |v| v != 0),
        ..def
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        a.push(run(&ar, None)?.0);
        let r = run(&dm, Some(d.clone()))?;
        if std::env::var_os("DIFF_TEXT").is_some() {
            let params = GenerateParams { max_tokens: 128, sampling: SamplingParams::greedy(), diffusion: Some(d.clone()), ..Default::default() };
            println!("{:?}", dm.generate_blocking(Prompt::Text(PROMPTS[0].into()), params)?.text);
        }
        println!(
            "AR {:.1} tok/s, diffusion {:.1} tok/s ({} tokens, {:.2} per step, {} passes)",
            a.last().unwrap_or(&0.0),
            r.0,
            r.1,
            r.1 as f64 / r.2.max(1) as f64,
            r.3
        );
        b.push(r.0);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (ma, mb) = (median(a), median(b));
    println!("median: AR {ma:.1} tok/s, diffusion {mb:.1} tok/s, ratio {:.3}", mb / ma);
    Ok(())
}
