//! Sampler and StopMatcher behaviour.

use ruvllm_core::sampling::{Sampler, SamplingParams, StopMatcher, StopResult};

/// Deterministic pseudo-random logits in [-5, 5) (a tiny LCG, independent of the sampler's RNG).
fn logits(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 10.0 - 5.0
        })
        .collect()
}

fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[best] {
            best = i;
        }
    }
    best as u32
}

/// Plain sampling params: temperature 1, every filter off, no penalties.
fn plain(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed, ..SamplingParams::default() }
}

/// Draws `n` tokens, each from a fresh copy of `logits`.
fn draws(params: SamplingParams, logits: &[f32], n: usize) -> Vec<u32> {
    let mut s = Sampler::new(params);
    (0..n).map(|_| s.sample(&mut logits.to_vec(), &[])).collect()
}

#[test]
fn defaults() {
    let p = SamplingParams::default();
    assert_eq!((p.temperature, p.top_k, p.top_p, p.min_p), (0.8, 40, 0.95, 0.05));
    assert_eq!((p.repeat_penalty, p.presence_penalty, p.frequency_penalty), (1.0, 0.0, 0.0));
    assert_eq!((p.repeat_last_n, p.seed), (64, 0));
    assert_eq!(SamplingParams::greedy().temperature, 0.0);
}

#[test]
fn greedy_is_argmax_and_deterministic() {
    let mut s = Sampler::new(SamplingParams::greedy());
    for seed in 0..20 {
        let l = logits(1000, seed);
        assert_eq!(s.sample(&mut l.clone(), &[]), argmax(&l));
        assert_eq!(s.sample(&mut l.clone(), &[]), argmax(&l));
    }
    assert_eq!(s.sample(&mut [1.0, 3.0, 3.0, 2.0], &[]), 1, "first max on ties");
    assert_eq!(s.sample(&mut [f32::NAN, 1.0, f32::NAN, 0.5], &[]), 1, "NaN never chosen");
    assert_eq!(s.sample(&mut [f32::NAN, f32::NAN], &[]), 0);
    assert_eq!(s.sample(&mut [], &[]), 0);
    // Longer than the 16-lane pass, ties in different lanes and in the tail, infinities.
    let mut l = vec![-1.0f32; 100];
    l[3] = f32::NAN;
    l[37] = 4.0;
    l[85] = 4.0;
    l[98] = 4.0;
    assert_eq!(s.sample(&mut l.clone(), &[]), 37, "first max across lanes");
    l[99] = f32::INFINITY;
    assert_eq!(s.sample(&mut l.clone(), &[]), 99, "max in the tail");
    let mut z = vec![-0.0f32; 40];
    z[20] = 0.0;
    assert_eq!(s.sample(&mut z, &[]), 0, "0.0 does not beat an earlier -0.0");
    let mut inf = vec![f32::NEG_INFINITY; 40];
    inf[0] = f32::NAN;
    assert_eq!(s.sample(&mut inf, &[]), 1, "only -inf: the first of them");
    let mut negative = Sampler::new(SamplingParams { temperature: -1.0, ..SamplingParams::default() });
    assert_eq!(negative.sample(&mut [0.0, 2.0, 1.0], &[]), 1);
}

#[test]
fn same_seed_same_tokens_different_seeds_differ() {
    let l = logits(5000, 1);
    let params = |seed| SamplingParams { temperature: 1.5, top_k: 0, top_p: 1.0, min_p: 0.0, seed, ..Default::default() };
    let a = draws(params(42), &l, 300);
    assert_eq!(a, draws(params(42), &l, 300));
    let b = draws(params(43), &l, 300);
    assert_ne!(a, b);
    let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
    assert!(same < 100, "seeds 42 and 43 agree on {same} of 300 draws");
    let distinct: std::collections::HashSet<_> = a.iter().collect();
    assert!(distinct.len() > 50, "sampling should spread over many tokens, got {}", distinct.len());
}

#[test]
fn default_params_are_deterministic_over_a_sequence() {
    let run = || {
        let mut s = Sampler::new(SamplingParams { seed: 9, ..Default::default() });
        let mut history = vec![];
        for step in 0..50 {
            let t = s.sample(&mut logits(2000, step), &history);
            history.push(t);
        }
        history
    };
    assert_eq!(run(), run());
}

