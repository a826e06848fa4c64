//! The CUDA backend against the CPU path, on a machine with an NVIDIA GPU (run by
//! `scripts/gpu-check.sh`; see BENCHMARKS.md "GPU"). Exits non-zero when a check fails.
//!
//! `gpu_check MODEL.gguf [--diffusion ADAPTER.gguf] [--text FILE] [--speed-only] [--load-only]`
//! (the diagnostic modes, `--dump-scores`, `--dump-greedy`, `--compare-greedy`, `--sweep`, and
//! `--prompts`, `--greedy-only`, `--trace`, `--no-prefix-cache`: CONTRIBUTING.md "GPU")
//!
//! 1. Greedy tokens, 32 per prompt on 7 prompts, CPU vs GPU: equal, or parting at a near-tie
//!    (both candidates' CPU log-probabilities printed; a gap under 0.1 nat counts as a tie).
//!    The same prompts again as concurrent requests (one batched pass per step): each against
//!    the CPU's tokens by the same criterion.
//! 2. Per-token log-probabilities of 512 tokens of text: max |CPU − GPU| < 0.05 nat.
//! 3. A random rank-8 LoRA on every projection: greedy tokens of 3 prompts equal on both.
//! 4. With `--diffusion`: the diffusion decoder's tokens on 2 prompts equal on both.
//! 5. Speed on the GPU: prefill of 512 tokens (wall time of a one-token request) and 128 greedy
//!    tokens after a short prompt, medians of 5 runs; diffusion tokens/s with `--diffusion`;
//!    1 / 4 / 8 / 16 concurrent requests (32-token prompts, 128 tokens each), greedy and at
//!    temperature 0.7 (top-k 40, top-p 0.95, min-p 0.05): the aggregate rate, all tokens over the wall time from the first submit
//!    to the last completion (prefill included), as `llama-batched-bench -npp 32 -ntg 128`'s
//!    S_TG measures llama.cpp's (its decode only).
//!
//! With `--perturb EPS` (no GPU needed): sections 1-4 for the CPU path against itself on a copy
//! of the model with `blk.0.attn_norm.weight` scaled by (1 + EPS): the criteria's noise floor.
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use ruvllm_core::engine::{Completion, Engine, Event, GenerateParams, GenerateRequest, GpuMode, LoadOptions, Prompt, Score, ScoreRequest};
use ruvllm_core::nn::lora::{AdapterFormat, LoraAdapter, LoraPair};
use ruvllm_core::nn::{AdapterSet, Proj};
use ruvllm_core::sampling::SamplingParams;

const PROMPTS: [&str; 7] = [
    "The capital of France is Paris. The capital of Germany is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "Water boils at a temperature of",
    "Q: What is the largest planet in the solar system?\nA:",
    "In 1969, the first humans to walk on the Moon were",
];

fn load(path: &Path, gpu: GpuMode, diffusion: Option<&PathBuf>) -> (Engine, f64) {
    let t = Instant::now();
    // `--no-prefix-cache`: every request evaluates its whole prompt (no rows from an earlier one).
    let prefix_cache_mb = std::env::args().any(|a| a == "--no-prefix-cache" || a == "--sweep").then_some(0);
    let opts = LoadOptions {
        context_size: Some(2048),
        gpu,
        diffusion: diffusion.into_iter().cloned().collect(),
        prefix_cache_mb,
        parallel: Some(MAX_STREAMS),
        ..Default::default()
    };
    let e = Engine::load(path, opts).unwrap_or_else(|e| panic!("load ({gpu:?}): [{}] {e}", e.code()));
    (e, t.elapsed().as_secs_f64())
}

/// The most concurrent requests the checks run (the engines' `parallel`).
const MAX_STREAMS: usize = 16;

