//! The learner on the real Gemma 3 270M: feedback → instant MicroLoRA step → the next request
//! runs the new adapter; consolidate → BaseLoRA round, Fisher, bank; export → llama.cpp LoRA GGUF
//! that loads back with the same effect; a new learner on the same directory picks everything up.

use std::sync::mpsc::channel;
use std::sync::Arc;

use ruvllm_core::engine::{Engine, GenerateParams, LoadOptions, Prompt, ScoreRequest};
use ruvllm_core::nn::AdapterSet;
use ruvllm_core::sampling::SamplingParams;
use ruvllm_sona::{Learner, LearningOptions};

const PROMPT: &str = "Pronunciations:\nabandon: AH0 B AE1 N D AH0 N\nability: AH0 B IH1 L AH0 T IY0\n";
const CORRECTION: &str = "able: EY1 B AH0 L\nabout: AH0 B AW1 T\nabove: AH0 B AH1 V\n";

fn engine() -> Arc<Engine> {
    let path = ruvllm_models::real_test_model().unwrap_or_else(|e| panic!("{e}"));
    Arc::new(Engine::load(&path, LoadOptions { threads: Some(1), context_size: Some(512), ..Default::default() }).unwrap())
}

/// Mean NLL per token of the last `tail` tokens of `text` under `adapters` (None: load-time +
/// learned).
fn nll_tail(e: &Engine, text: &str, tail: usize, adapters: Option<AdapterSet>) -> f64 {
    let (tx, rx) = channel();
    e.submit_score(ScoreRequest {
        prompt: Prompt::Text(text.into()),
        adapters,
        chat_template: None,
        cancel: Default::default(),
        elbo: None,
        reply: Box::new(move |r| tx.send(r).unwrap()),
    })
    .unwrap();
    let s = rx.recv().unwrap().unwrap();
    let lp = &s.logprobs[s.logprobs.len() - tail..];
    -lp.iter().sum::<f64>() / lp.len() as f64
}

fn options(dir: &std::path::Path) -> LearningOptions {
    let mut o = LearningOptions::new(dir.to_path_buf());
    o.background = false;
    o.general_text = vec!["The history of the city goes back to the Romans, who built a bridge over the river.".into()];
    o.base_lr = 2e-3;
    o.micro_lr = 3e-3;
    o
}