#[test]
fn top_k_one_is_greedy() {
    let mut s = Sampler::new(SamplingParams { top_k: 1, ..plain(5) });
    for seed in 0..50 {
        let l = logits(3000, seed);
        assert_eq!(s.sample(&mut l.clone(), &[]), argmax(&l));
    }
}

#[test]
fn top_k_keeps_only_the_k_best() {
    let l = logits(262_144, 3);
    let mut sorted: Vec<u32> = (0..l.len() as u32).collect();
    sorted.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]));
    let best: std::collections::HashSet<u32> = sorted[..40].iter().copied().collect();
    let params = SamplingParams { temperature: 5.0, top_k: 40, ..plain(11) };
    let picked = draws(params, &l, 200);
    assert!(picked.iter().all(|t| best.contains(t)));
    assert!(picked.iter().collect::<std::collections::HashSet<_>>().len() > 10);
}

#[test]
fn top_k_on_ties_and_ascending_logits() {
    let flat = vec![1.0; 1000];
    let picked = draws(SamplingParams { top_k: 3, ..plain(4) }, &flat, 300);
    assert!(picked.iter().all(|&t| t < 3), "ties go to the lowest ids");
    assert!((0..3).all(|t| picked.contains(&t)));
    let rising: Vec<f32> = (0..10_000).map(|i| i as f32 * 1e-3).collect();
    let picked = draws(SamplingParams { top_k: 5, ..plain(4) }, &rising, 300);
    assert!(picked.iter().all(|&t| t >= 9_995));
}

#[test]
fn tiny_top_p_is_greedy() {
    let mut s = Sampler::new(SamplingParams { top_p: 1e-6, ..plain(5) });
    for seed in 0..50 {
        let l = logits(3000, seed);
        assert_eq!(s.sample(&mut l.clone(), &[]), argmax(&l));
    }
}

#[test]
fn top_p_cuts_the_tail() {
    // Probabilities 0.5, 0.25, 0.125, 0.0625, ...: top-p 0.7 keeps exactly the first two.
    let l: Vec<f32> = (0..20).map(|i| -(i as f32) * std::f32::consts::LN_2).collect();
    let picked = draws(SamplingParams { top_p: 0.7, ..plain(1) }, &l, 2000);
    assert!(picked.iter().all(|&t| t < 2));
    assert!(picked.contains(&0) && picked.contains(&1));
}

#[test]
fn min_p_filters_unlikely_tokens() {
    // Relative probabilities 1, 0.5, 0.1.
    let l = [2.0, 2.0 - 2f32.ln(), 2.0 - 10f32.ln()];
    let filtered = draws(SamplingParams { min_p: 0.3, ..plain(2) }, &l, 3000);
    assert!(!filtered.contains(&2), "token below min-p was drawn");
    assert!(filtered.contains(&0) && filtered.contains(&1));
    let unfiltered = draws(plain(2), &l, 3000);
    assert!(unfiltered.contains(&2));
    let strict = draws(SamplingParams { min_p: 2.0, ..plain(2) }, &l, 100);
    assert!(strict.iter().all(|&t| t == 0), "min-p above 1 still keeps the best token");
}

#[test]
fn repeat_penalty_lowers_repeated_tokens() {
    let params = SamplingParams { repeat_penalty: 2.0, ..SamplingParams::greedy() };
    let mut s = Sampler::new(params.clone());
    let mut l = [2.0, -1.0, 1.0, 0.5];
    s.sample(&mut l, &[0, 1, 0]);
    assert_eq!(l, [1.0, -2.0, 1.0, 0.5], "positive logits divided, negative multiplied, once per token");
    assert_eq!(s.sample(&mut [2.0, 1.5], &[0]), 1, "the repeated token loses its lead");
    let mut s = Sampler::new(SamplingParams { repeat_last_n: 2, ..params });
    assert_eq!(s.sample(&mut [2.0, 1.5], &[0, 5, 5]), 0, "tokens outside the window are not penalized");
    assert_eq!(s.sample(&mut [2.0, 1.5], &[7]), 0, "out-of-vocab history is ignored");
}