/// Runs `prompts` as concurrent requests with `params` and waits for every completion.
fn concurrent(e: &Engine, prompts: &[Prompt], params: &GenerateParams) -> Vec<Completion> {
    let rxs: Vec<_> = prompts
        .iter()
        .map(|p| {
            let (tx, rx) = mpsc::channel();
            let sink = Box::new(move |ev| {
                let _ = tx.send(ev);
            });
            e.submit(GenerateRequest { prompt: p.clone(), params: params.clone(), adapters: None, cancel: Arc::new(AtomicBool::new(false)), sink })
                .expect("submit");
            rx
        })
        .collect();
    rxs.into_iter()
        .map(|rx| loop {
            match rx.recv().expect("engine closed") {
                Event::Done(c) => break c,
                Event::Error(e) => panic!("concurrent request: [{}] {e}", e.code()),
                _ => {}
            }
        })
        .collect()
}

fn greedy(n: usize) -> GenerateParams {
    GenerateParams { max_tokens: n, sampling: SamplingParams::greedy(), stop: vec![], chat_template: None, diffusion: None, ..Default::default() }
}

fn score(e: &Engine, prompt: Prompt, adapters: Option<AdapterSet>) -> Score {
    let (tx, rx) = mpsc::channel();
    e.submit_score(ScoreRequest {
        prompt,
        adapters,
        chat_template: None,
        cancel: Arc::new(AtomicBool::new(false)),
        elbo: None,
        reply: Box::new(move |r| {
            let _ = tx.send(r);
        }),
    })
    .expect("submit score");
    rx.recv().expect("score reply").expect("score")
}

/// Compares greedy continuations; at a divergence, prints both candidates' CPU log-probs.
fn compare(label: &str, cpu: &Engine, b_name: &str, prompt: &str, a: &[u32], b: &[u32], adapters: Option<AdapterSet>) -> bool {
    let Some(i) = (0..a.len().min(b.len())).find(|&i| a[i] != b[i]) else {
        let same = a.len() == b.len();
        println!("  {label}: {} tokens {}", a.len(), if same { "equal" } else { "equal prefix, different lengths" });
        return same;
    };
    let mut ids = cpu.tokenize(prompt, true).expect("tokenize");
    ids.extend_from_slice(&a[..i]);
    ids.push(a[i]);
    let s = score(cpu, Prompt::Tokens(ids.clone()), adapters.clone());
    let lp_a = *s.logprobs.last().unwrap();
    ids.pop();
    ids.push(b[i]);
    let s = score(cpu, Prompt::Tokens(ids), adapters);
    let lp_b = *s.logprobs.last().unwrap();
    let gap = (lp_a - lp_b).abs();
    let tie = gap < 0.1;
    println!(
        "  {label}: part at token {i}: CPU {} (logp {lp_a:.4}) vs {b_name} {} (logp {lp_b:.4}), gap {gap:.4} nat: {}",
        a[i],
        b[i],
        if tie { "near-tie" } else { "MISMATCH" }
    );
    tie
}

fn random_adapter(e: &Engine, seed: u64) -> AdapterSet {
    let cfg = e.config().clone();
    let mut state = seed;
    let mut rnd = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
    };
    let (d, q, kv, ff) = (cfg.d_model, cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim, cfg.ff_dim);
    let rank = 8;
    let mut pairs = Vec::new();
    for l in 0..cfg.n_layer {
        for (p, din, dout) in
            [(Proj::Q, d, q), (Proj::K, d, kv), (Proj::V, d, kv), (Proj::O, q, d), (Proj::Gate, d, ff), (Proj::Up, d, ff), (Proj::Down, ff, d)]
        {
            let a: Vec<f32> = (0..rank * din).map(|_| rnd() / (din as f32).sqrt()).collect();
            let b: Vec<f32> = (0..dout * rank).map(|_| rnd() * 0.05).collect();
            pairs.push((l, p, LoraPair::new(a, &b, rank, din, dout)));
        }
    }
    let ad = LoraAdapter::from_pairs(Path::new("random-lora"), AdapterFormat::Learned, &cfg, 1.0, pairs).expect("adapter");
    AdapterSet::new(vec![(Arc::new(ad), 1.0)])
}

