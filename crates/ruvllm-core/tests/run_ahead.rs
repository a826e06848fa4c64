//! Run-ahead greedy decoding (the GPU backend sends a token's pass before the host has read the
//! previous pick) on the real Gemma 3 270M: the CPU backend queues its picks the same way under
//! `RUVLLM_CPU_AHEAD=1`, and every request must give exactly what it gives without: the same
//! tokens, streamed text and finish reason, at a length limit, a stop string, the end token,
//! with a second request joining mid-way, and with a prompt prefix taken from a cache that a
//! run-ahead sequence wrote.
//!
//! One test in this binary: it sets the environment variable the backend reads when an engine
//! is loaded.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::Duration;

use ruvllm_core::engine::{Engine, Event, FinishReason, GenerateParams, GenerateRequest, LoadOptions, Prompt};
use ruvllm_core::sampling::SamplingParams;

fn engine(parallel: usize) -> Engine {
    let path: PathBuf = ruvllm_models::real_test_model().unwrap_or_else(|e| panic!("{e}"));
    let opts = LoadOptions { context_size: Some(512), threads: Some(2), parallel: Some(parallel), prefix_cache_mb: Some(64), ..Default::default() };
    Engine::load(&path, opts).expect("load")
}

fn params(max_tokens: usize, stop: &[&str]) -> GenerateParams {
    GenerateParams { max_tokens, sampling: SamplingParams::greedy(), stop: stop.iter().map(|s| s.to_string()).collect(), ..Default::default() }
}

fn submit(e: &Engine, prompt: &str, p: GenerateParams) -> Receiver<Event> {
    let (tx, rx) = channel();
    let sink = Box::new(move |ev| {
        let _ = tx.send(ev);
    });
    e.submit(GenerateRequest { prompt: Prompt::Text(prompt.into()), params: p, adapters: None, cancel: Arc::new(AtomicBool::new(false)), sink })
        .expect("submit");
    rx
}

/// What a request gave: streamed (id, text) pairs, the final tokens, text and finish reason.
type Outcome = (Vec<(u32, String)>, Vec<u32>, String, FinishReason);

fn finish(rx: &Receiver<Event>) -> Outcome {
    let mut streamed = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(300)).expect("an event") {
            Event::Token { id, text, .. } => streamed.push((id, text)),
            Event::Done(c) => return (streamed, c.tokens, c.text, c.finish_reason),
            Event::Error(e) => panic!("request failed: {e}"),
            Event::Step(_) => {}
        }
    }
}

/// The cases, each run alone, then two together (the second joins while the first decodes),
/// then a prompt that extends the first case's prompt and output (its prefix from the cache).
fn run(e: &Engine) -> Vec<Outcome> {
    let cases: [(&str, GenerateParams); 5] = [
        ("The capital of France is", params(24, &[])),
        ("Here is a list of three fruits:", params(40, &["\n3"])),
        ("def fibonacci(n):", params(2, &[])),
        ("Once upon a time, in a small village by the sea,", params(1, &[])),
        ("<start_of_turn>user\nSay only the word yes.<end_of_turn>\n<start_of_turn>model\n", params(64, &[])),
    ];
    let mut out: Vec<Outcome> = cases.iter().map(|(p, q)| finish(&submit(e, p, q.clone()))).collect();
    let a = submit(e, cases[0].0, params(32, &[]));
    std::thread::sleep(Duration::from_millis(300));
    let b = submit(e, cases[1].0, params(16, &[]));
    out.push(finish(&a));
    out.push(finish(&b));
    let extended = format!("{}{}", cases[0].0, out[0].2);
    out.push(finish(&submit(e, &extended, params(16, &[]))));
    out
}

#[test]
fn run_ahead_decoding_gives_what_plain_decoding_gives() {
    let plain = run(&engine(2));
    // SAFETY (of the environment): the only test in this binary; no other thread reads it now.
    std::env::set_var("RUVLLM_CPU_AHEAD", "1");
    let ahead = run(&engine(2));
    std::env::remove_var("RUVLLM_CPU_AHEAD");
    assert_eq!(plain.len(), ahead.len());
    for (i, (p, a)) in plain.iter().zip(&ahead).enumerate() {
        assert!(!p.1.is_empty() || p.3 == FinishReason::Stop, "case {i}: no tokens");
        assert_eq!(p.0, a.0, "case {i}: streamed tokens differ");
        assert_eq!(p.1, a.1, "case {i}: final tokens differ");
        assert_eq!(p.2, a.2, "case {i}: text differs");
        assert_eq!(p.3, a.3, "case {i}: finish reason differs");
    }
    // Run-ahead decoding ran: about one queued pick per token of the requests that decoded
    // alone (all but the two decoded together, cases 5 and 6).
    let queued = ruvllm_core::backend::host_picks::QUEUED_PICKS.load(std::sync::atomic::Ordering::Relaxed);
    let alone: usize = ahead.iter().enumerate().filter(|(i, _)| *i != 5 && *i != 6).map(|(_, o)| o.1.len()).sum();
    assert!(queued + 6 >= alone, "run-ahead decoding did not run: {queued} picks queued for {alone} tokens");
    // The cases reach each way of ending: the length limit, a stop string, the end token.
    assert_eq!(plain[0].3, FinishReason::Length);
    assert!(
        plain.iter().filter(|o| o.3 == FinishReason::Stop).count() >= 1,
        "no case ended by a stop string or the end token: {:?}",
        plain.iter().map(|o| (&o.2, o.3)).collect::<Vec<_>>()
    );
}
