//! Closing an engine on the real Gemma 3 270M: every request still queued or running ends with
//! `Error::Closed` (the running one within a token, not after its last token), a request that
//! already finished keeps its result, and nothing is accepted afterwards.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ruvllm_core::engine::{EmbedRequest, Engine, Event, FinishReason, GenerateParams, GenerateRequest, LoadOptions, Prompt, ScoreRequest};
use ruvllm_core::sampling::SamplingParams;
use ruvllm_core::Error;

const WAIT: Duration = Duration::from_secs(60);

fn model_path() -> PathBuf {
    ruvllm_models::real_test_model().unwrap_or_else(|e| panic!("{e}"))
}

fn engine() -> Engine {
    Engine::load(&model_path(), LoadOptions { context_size: Some(256), threads: Some(2), ..Default::default() }).expect("load")
}

fn params(max_tokens: usize) -> GenerateParams {
    GenerateParams { max_tokens, sampling: SamplingParams::greedy(), stop: vec![], chat_template: None, diffusion: None, ..Default::default() }
}

/// A generate request whose events arrive on the returned channel.
fn request(prompt: &str, max_tokens: usize) -> (GenerateRequest, Receiver<Event>) {
    let (tx, rx) = channel();
    let req = GenerateRequest {
        prompt: Prompt::Text(prompt.into()),
        params: params(max_tokens),
        adapters: None,
        cancel: Arc::new(AtomicBool::new(false)),
        sink: Box::new(move |e| {
            let _ = tx.send(e);
        }),
    };
    (req, rx)
}

/// The tokens a request streamed, and how it ended.
fn outcome(rx: &Receiver<Event>) -> (usize, Result<FinishReason, Error>) {
    let mut tokens = 0;
    loop {
        match rx.recv_timeout(WAIT).expect("an event") {
            Event::Token { .. } => tokens += 1,
            Event::Done(c) => return (tokens, Ok(c.finish_reason)),
            Event::Error(e) => return (tokens, Err(e)),
            Event::Step(_) => {}
        }
    }
}

/// Submits a long generation and waits for its first token, so that it is running.
fn running(e: &Engine) -> Receiver<Event> {
    let (req, rx) = request("Once upon a time", 200);
    e.submit(req).unwrap();
    assert!(matches!(rx.recv_timeout(WAIT).expect("a first token"), Event::Token { .. }));
    rx
}

#[test]
fn close_ends_running_and_queued_requests_with_closed() {
    let e = engine();
    let running_rx = running(&e);

    let (queued, queued_rx) = request("The quick brown fox", 200);
    e.submit(queued).unwrap();
    let (score_tx, score_rx) = channel();
    let score = ScoreRequest {
        prompt: Prompt::Text("Water boils at".into()),
        adapters: None,
        chat_template: None,
        elbo: None,
        cancel: Arc::new(AtomicBool::new(false)),
        reply: Box::new(move |r| {
            let _ = score_tx.send(r);
        }),
    };
    e.submit_score(score).unwrap();
    let (embed_tx, embed_rx) = channel();
    let embed = EmbedRequest {
        texts: vec!["hello".into()],
        adapters: None,
        cancel: Arc::new(AtomicBool::new(false)),
        reply: Box::new(move |r| {
            let _ = embed_tx.send(r);
        }),
    };
    e.submit_embed(embed).unwrap();

    let t0 = Instant::now();
    e.close();
    assert!(t0.elapsed() < Duration::from_secs(10), "close waited {:?} for the running request", t0.elapsed());
    assert!(e.is_closed());

    let (n, end) = outcome(&running_rx);
    assert!(matches!(end, Err(Error::Closed)), "running request ended with {end:?} after {n} more tokens");
    assert!(n < 199, "the running request was not stopped ({n} more tokens)");
    let (n, end) = outcome(&queued_rx);
    assert!(matches!(end, Err(Error::Closed)) && n == 0, "queued request: {n} tokens, {end:?}");
    assert!(matches!(score_rx.recv_timeout(WAIT).unwrap(), Err(Error::Closed)));
    assert!(matches!(embed_rx.recv_timeout(WAIT).unwrap(), Err(Error::Closed)));
}

#[test]
fn after_close_nothing_is_accepted_and_finished_requests_keep_their_result() {
    let e = engine();
    let done = e.generate_blocking(Prompt::Text("The capital of France is".into()), params(2)).unwrap();
    assert_eq!(done.finish_reason, FinishReason::Length);
    // A request aborted by its own flag, with the engine open, is a completion, not an error.
    let (aborted, rx) = request("Hello", 50);
    aborted.cancel.store(true, std::sync::atomic::Ordering::SeqCst);
    e.submit(aborted).unwrap();
    assert!(matches!(outcome(&rx), (0, Ok(FinishReason::Abort))));

    e.close();
    e.close();
    let (req, _rx) = request("Hello", 4);
    assert!(matches!(e.submit(req), Err(Error::Closed)));
    assert!(matches!(e.generate_blocking(Prompt::Text("Hello".into()), params(4)), Err(Error::Closed)));
    assert!(matches!(e.embed_blocking(&["hello"]), Err(Error::Closed)));
    assert!(matches!(e.tokenize("hello", true), Err(Error::Closed)));
}

#[test]
fn stop_returns_at_once_and_the_running_request_ends_with_closed() {
    let e = engine();
    let rx = running(&e);
    e.stop();
    assert!(e.is_closed());
    let (req, _rx) = request("Hello", 4);
    assert!(matches!(e.submit(req), Err(Error::Closed)));
    let (n, end) = outcome(&rx);
    assert!(matches!(end, Err(Error::Closed)), "ended with {end:?} after {n} more tokens");
    e.close();
}