/// The log-probability comparison's tokens: the first 512 of `--text FILE`, else of the prompts
/// repeated.
fn check_ids(e: &Engine, text_file: Option<PathBuf>) -> Vec<u32> {
    let text = match text_file {
        Some(f) => std::fs::read_to_string(f).expect("text file"),
        None => PROMPTS.join(" ").repeat(12),
    };
    let mut ids = e.tokenize(&text, true).expect("tokenize");
    ids.truncate(512);
    ids
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The value after flag `k` on the command line.
fn arg_value(args: &[String], k: &str) -> Option<PathBuf> {
    args.iter().position(|a| a == k).and_then(|i| args.get(i + 1)).map(PathBuf::from)
}

/// Whether flag `k` is on the command line.
fn arg_flag(args: &[String], k: &str) -> bool {
    args.iter().any(|a| a == k)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model = PathBuf::from(
        args.get(1).expect("usage: gpu_check MODEL.gguf [--diffusion A.gguf] [--text FILE] [--speed-only] [--load-only] [--dump-scores OUT.json [--cpu]] [--prompts 1,4] [--greedy-only] [--trace] [--no-prefix-cache] [--sweep] [--dump-greedy OUT.json [--cpu]] [--compare-greedy A.json B.json]"),
    );
    let opt = |k: &str| arg_value(&args, k);
    let flag = |k: &str| arg_flag(&args, k);
    let diffusion = opt("--diffusion");

    if flag("--load-only") {
        // Load and one token, for the process wall time next to llama.cpp's.
        let (g, secs) = load(&model, GpuMode::Cuda, None);
        let c = g.generate_blocking(Prompt::Text("Hello".into()), greedy(1)).expect("generate");
        println!("load {:.3} s, first token {:?}", secs, c.tokens);
        return;
    }

    if let Some(out) = opt("--dump-scores") {
        // Per-token log-probabilities of the check's text on one backend (`--cpu`: the CPU,
        // whose kernel path the environment picks), written as JSON: to compare backends and
        // CPU paths offline.
        let (e, _) = load(&model, if flag("--cpu") { GpuMode::Off } else { GpuMode::Cuda }, None);
        let ids = check_ids(&e, opt("--text"));
        let s = score(&e, Prompt::Tokens(ids.clone()), None);
        let json = format!("{{\"backend\":{:?},\"ids\":{:?},\"logprobs\":{:?},\"top\":{:?}}}", e.info().backend, ids, s.logprobs, s.top_tokens);
        std::fs::write(&out, json).expect("write scores");
        println!("{}: {} log-probabilities, perplexity {:.4}", e.info().backend, s.logprobs.len(), s.perplexity);
        return;
    }

    if let Some(out) = opt("--dump-greedy") {
        // The greedy check's tokens on one backend (`--cpu`: the CPU, whose kernel path the
        // environment picks; the prompts in order, the prefix cache on unless
        // `--no-prefix-cache`), as JSON, for `--compare-greedy`.
        let (e, _) = load(&model, if flag("--cpu") { GpuMode::Off } else { GpuMode::Cuda }, None);
        let toks: Vec<Vec<u32>> = PROMPTS.iter().map(|p| e.generate_blocking(Prompt::Text(p.to_string()), greedy(32)).expect("generate").tokens).collect();
        std::fs::write(&out, serde_json::json!({ "backend": e.info().backend, "tokens": toks }).to_string()).expect("write tokens");
        println!("{}: greedy tokens of {} prompts written", e.info().backend, toks.len());
        return;
    }
    if let Some(a) = opt("--compare-greedy") {
        // Two `--dump-greedy` files (`--compare-greedy A.json B.json`) compared as the check
        // does, the gaps from this process's CPU path.
        let b = args.iter().position(|x| x == "--compare-greedy").and_then(|i| args.get(i + 2)).expect("--compare-greedy A.json B.json");
        let read = |f: &Path| -> (String, Vec<Vec<u32>>) {
            let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(f).expect("read tokens")).expect("tokens json");
            (v["backend"].as_str().unwrap_or("?").to_string(), serde_json::from_value(v["tokens"].clone()).expect("tokens"))
        };
        let ((na, ta), (nb, tb)) = (read(&a), read(Path::new(b)));
        let (cpu, _) = load(&model, GpuMode::Off, None);
        println!("greedy: A = {na}, B = {nb}; log-probabilities from {}", cpu.info().backend);
        let mut equal = 0;
        for (k, p) in PROMPTS.iter().enumerate() {
            equal += usize::from(ta[k] == tb[k]);
            compare(&format!("prompt {k}"), &cpu, "B", p, &ta[k], &tb[k], None);
        }
        println!("  identical: {equal}/{}", PROMPTS.len());
        return;
    }
    if flag("--sweep") {
        // The check's text scored on the GPU in prefixes of many lengths (each a fresh prefill:
        // no prefix cache), against the CPU's scores of the whole: max / mean |dlogp| per length.
        let (gpu, _) = load(&model, GpuMode::Cuda, None);
        let (cpu, _) = load(&model, GpuMode::Off, None);
        let ids = check_ids(&cpu, opt("--text"));
        let full = score(&cpu, Prompt::Tokens(ids.clone()), None);
        let mut lens: Vec<usize> = (2..=20).chain([24, 31, 32, 33, 40, 48, 63, 64, 65, 100, 128, 129, 200, 300, 512]).collect();
        lens.retain(|&k| k <= ids.len());
        for k in lens {
            let s = score(&gpu, Prompt::Tokens(ids[..k].to_vec()), None);
            let d: Vec<f64> = s.logprobs.iter().zip(&full.logprobs).map(|(x, y)| (x - y).abs()).collect();
            let (imax, max) = d.iter().enumerate().fold((0, 0.0), |m, (i, &v)| if v > m.1 { (i, v) } else { m });
            let top = s.top_tokens.iter().zip(&full.top_tokens).filter(|(x, y)| x == y).count();
            println!(
                "  {k:>3} tokens: max |dlogp| {max:.4} at {}, mean {:.5}, last {:.4}; top-1 equal {top}/{}",
                imax + 1,
                d.iter().sum::<f64>() / d.len() as f64,
                d.last().copied().unwrap_or(0.0),
                d.len()
            );
        }
        return;
    }

    if let Some(eps) = opt("--perturb") {
        // The check's noise floor: the CPU path against itself with one f32 weight vector
        // (block 0's attention norm) scaled by (1 + EPS), e.g. 2.4e-7 = 2^-22, a change of one to
        // four ulps per element; sections 1-4 as against the GPU, on any machine.
        let Some(eps) = eps.to_str().and_then(|v| v.parse::<f32>().ok()).filter(|e| e.is_finite()) else {
            eprintln!("gpu_check: --perturb EPS needs a finite number, got {eps:?}");
            std::process::exit(2);
        };
        // Removed when this block ends (or a check panics).
        let perturbed = match perturbed_copy(&model, "blk.0.attn_norm.weight", eps) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("gpu_check: --perturb: {e}");
                std::process::exit(2);
            }
        };
        let (a, _) = load(&model, GpuMode::Off, None);
        let (b, _) = load(&perturbed.0, GpuMode::Off, None);
        println!("CPU backend: {}; B: the same path, blk.0.attn_norm.weight x (1 + {eps:e})", a.info().backend);
        let pair = |d: &PathBuf| (load(&model, GpuMode::Off, Some(d)).0, load(&perturbed.0, GpuMode::Off, Some(d)).0);
        let ok = correctness(&args, a, &b, "perturbed", diffusion.as_ref().map(|d| move || pair(d)));
        println!("{}", if ok { "PERTURBED CHECK: PASS" } else { "PERTURBED CHECK: FAIL" });
        return;
    }

    let (gpu, gpu_load) = load(&model, GpuMode::Cuda, None);
    println!("GPU backend: {} (load {gpu_load:.2} s)", gpu.info().backend);
    let mut ok = true;
    if !flag("--speed-only") {
        let (cpu, cpu_load) = load(&model, GpuMode::Off, None);
        println!("CPU backend: {} (load {cpu_load:.2} s)", cpu.info().backend);
        let pair = |d: &PathBuf| (load(&model, GpuMode::Off, Some(d)).0, load(&model, GpuMode::Cuda, Some(d)).0);
        ok = correctness(&args, cpu, &gpu, "GPU", diffusion.as_ref().map(|d| move || pair(d)));
        if flag("--greedy-only") {
            return;
        }
    }

    if std::env::var("RUVLLM_CUDA_EXACT").is_ok_and(|v| v == "1") {
        // The reference mode is a correctness tool (one thread per output element).
        println!("5. speed: not measured in the reference mode");
        println!("{}", if ok { "GPU CHECK: PASS" } else { "GPU CHECK: FAIL" });
        std::process::exit(if ok { 0 } else { 1 });
    }
    println!("5. speed on the GPU (median of 5)");
    // A different prompt each run: the engine's prefix cache would otherwise serve the repeats.
    let prompt = |k: u32| -> Vec<u32> { (0..512u32).map(|i| 2 + (i * 7919 + k * 104_729) % 20000).collect() };
    let (mut pre, mut dec) = (Vec::new(), Vec::new());
    for k in 0..6 {
        // Wall time of the whole request (prefill and its one token): the engine's own prefill
        // figure stops before the device has finished, since the LM head's result is read later.
        let t = Instant::now();
        gpu.generate_blocking(Prompt::Tokens(prompt(k)), greedy(1)).expect("prefill");
        pre.push(512.0 / t.elapsed().as_secs_f64());
        let c = gpu.generate_blocking(Prompt::Tokens(prompt(100 + k)[..8].to_vec()), greedy(128)).expect("decode");
        dec.push(c.decode_tokens_per_second);
    }
    pre.remove(0);
    dec.remove(0);
    println!("  prefill 512: {:.0} tok/s; decode 128: {:.1} tok/s", median(pre), median(dec));
    if let Some(d) = &diffusion {
        let (dg, _) = load(&model, GpuMode::Cuda, Some(d));
        let mut v = Vec::new();
        for _ in 0..4 {
            let params =
                GenerateParams { max_tokens: 64, sampling: SamplingParams::greedy(), stop: vec![], chat_template: None, diffusion: None, ..Default::default() };
            let c = dg.generate_blocking(Prompt::Text("The capital of France is".into()), params).expect("diffusion");
            v.push(c.decode_tokens_per_second);
        }
        v.remove(0);
        println!("  diffusion decode (64 tokens): {:.1} tok/s", median(v));
    }
    println!("6. concurrent requests: 32-token prompts, 128 tokens each, aggregate tok/s (median of 3)");
    for (label, temperature) in [("greedy", 0.0f32), ("temperature 0.7", 0.7)] {
        let mut line = format!("  {label}:");
        for streams in [1usize, 4, 8, 16] {
            let mut rates = Vec::new();
            for round in 0..4u32 {
                let prompts: Vec<Prompt> = (0..streams as u32)
                    .map(|s| Prompt::Tokens((0..32u32).map(|i| 2 + (i * 7919 + (round * 64 + s) * 104_729 + 17) % 20000).collect()))
                    .collect();
                let mut params = greedy(128);
                if temperature > 0.0 {
                    // The defaults otherwise (top-k 40, top-p 0.95, min-p 0.05), as llama.cpp's.
                    params.sampling = SamplingParams { temperature, seed: u64::from(round), ..Default::default() };
                }
                let t = Instant::now();
                let done = concurrent(&gpu, &prompts, &params);
                let tokens: usize = done.iter().map(|c| c.tokens.len()).sum();
                rates.push(tokens as f64 / t.elapsed().as_secs_f64());
            }
            rates.remove(0);
            line += &format!(" {streams}: {:.0}", median(rates));
        }
        println!("{line}");
    }
    println!("{}", if ok { "GPU CHECK: PASS" } else { "GPU CHECK: FAIL" });
    if !ok {
        std::process::exit(1);
    }
}