#[test]
fn feedback_instant_consolidate_export_restart() {
    let e = engine();
    let dir = tempfile::tempdir().unwrap();
    let l = Learner::open(e.clone(), options(dir.path())).unwrap();
    let full = format!("{PROMPT}{CORRECTION}");
    // The NLL of the correction given the prompt.
    let tail = e.tokenize(CORRECTION, false).unwrap().len();
    let nll = |e: &Engine, text: &str, a: Option<AdapterSet>| nll_tail(e, text, tail, a);
    let before = nll(&e, &full, None);
    let params = GenerateParams {
        max_tokens: 8,
        sampling: SamplingParams { temperature: 0.0, ..Default::default() },
        stop: vec![],
        chat_template: None,
        diffusion: None,
        ..Default::default()
    };
    // Bad feedback is refused with codes.
    assert_eq!(l.feedback("cmpl-nope", 1.0, None).unwrap_err().code(), "ERR_INVALID_ARG");
    let c = e.generate_blocking(Prompt::Text(PROMPT.into()), params.clone()).unwrap();
    assert_eq!(l.feedback(&c.id, 1.5, None).unwrap_err().code(), "ERR_INVALID_ARG");
    assert_eq!(l.feedback(&c.id, f32::NAN, None).unwrap_err().code(), "ERR_INVALID_ARG");
    // Below the gate without a correction: stored, not learned.
    let low = l.feedback(&c.id, 0.2, None).unwrap().recv().unwrap().unwrap();
    assert!(low.instant.is_none() && low.skipped.is_some());
    for _ in 0..3 {
        let c = e.generate_blocking(Prompt::Text(PROMPT.into()), params.clone()).unwrap();
        let out = l.feedback(&c.id, 1.0, Some(CORRECTION)).unwrap().recv().unwrap().unwrap();
        let i = out.instant.expect("an instant update");
        assert!(i.tokens > 10 && i.loss.is_finite() && i.covered_mass > 0.0 && i.covered_mass <= 1.0 + 1e-6);
    }
    assert!(!e.learned().entries().is_empty(), "the micro adapter is active");
    let after_instant = nll(&e, &full, None);
    assert!(after_instant < before, "instant updates lower the NLL of the corrected text: {before} -> {after_instant}");
    let r = l.consolidate().unwrap();
    assert!(r.steps > 0 && r.fisher_updated && r.bank_entry.is_some() && r.micro_merged, "{r:?}");
    let after = nll(&e, &full, None);
    assert!(after < after_instant, "the BaseLoRA round lowers it further: {after_instant} -> {after}");
    let st = l.stats();
    assert_eq!(st.trajectories, 4);
    assert_eq!(st.good, 3);
    assert_eq!(st.pending, 0);
    assert_eq!(st.bank_size, 1);
    // The runtime runs the factors in half precision: its NLL stays close to the f32 training
    // forward pass's (within a tenth of what learning gained).
    let base = l.base_params().expect("trained");
    let fr = ruvllm_sona::grad::Frozen::new(e.model(), 1);
    let toks = e.tokenize(&full, true).unwrap();
    let n = toks.len();
    let ex = ruvllm_sona::grad::Example { tokens: toks, targets: (n - 1 - tail..n - 1).map(|i| (i, 1.0)).collect(), labels: None };
    let (ls, w) = fr.loss(&ex, Some(&base));
    let truth = ls / w;
    let gained = before - after;
    assert!((after - truth).abs() < 0.1 * gained, "runtime {after} vs f32 {truth} (gained {gained})");
    // Export: a standard LoRA GGUF that loads back and does what the learned adapters do (its
    // factors are rounded to half precision differently, so again within a tenth of the gain).
    let gguf = dir.path().join("learned.gguf");
    l.export(&gguf).unwrap();
    let a = e.load_adapter(&gguf).unwrap();
    let exported = nll(&e, &full, Some(AdapterSet::new(vec![(a, 1.0)])));
    assert!((exported - after).abs() < 0.1 * gained, "exported {exported} vs learned {after} (gained {gained})");
    // `auto` picks the bank entry.
    let (set, used) = l
        .auto_adapters(
            &{
                let v = e.embed_blocking(&[PROMPT]).unwrap();
                v[0].clone()
            },
            1,
        )
        .unwrap();
    assert_eq!(used.len(), 1);
    assert!(!set.entries().is_empty());
    l.close();
    drop(l);
    // A new learner on the same directory: everything is back.
    let l2 = Learner::open(e.clone(), options(dir.path())).unwrap();
    let st2 = l2.stats();
    assert_eq!((st2.trajectories, st2.good, st2.bank_size), (4, 3, 1));
    assert!(st2.counters.base_trained);
    let reloaded = nll(&e, &full, None);
    assert!((reloaded - after).abs() < 1e-3, "reloaded {reloaded} vs {after}");
}

/// With `background` on, a round starts by itself once `background_min` good trajectories wait,
/// and its adapter is published without anyone calling `consolidate`.
#[test]
fn background_round_starts_by_itself() {
    let e = engine();
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(dir.path());
    o.background = true;
    o.background_min = 2;
    o.epochs = 1;
    let l = Learner::open(e.clone(), o).unwrap();
    let params = GenerateParams {
        max_tokens: 4,
        sampling: SamplingParams { temperature: 0.0, ..Default::default() },
        stop: vec![],
        chat_template: None,
        diffusion: None,
        ..Default::default()
    };
    for correction in [CORRECTION, "absent: AE1 B S AH0 N T\nabsorb: AH0 B Z AO1 R B\n"] {
        let c = e.generate_blocking(Prompt::Text(PROMPT.into()), params.clone()).unwrap();
        l.feedback(&c.id, 1.0, Some(correction)).unwrap().recv().unwrap().unwrap();
    }
    let start = std::time::Instant::now();
    while l.stats().counters.rounds == 0 {
        assert!(start.elapsed().as_secs() < 300, "no background round started");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let st = l.stats();
    assert!(st.counters.base_trained && st.counters.steps >= 2 && st.pending == 0, "{st:?}");
    // The BaseLoRA is published (and the MicroLoRA too if a feedback's step came after the merge).
    assert!(!e.learned().entries().is_empty());
}
