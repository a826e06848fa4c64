//! The masked-diffusion decoder on the real Gemma 3 270M with small random conversion adapters
//! (two TALoRA buckets) written here: the decoder's mechanics, not a trained model's quality
//! (the benchmark measures that with the trained adapters). One token per step commits one
//! token per step; a threshold commits several; the same seed gives the same text; every option
//! combination finishes without a panic; bad adapters and options are coded errors; steps are
//! reported in order and the stream is the completion's text.

mod common;
use common::{config, model_path, Rng};

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::channel;
use std::sync::Arc;

use ruvllm_core::engine::{
    DiffusionParams, ElboParams, Engine, Event, GenerateParams, GenerateRequest, LoadOptions, Prompt, Remasking, Schedule, ScoreRequest,
};
use ruvllm_core::gguf::writer::GgufWriter;
use ruvllm_core::gguf::MetadataValue as V;
use ruvllm_core::models::TransformerConfig;
use ruvllm_core::nn::Proj;
use ruvllm_core::sampling::SamplingParams;

const MASK: u32 = 4;

/// A rank-4 adapter on every projection with `ruvllm.diffusion.*` metadata for `[t_min, t_max)`
/// and a mask embedding row; `extra` adds or overrides metadata.
fn write_adapter(path: &Path, cfg: &TransformerConfig, t: (f32, f32), seed: u64, extra: &[(&str, V)]) {
    let mut rng = Rng(seed);
    let rank = 4;
    let mut w = GgufWriter::new();
    let defaults = [
        ("general.architecture", V::String(cfg.architecture.clone())),
        ("general.type", V::String("adapter".into())),
        ("adapter.type", V::String("lora".into())),
        ("adapter.lora.alpha", V::F32(rank as f32)),
        ("ruvllm.diffusion.mask_token_id", V::U32(MASK)),
        ("ruvllm.diffusion.t_min", V::F32(t.0)),
        ("ruvllm.diffusion.t_max", V::F32(t.1)),
        ("ruvllm.diffusion.shift", V::Bool(true)),
    ];
    for (k, v) in defaults.into_iter().filter(|(k, _)| !extra.iter().any(|(e, _)| e == k)) {
        w.add_metadata(k, v);
    }
    for (k, v) in extra {
        w.add_metadata(k, v.clone());
    }
    for l in 0..cfg.n_layer {
        for p in Proj::ALL {
            let (o, i) = p.shape(cfg);
            let a: Vec<f32> = (0..rank * i).map(|_| rng.uniform() / (i as f32).sqrt()).collect();
            let b: Vec<f32> = (0..o * rank).map(|_| rng.uniform() * 0.01).collect();
            let base = format!("blk.{l}.{}.weight", p.gguf_name());
            w.add_f32(&format!("{base}.lora_a"), &[i as u64, rank as u64], &a);
            w.add_f32(&format!("{base}.lora_b"), &[rank as u64, o as u64], &b);
        }
    }
    let row: Vec<f32> = (0..cfg.d_model).map(|_| rng.uniform() * 0.05).collect();
    w.add_f32("ruvllm.diffusion.mask_embd", &[cfg.d_model as u64], &row);
    w.write(path).expect("write adapter");
}

/// Two buckets, `[0, 0.5)` and `[0.5, 1]`.
fn adapters(dir: &Path) -> Vec<PathBuf> {
    let cfg = config();
    let (a, b) = (dir.join("t0.gguf"), dir.join("t1.gguf"));
    write_adapter(&a, &cfg, (0.0, 0.5), 1, &[]);
    write_adapter(&b, &cfg, (0.5, 1.0), 2, &[]);
    vec![a, b]
}

fn engine(diffusion: Vec<PathBuf>) -> ruvllm_core::Result<Engine> {
    Engine::load(&model_path(), LoadOptions { context_size: Some(256), threads: Some(2), diffusion, ..Default::default() })
}

fn params(max_tokens: usize, d: DiffusionParams, temperature: f32, seed: u64) -> GenerateParams {
    let sampling = if temperature == 0.0 { SamplingParams::greedy() } else { SamplingParams { temperature, seed, ..SamplingParams::default() } };
    GenerateParams { max_tokens, sampling, stop: vec![], chat_template: None, diffusion: Some(d), ..Default::default() }
}