#[test]
fn presence_and_frequency_penalties() {
    let params = SamplingParams { presence_penalty: 0.25, frequency_penalty: 0.5, ..SamplingParams::greedy() };
    let mut l = [1.0, 1.0, 1.0];
    Sampler::new(params).sample(&mut l, &[0, 0, 1]);
    assert_eq!(l, [1.0 - 1.0 - 0.25, 1.0 - 0.5 - 0.25, 1.0]);
}

#[test]
fn extreme_logits_are_handled() {
    let mut s = Sampler::new(plain(3));
    assert_eq!(s.sample(&mut [f32::NAN, f32::INFINITY, 0.0], &[]), 1);
    assert_eq!(s.sample(&mut [f32::NEG_INFINITY, f32::NEG_INFINITY, 5.0], &[]), 2);
    assert_eq!(s.sample(&mut [f32::NEG_INFINITY, f32::NEG_INFINITY], &[]), 0);
    assert_eq!(s.sample(&mut [f32::NAN; 3], &[]), 0);
    let mut hot = Sampler::new(SamplingParams { temperature: f32::INFINITY, ..plain(3) });
    assert!(hot.sample(&mut [f32::MIN, f32::MAX, 0.0], &[]) < 3);
}

fn stop_matcher(stops: &[&str]) -> StopMatcher {
    StopMatcher::new(stops.iter().map(|s| s.to_string()).collect())
}

fn cont(s: &str) -> StopResult {
    StopResult::Continue(s.to_string())
}

#[test]
fn stop_string_in_one_piece() {
    let mut m = stop_matcher(&["</s>"]);
    assert_eq!(m.push("hello</s>world"), StopResult::Stop("hello".into()));
    assert_eq!(m.push("more"), StopResult::Stop(String::new()));
    assert_eq!(m.flush(), "");
}

#[test]
fn stop_string_spanning_pieces() {
    let mut m = stop_matcher(&["<end_of_turn>", "STOP"]);
    assert_eq!(m.push("Hi there<"), cont("Hi there"));
    assert_eq!(m.push("end_of"), cont(""));
    assert_eq!(m.push("_turn>ignored"), StopResult::Stop(String::new()));
    let mut m = stop_matcher(&["STOP"]);
    assert_eq!(m.push("abcS"), cont("abc"));
    assert_eq!(m.push("T"), cont(""));
    assert_eq!(m.push("OP"), StopResult::Stop(String::new()));
}

#[test]
fn earliest_stop_wins() {
    let mut m = stop_matcher(&["bc", "ab"]);
    assert_eq!(m.push("xabc"), StopResult::Stop("x".into()));
}

#[test]
fn held_prefix_that_is_not_a_stop_is_emitted() {
    let mut m = stop_matcher(&["<end>"]);
    assert_eq!(m.push("a <en"), cont("a "));
    assert_eq!(m.push("joy"), cont("<enjoy"));
    assert_eq!(m.push("x <"), cont("x "));
    assert_eq!(m.flush(), "<", "held text comes out at the end");
}

#[test]
fn held_text_restarts_a_stop() {
    // "aab": after "aa" the held "a" must still allow "ab" to match.
    let mut m = stop_matcher(&["ab"]);
    assert_eq!(m.push("aa"), cont("a"));
    assert_eq!(m.push("b"), StopResult::Stop(String::new()), "the output so far is \"a\"");
}

#[test]
fn multibyte_text_is_split_on_char_boundaries() {
    let mut m = stop_matcher(&["✓done"]);
    assert_eq!(m.push("é✓"), cont("é"));
    assert_eq!(m.push("don"), cont(""));
    assert_eq!(m.push("x"), cont("✓donx"));
}

#[test]
fn empty_stop_list_passes_everything() {
    let mut m = stop_matcher(&[]);
    assert_eq!(m.push("anything <end>"), cont("anything <end>"));
    assert_eq!(m.push(""), cont(""));
    assert_eq!(m.flush(), "");
    let mut m = stop_matcher(&[""]);
    assert_eq!(m.push("abc"), cont("abc"), "empty stop strings are ignored");
}