/// Sections 1-4 of the check: engine `b` (named `b_name`: the GPU, or the perturbed CPU path)
/// against the CPU engine `cpu`; `diffusion` loads the pair with the diffusion adapter.
fn correctness(args: &[String], cpu: Engine, gpu: &Engine, b_name: &str, diffusion: Option<impl Fn() -> (Engine, Engine)>) -> bool {
    let flag = |k: &str| arg_flag(args, k);
    let mut ok = true;

    // `--prompts 1,4`: only those prompts (in that order).
    let picked: Vec<usize> = match arg_value(args, "--prompts") {
        Some(list) => {
            let parsed: Option<Vec<usize>> = list.to_string_lossy().split(',').map(|k| k.trim().parse().ok().filter(|&k: &usize| k < PROMPTS.len())).collect();
            let Some(picked) = parsed else {
                eprintln!("gpu_check: --prompts needs comma-separated indices below {}, got {list:?}", PROMPTS.len());
                std::process::exit(2);
            };
            picked
        }
        None => (0..PROMPTS.len()).collect(),
    };
    println!("1. greedy, 32 tokens x {} prompts", picked.len());
    let mut equal = 0;
    for &k in &picked {
        let p = PROMPTS[k];
        let a = cpu.generate_blocking(Prompt::Text(p.to_string()), greedy(32)).expect("cpu generate");
        let b = gpu.generate_blocking(Prompt::Text(p.to_string()), greedy(32)).expect("gpu generate");
        let same = a.tokens == b.tokens;
        equal += usize::from(same);
        ok &= compare(&format!("prompt {k}"), &cpu, b_name, p, &a.tokens, &b.tokens, None);
        if flag("--trace") {
            // The prompt and the CPU's tokens scored by both backends in one request each.
            let mut ids = cpu.tokenize(p, true).expect("tokenize");
            ids.extend_from_slice(&a.tokens);
            let (sa, sb) = (score(&cpu, Prompt::Tokens(ids.clone()), None), score(gpu, Prompt::Tokens(ids.clone()), None));
            let d: Vec<f64> = sa.logprobs.iter().zip(&sb.logprobs).map(|(x, y)| (x - y).abs()).collect();
            let (imax, max) = d.iter().enumerate().fold((0, 0.0), |m, (i, &v)| if v > m.1 { (i, v) } else { m });
            let first = d.iter().position(|&v| v > 0.05);
            println!(
                "    scored ({} tokens, {} of prompt): max |dlogp| {max:.4} at {}, mean {:.5}, first > 0.05 at {first:?}",
                ids.len(),
                ids.len() - a.tokens.len(),
                imax + 1,
                d.iter().sum::<f64>() / d.len() as f64
            );
        }
    }
    println!("  identical: {equal}/{}", picked.len());
    println!("1b. the same prompts as {} concurrent requests", picked.len());
    let prompts: Vec<Prompt> = picked.iter().map(|&k| Prompt::Text(PROMPTS[k].to_string())).collect();
    let together = concurrent(gpu, &prompts, &greedy(32));
    let mut equal = 0;
    for (&k, b) in picked.iter().zip(&together) {
        let a = cpu.generate_blocking(Prompt::Text(PROMPTS[k].to_string()), greedy(32)).expect("cpu generate");
        equal += usize::from(a.tokens == b.tokens);
        ok &= compare(&format!("concurrent prompt {k}"), &cpu, b_name, PROMPTS[k], &a.tokens, &b.tokens, None);
    }
    println!("  identical: {equal}/{}", picked.len());
    if flag("--greedy-only") {
        return ok;
    }

    println!("2. per-token log-probabilities, 512 tokens");
    let ids = check_ids(&cpu, arg_value(args, "--text"));
    let (sa, sb) = (score(&cpu, Prompt::Tokens(ids.clone()), None), score(gpu, Prompt::Tokens(ids.clone()), None));
    let diffs: Vec<f64> = sa.logprobs.iter().zip(&sb.logprobs).map(|(x, y)| (x - y).abs()).collect();
    let max = diffs.iter().cloned().fold(0.0, f64::max);
    let mean = diffs.iter().sum::<f64>() / diffs.len() as f64;
    let top_same = sa.top_tokens.iter().zip(&sb.top_tokens).filter(|(x, y)| x == y).count();
    let bits_same = sa.logprobs.iter().zip(&sb.logprobs).filter(|(x, y)| x.to_bits() == y.to_bits()).count();
    println!(
        "  {} tokens: max |dlogp| {max:.4} nat, mean {mean:.5}; ppl CPU {:.3} {b_name} {:.3}; top-1 equal {top_same}/{}; bit-identical {bits_same}/{}",
        diffs.len(),
        sa.perplexity,
        sb.perplexity,
        diffs.len(),
        diffs.len()
    );
    let mut worst: Vec<usize> = (0..diffs.len()).collect();
    worst.sort_by(|&x, &y| diffs[y].total_cmp(&diffs[x]));
    for &i in worst.iter().take(5) {
        println!(
            "    token {} (id {}): CPU {:.4} {b_name} {:.4} (|d| {:.4}); top-1 CPU {} {b_name} {}",
            i + 1,
            ids[i + 1],
            sa.logprobs[i],
            sb.logprobs[i],
            diffs[i],
            sa.top_tokens[i],
            sb.top_tokens[i]
        );
    }
    ok &= max < 0.05 && diffs.len() == ids.len() - 1;

    println!("3. random rank-8 LoRA on every projection, 3 prompts");
    let set = random_adapter(&cpu, 7);
    for (k, p) in PROMPTS.iter().take(3).enumerate() {
        let a = cpu.generate_blocking_with(Prompt::Text(p.to_string()), greedy(32), Some(set.clone())).expect("cpu lora");
        let b = gpu.generate_blocking_with(Prompt::Text(p.to_string()), greedy(32), Some(set.clone())).expect("gpu lora");
        let base = cpu.generate_blocking(Prompt::Text(p.to_string()), greedy(32)).expect("cpu");
        println!("  (the adapter changes the CPU's output: {})", base.tokens != a.tokens);
        ok &= compare(&format!("lora prompt {k}"), &cpu, b_name, p, &a.tokens, &b.tokens, Some(set.clone()));
    }
    drop(cpu);

    if let Some(d) = &diffusion {
        println!("4. diffusion decoder, 2 prompts");
        let (dc, dg) = d();
        for (k, p) in ["The capital of France is", "Water boils at"].iter().enumerate() {
            let params =
                GenerateParams { max_tokens: 32, sampling: SamplingParams::greedy(), stop: vec![], chat_template: None, diffusion: None, ..Default::default() };
            let a = dc.generate_blocking(Prompt::Text(p.to_string()), params.clone()).expect("cpu diffusion");
            let b = dg.generate_blocking(Prompt::Text(p.to_string()), params).expect("gpu diffusion");
            let same = a.tokens == b.tokens;
            println!("  diffusion prompt {k}: {} ({:?} / {:?})", if same { "equal" } else { "DIFFERENT" }, a.text, b.text);
            ok &= same;
        }
    }

    ok
}