/// Runs one request, collecting its events.
fn run(e: &Engine, prompt: &str, p: GenerateParams) -> (ruvllm_core::engine::Completion, Vec<Event>) {
    let (tx, rx) = channel();
    let sink = Box::new(move |ev| {
        let _ = tx.send(ev);
    });
    e.submit(GenerateRequest { prompt: Prompt::Text(prompt.into()), params: p, adapters: None, cancel: Arc::new(AtomicBool::new(false)), sink }).unwrap();
    let mut events = Vec::new();
    loop {
        match rx.recv().unwrap() {
            Event::Done(c) => return (c, events),
            Event::Error(err) => panic!("request failed: {err}"),
            ev => events.push(ev),
        }
    }
}

#[test]
fn decoder_mechanics() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(adapters(dir.path())).unwrap();
    assert!(e.info().diffusion);
    let prompt = "The capital of France is Paris. The capital of Germany is";

    // One token per step: as many steps as tokens; steps reported in order; the stream is the text.
    // Blocks of 6 (6, 6, 4): 1 - 1/6 is not exact in floating point, so a schedule computed in
    // floats would commit two in some step.
    let d = DiffusionParams { block_size: 6, steps: Some(16), ..DiffusionParams::default() };
    let (c, events) = run(&e, prompt, params(16, d.clone(), 0.0, 0));
    let stats = c.diffusion.clone().expect("diffusion stats");
    assert!(c.completion_tokens <= 16);
    let steps: Vec<_> = events.iter().filter_map(|ev| if let Event::Step(s) = ev { Some(s.clone()) } else { None }).collect();
    assert_eq!(steps.len(), stats.steps);
    assert!(steps.iter().enumerate().all(|(i, s)| s.step == i && s.committed.len() == 1), "one token per step");
    if c.completion_tokens == 16 {
        assert_eq!(stats.steps, 16);
        assert_eq!(stats.blocks, 3);
        // A finished block's rows run with the next block's first step, not in passes of their own.
        assert_eq!(stats.forward_passes, 16 + 1, "16 steps and the prompt");
    }
    // Without row reuse every finished block runs once more on its own.
    let whole = DiffusionParams { reuse_rows: false, ..d.clone() };
    let (cw, _) = run(&e, prompt, params(16, whole, 0.0, 0));
    if cw.completion_tokens == 16 {
        assert_eq!(cw.diffusion.unwrap().forward_passes, 16 + 2 + 1, "16 steps, refreshes of the first two blocks, the prompt");
    }
    let streamed: String = events.iter().filter_map(|ev| if let Event::Token { text, .. } = ev { Some(text.as_str()) } else { None }).collect();
    assert_eq!(streamed, c.text);
    assert!(!c.text.contains(ruvllm_core::engine::decode::MASK_GLYPH));

    // Greedy is deterministic; a seed makes sampling deterministic.
    assert_eq!(run(&e, prompt, params(16, d.clone(), 0.0, 0)).0.tokens, c.tokens);
    let a = run(&e, prompt, params(24, d.clone(), 0.9, 7)).0;
    assert_eq!(run(&e, prompt, params(24, d.clone(), 0.9, 7)).0.tokens, a.tokens);

    // Fewer steps than tokens: several tokens per step.
    let (c4, _) = run(&e, prompt, params(32, DiffusionParams { steps: Some(8), block_size: 16, ..DiffusionParams::default() }, 0.0, 0));
    let s4 = c4.diffusion.unwrap();
    assert!(s4.steps <= 8, "{s4:?}");

    // Every combination of the settings finishes, within the token budget, without a panic.
    for block_size in [1, 5, 32, 100] {
        for threshold in [None, Some(0.5)] {
            for (schedule, remasking) in [(Schedule::Linear, Remasking::Confidence), (Schedule::Cosine, Remasking::Random)] {
                for steps in [None, Some(1), Some(3)] {
                    // Repetition-aware remasking and whole-block passes on some of them.
                    let (no_repeat_ngram, reuse_rows) = (if steps == Some(3) { 2 } else { 0 }, threshold.is_none());
                    let d = DiffusionParams { steps, block_size, threshold, schedule, remasking, no_repeat_ngram, reuse_rows };
                    let (c, _) = run(&e, prompt, params(12, d.clone(), 0.7, 3));
                    assert!(c.completion_tokens <= 12, "{d:?}");
                    let s = c.diffusion.unwrap();
                    assert!(s.steps >= 1 && s.blocks >= 1, "{d:?}: {s:?}");
                }
            }
        }
    }
}

#[test]
fn bad_adapters_and_options_are_coded_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config();
    let code = |r: ruvllm_core::Result<Engine>| r.err().map(|e| e.code()).unwrap_or("loaded");
    // A gap between buckets, a plain LoRA, a mask id outside the vocabulary, a bad range.
    let (a, b) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
    write_adapter(&a, &cfg, (0.0, 0.4), 1, &[]);
    write_adapter(&b, &cfg, (0.5, 1.0), 2, &[]);
    assert_eq!(code(engine(vec![a.clone(), b.clone()])), "ERR_ADAPTER_INVALID");
    write_adapter(&b, &cfg, (0.0, 1.0), 2, &[("ruvllm.diffusion.mask_token_id", V::U32(1 << 30))]);
    assert_eq!(code(engine(vec![b.clone()])), "ERR_ADAPTER_INVALID");
    write_adapter(&b, &cfg, (0.7, 0.2), 2, &[]);
    assert_eq!(code(engine(vec![b.clone()])), "ERR_ADAPTER_INVALID");
    write_adapter(&b, &cfg, (0.0, 1.0), 2, &[("ruvllm.diffusion.shift", V::String("yes".into()))]);
    assert_eq!(code(engine(vec![b.clone()])), "ERR_ADAPTER_INVALID");
    // Diffusion options for a model loaded without diffusion adapters.
    let plain = engine(vec![]).unwrap();
    let p = params(8, DiffusionParams::default(), 0.0, 0);
    let err = plain.generate_blocking(Prompt::Text("Hi".into()), p).unwrap_err();
    assert_eq!(err.code(), "ERR_INVALID_ARG");
    // Out-of-range settings on a diffusion model.
    write_adapter(&b, &cfg, (0.0, 1.0), 2, &[]);
    let e = engine(vec![b]).unwrap();
    for d in [
        DiffusionParams { block_size: 0, ..DiffusionParams::default() },
        DiffusionParams { steps: Some(0), ..DiffusionParams::default() },
        DiffusionParams { threshold: Some(1.5), ..DiffusionParams::default() },
        DiffusionParams { no_repeat_ngram: 65, ..DiffusionParams::default() },
    ] {
        let err = e.generate_blocking(Prompt::Text("Hi".into()), params(8, d, 0.0, 0)).unwrap_err();
        assert_eq!(err.code(), "ERR_INVALID_ARG");
    }
}

/// The diffusion ELBO of `text` on `e` (the perplexity of the bound, per token).
fn elbo(e: &Engine, text: &str) -> f64 {
    let (tx, rx) = channel();
    e.submit_score(ScoreRequest {
        prompt: Prompt::Text(text.into()),
        adapters: None,
        chat_template: None,
        cancel: Arc::new(AtomicBool::new(false)),
        elbo: Some(ElboParams { samples: 8, seed: 11 }),
        reply: Box::new(move |r| {
            let _ = tx.send(r);
        }),
    })
    .unwrap();
    rx.recv().unwrap().unwrap().perplexity
}

/// The shipped conversion adapter folded into a copy of the weights (what a GPU runs) scores
/// as the adapter applied as low-rank products does, to within the copy's rounding (a few
/// percent of ELBO perplexity on this text: the copy's Q8_0 rounding moves Gemma 3's logits
/// about as much as running on another CPU path does); factors that are not the trained ones
/// are far off (random rank-4 adapters score in the tens of thousands here).
#[test]
fn a_merged_conversion_adapter_scores_as_the_adapter_does() {
    let shipped = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../ruvllm-models/data/diffusion/gemma-3-270m-diffusion/lora.gguf");
    let load = |merge: bool| {
        let opts =
            LoadOptions { context_size: Some(256), threads: Some(2), diffusion: vec![shipped.clone()], merge_diffusion: Some(merge), ..Default::default() };
        Engine::load(&model_path(), opts).unwrap()
    };
    let text = "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.";
    let (plain, merged) = (elbo(&load(false), text), elbo(&load(true), text));
    assert!(plain < 200.0, "the shipped adapter's ELBO perplexity {plain}");
    assert!((plain.ln() - merged.ln()).abs() < 0.1, "ELBO perplexity {plain} with the adapter, {merged} merged");
}