/// A file removed when dropped (also when a check panics).
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A copy of the GGUF at `path` with the f32 tensor `name` multiplied by (1 + eps), in the
/// system's temporary directory.
fn perturbed_copy(path: &Path, name: &str, eps: f32) -> Result<TempFile, String> {
    let g = ruvllm_core::gguf::GgufFile::open(path).map_err(|e| format!("{}: [{}] {e}", path.display(), e.code()))?;
    let t = g.tensor(name).ok_or_else(|| format!("{} has no tensor {name}", path.display()))?;
    if t.dtype != ruvllm_core::gguf::GgmlType::F32 {
        return Err(format!("{name} is {:?}, not f32", t.dtype));
    }
    let mut bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let at = (g.data_offset + t.offset) as usize;
    let data = bytes.get_mut(at..at + t.size as usize).ok_or_else(|| format!("{name} lies outside {}", path.display()))?;
    for c in data.chunks_exact_mut(4) {
        let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * (1.0 + eps);
        c.copy_from_slice(&v.to_le_bytes());
    }
    let out = TempFile(std::env::temp_dir().join(format!("ruvllm-perturbed-{}.gguf", std::process::id())));
    std::fs::write(&out.0, bytes).map_err(|e| format!("{}: {e}", out.0.display()))?;
    Ok(out)
}
