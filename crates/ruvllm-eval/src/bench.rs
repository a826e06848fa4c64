//! `ruvllm bench routing`: the held-out routing benchmark. Builds the default router from the
//! catalogue's training examples only, then measures on the separate test split: accuracy
//! overall / per agent / per difficulty, confusion matrix, calibration, route latency with and
//! without the embedding, the keyword baseline on the same split, the learning experiment, the
//! large-index latency test and the paraphrase check. Prints Markdown tables (`to_markdown`) or
//! serialises to JSON.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use ruvllm_embed::{cosine, Embedder};
use ruvllm_router::catalogue::{self, TestTask};
use ruvllm_router::index::IndexConfig;
use ruvllm_router::keyword::KeywordRouter;
use ruvllm_router::router::{Params, Router, Source};
use ruvllm_router::{Error, Result};

/// Benchmark options.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Pattern counts for the scale test (the target is stated at 50,000).
    pub scale_sizes: Vec<usize>,
    /// Repetitions of the no-embedding latency loop.
    pub repeats: usize,
    /// Random halvings for the learning protocol besides the fixed one (seeds 1..=halvings);
    /// 0 skips it. About 100 s of CPU per halving (both scopes), spread over up to 8 threads.
    pub halvings: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions { scale_sizes: vec![5_000, 50_000], repeats: 50, halvings: 0 }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub p50_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
    pub samples: usize,
}

fn latency(mut us: Vec<f64>) -> Latency {
    if us.is_empty() {
        return Latency { p50_us: 0.0, p99_us: 0.0, mean_us: 0.0, samples: 0 };
    }
    us.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| us[((us.len() as f64 - 1.0) * p).round() as usize];
    Latency { p50_us: q(0.5), p99_us: q(0.99), mean_us: us.iter().sum::<f64>() / us.len() as f64, samples: us.len() }
}

#[derive(Debug, Clone, Serialize)]
pub struct Accuracy {
    pub correct: usize,
    pub total: usize,
    pub accuracy: f64,
    pub per_agent: Vec<(String, usize, usize)>,
    pub per_difficulty: Vec<(String, usize, usize)>,
    /// `confusion[true][predicted]`, agents in catalogue order.
    pub confusion: Vec<Vec<usize>>,
    /// Misrouted tasks: (text, true, predicted, difficulty).
    pub errors: Vec<(String, String, String, String)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Bucket {
    pub lo: f32,
    pub hi: f32,
    pub count: usize,
    pub mean_confidence: f64,
    pub accuracy: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    pub buckets: Vec<Bucket>,
    /// Expected calibration error (10 equal-width buckets).
    pub ece: f64,
    pub mean_confidence: f64,
    pub brier: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct LearningRun {
    /// `all tasks` (first-round and follow-ups) or `first round` (the follow-ups left out of
    /// both halves).
    pub scope: String,
    pub fed: String,
    pub measured: String,
    pub variant: String,
    pub before: f64,
    pub after: f64,
    pub before_correct: usize,
    pub after_correct: usize,
    pub total: usize,
    pub feedback_calls: usize,
    /// Measured tasks whose routing the feedback changed: (text, true agent, before, after).
    pub changed: Vec<(String, String, String, String)>,
}

/// One direction of one random halving (`BenchOptions::halvings`): the measured half routed
/// right before, after `outcomes+retry`, and with the `labelled examples` reference.
#[derive(Debug, Clone, Serialize)]
pub struct HalvingRun {
    /// `all tasks` or `first round`, as in `LearningRun`.
    pub scope: String,
    pub seed: u64,
    /// The fed half (`A` or `B`); the other is measured.
    pub fed: String,
    pub before: usize,
    pub outcomes_retry: usize,
    pub labelled: usize,
    pub total: usize,
}

/// One correction: a held-out task the router got wrong gets a failed outcome with the routed
/// agent and a successful retry with the right one, on a fresh copy of the router.
#[derive(Debug, Clone, Serialize)]
pub struct CorrectionRun {
    /// `on` (default `memory_gain`) or `off` (`memory_gain` 0).
    pub memory: String,
    /// Wrongly routed tasks corrected (one at a time).
    pub tasks: usize,
    /// Of them, routed right afterwards.
    pub fixed: usize,
    /// Their related tasks (the follow-up of a first-round task, the task a follow-up follows):
    /// routed right before and after the correction.
    pub related: usize,
    pub related_before: usize,
    pub related_after: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScaleRow {
    pub patterns: usize,
    pub index: String,
    pub build_ms: f64,
    pub route_no_embed: Latency,
    /// The k-NN search alone through the index (HNSW + exact tail, or exact scan).
    pub knn_search: Latency,
    pub exact_scan: Latency,
    pub recall_at_10: f64,
    pub accuracy: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PairRow {
    pub text: String,
    pub paraphrase: String,
    pub unrelated: String,
    pub sim_paraphrase: f32,
    pub sim_unrelated: f32,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub embedder: String,
    pub dim: usize,
    pub agents: Vec<String>,
    pub train_patterns: usize,
    pub test_tasks: usize,
    pub build_ms: f64,
    pub params: Params,
    pub embed_one: Latency,
    pub embed_batch_per_text_us: f64,
    pub router: Accuracy,
    pub router_with_embed: Latency,
    pub router_no_embed: Latency,
    pub keyword: Accuracy,
    pub keyword_latency: Latency,
    pub calibration: Calibration,
    /// Embedding-router accuracy on first-round tasks and on follow-ups: (name, correct, total).
    pub rounds: Vec<(String, usize, usize)>,
    pub learning: Vec<LearningRun>,
    /// The learning protocol over random halvings (empty unless `BenchOptions::halvings`).
    pub halvings: Vec<HalvingRun>,
    pub corrections: Vec<CorrectionRun>,
    pub scale: Vec<ScaleRow>,
    pub pairs: Vec<PairRow>,
    pub pairs_passed: usize,
}

fn accuracy(agents: &[String], tests: &[TestTask], predicted: &[String]) -> Accuracy {
    let idx = |n: &str| agents.iter().position(|a| a == n);
    let na = agents.len();
    let mut confusion = vec![vec![0usize; na]; na];
    let mut per_agent = vec![(0usize, 0usize); na];
    let diffs = ["easy", "medium", "hard"];
    let mut per_diff = vec![(0usize, 0usize); diffs.len()];
    let mut correct = 0;
    let mut errors = Vec::new();
    for (t, p) in tests.iter().zip(predicted) {
        let ok = &t.agent == p;
        correct += ok as usize;
        if let Some(ti) = idx(&t.agent) {
            per_agent[ti].1 += 1;
            per_agent[ti].0 += ok as usize;
            if let Some(pi) = idx(p) {
                confusion[ti][pi] += 1;
            }
        }
        if let Some(d) = diffs.iter().position(|d| *d == t.difficulty) {
            per_diff[d].1 += 1;
            per_diff[d].0 += ok as usize;
        }
        if !ok {
            errors.push((t.text.clone(), t.agent.clone(), p.clone(), t.difficulty.clone()));
        }
    }
    Accuracy {
        correct,
        total: tests.len(),
        accuracy: correct as f64 / tests.len().max(1) as f64,
        per_agent: agents.iter().cloned().zip(per_agent).map(|(a, (c, n))| (a, c, n)).collect(),
        per_difficulty: diffs.iter().map(|d| d.to_string()).zip(per_diff).map(|(d, (c, n))| (d, c, n)).collect(),
        confusion,
        errors,
    }
}

fn calibration(conf: &[f32], ok: &[bool]) -> Calibration {
    let nb = 10;
    let mut sums = vec![(0usize, 0.0f64, 0usize); nb];
    for (&c, &o) in conf.iter().zip(ok) {
        let b = ((c * nb as f32) as usize).min(nb - 1);
        sums[b].0 += 1;
        sums[b].1 += c as f64;
        sums[b].2 += o as usize;
    }
    let n = conf.len().max(1) as f64;
    let mut ece = 0.0;
    let buckets = sums
        .iter()
        .enumerate()
        .map(|(i, &(cnt, cs, oks))| {
            let (mc, acc) = if cnt > 0 { (cs / cnt as f64, oks as f64 / cnt as f64) } else { (0.0, 0.0) };
            ece += cnt as f64 / n * (mc - acc).abs();
            Bucket { lo: i as f32 / nb as f32, hi: (i + 1) as f32 / nb as f32, count: cnt, mean_confidence: mc, accuracy: acc }
        })
        .collect();
    let brier = conf.iter().zip(ok).map(|(&c, &o)| (c as f64 - o as u8 as f64).powi(2)).sum::<f64>() / n;
    Calibration { buckets, ece, mean_confidence: conf.iter().map(|&c| c as f64).sum::<f64>() / n, brier }
}

/// A small xorshift generator (deterministic inputs for benches and checks).
pub struct Rng(pub u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in (0, 1).
    pub fn unif(&mut self) -> f32 {
        ((self.next() >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }
    fn gauss(&mut self) -> f32 {
        let (u, v) = (self.unif(), self.unif());
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    }
}

fn clone_router(r: &Router, index: IndexConfig) -> Result<Router> {
    Router::from_json(&r.to_json()?, std::path::Path::new("<memory>"), r.embedder().clone(), index)
}

/// The learning experiment's halves (0 = A, 1 = B) of the held-out tasks: first-round tasks
/// alternate within each agent, so both halves cover every agent; a follow-up goes to the other
/// half from the task it follows, so each half's outcomes bear on the kinds of work that come
/// back in the other half.
pub fn halves(tests: &[TestTask], agents: &[String]) -> Vec<usize> {
    shuffled_halves(tests, agents, None)
}

/// Halves built the same way, but with each agent's first-round tasks in a seeded random order
/// before they alternate (`None`: the split's own order, i.e. `halves`). For estimating the
/// learning protocol over many halvings (`BenchOptions::halvings`).
pub fn shuffled_halves(tests: &[TestTask], agents: &[String], seed: Option<u64>) -> Vec<usize> {
    let mut rng = seed.map(|s| Rng(s.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1));
    let mut half = vec![0usize; tests.len()];
    for a in agents {
        let mut first: Vec<usize> = tests.iter().enumerate().filter(|(_, t)| &t.agent == a && t.follows.is_none()).map(|(i, _)| i).collect();
        if let Some(rng) = rng.as_mut() {
            for k in (1..first.len()).rev() {
                first.swap(k, (rng.next() % (k as u64 + 1)) as usize);
            }
        }
        for (j, i) in first.into_iter().enumerate() {
            half[i] = j % 2;
        }
    }
    for (i, t) in tests.iter().enumerate() {
        if let Some(f) = t.follows {
            half[i] = 1 - half[f];
        }
    }
    half
}

/// What one run of the learning protocol gave: tasks of the measured set routed right before and
/// after, their number, the feedback calls (or examples) given, and the measured tasks whose
/// routing changed (index, before, after).
pub struct LearningOutcome {
    pub before: usize,
    pub after: usize,
    pub total: usize,
    pub calls: usize,
    pub changed: Vec<(usize, String, String)>,
}

/// The learning protocol on a copy of `router`: feeds the tasks `fed(i)` selects, as `variant`
/// ("outcomes": post-task with the routed agent and success = routed right; "outcomes+retry":
/// plus, after a failure, success with the right agent; "labelled examples": the reference, the
/// fed tasks added with their true agents as examples), and measures the tasks `measured(i)`
/// selects before and after.
pub fn learn_and_measure(
    router: &Router,
    tests: &[TestTask],
    vecs: &[Vec<f32>],
    fed: &dyn Fn(usize) -> bool,
    measured: &dyn Fn(usize) -> bool,
    variant: &str,
) -> Result<LearningOutcome> {
    let mut r = clone_router(router, IndexConfig { background: false, ..Default::default() })?;
    let routes = |r: &mut Router| -> Result<Vec<(usize, String)>> {
        let mut out = Vec::new();
        for (i, t) in tests.iter().enumerate().filter(|(i, _)| measured(*i)) {
            out.push((i, r.route_vector(&t.text, &vecs[i])?.agent));
        }
        Ok(out)
    };
    let correct = |routed: &[(usize, String)]| routed.iter().filter(|(i, a)| *a == tests[*i].agent).count();
    let routed_before = routes(&mut r)?;
    let mut calls = 0;
    let fed_tasks = tests.iter().enumerate().filter(|(i, _)| fed(*i));
    match variant {
        "labelled examples" => {
            // The reference: the fed tasks with their true agents added as catalogue examples
            // (head retrained), as if every outcome had been reported with the right agent and
            // no failure.
            let items: Vec<(String, usize, Vec<f32>, Source)> =
                fed_tasks.map(|(i, t)| Ok((t.text.clone(), r.agent_index(&t.agent)?, vecs[i].clone(), Source::Example))).collect::<Result<_>>()?;
            calls = r.add_embedded(items)?;
        }
        "outcomes" | "outcomes+retry" => {
            for (i, t) in fed_tasks {
                let routed = r.route_vector(&t.text, &vecs[i])?.agent;
                let success = routed == t.agent;
                let a = r.agent_index(&routed)?;
                r.feedback_vector(&t.text, &vecs[i], a, success)?;
                calls += 1;
                if !success && variant == "outcomes+retry" {
                    // The task was handed to the right agent on the retry and went well.
                    let a = r.agent_index(&t.agent)?;
                    r.feedback_vector(&t.text, &vecs[i], a, true)?;
                    calls += 1;
                }
            }
        }
        other => return Err(Error::InvalidArg(format!("unknown learning variant {other:?}"))),
    }
    let routed_after = routes(&mut r)?;
    let (before, after, total) = (correct(&routed_before), correct(&routed_after), routed_after.len());
    let changed = routed_before.into_iter().zip(routed_after).filter(|(b, a)| b.1 != a.1).map(|((i, b), (_, a))| (i, b, a)).collect();
    Ok(LearningOutcome { before, after, total, calls, changed })
}

/// The learning protocol (`outcomes+retry` and the `labelled examples` reference, both
/// directions) over the random halvings `seeds` (`shuffled_halves`), on `threads` threads, each
/// with its own copy of `router`. `first_round`: the follow-ups left out of both halves.
pub fn learning_over_halvings(
    router: &Router,
    tests: &[TestTask],
    vecs: &[Vec<f32>],
    agents: &[String],
    seeds: std::ops::Range<u64>,
    first_round: bool,
    threads: usize,
) -> Result<Vec<HalvingRun>> {
    let json = router.to_json()?;
    let emb = router.embedder().clone();
    let seeds: Vec<u64> = seeds.collect();
    let per = seeds.len().div_ceil(threads.max(1)).max(1);
    let in_scope = |i: usize| !first_round || tests[i].follows.is_none();
    let worker = |chunk: &[u64]| -> Result<Vec<HalvingRun>> {
        let base = Router::from_json(&json, std::path::Path::new("<memory>"), emb.clone(), IndexConfig { background: false, ..Default::default() })?;
        let mut out = Vec::new();
        for &seed in chunk {
            let half = shuffled_halves(tests, agents, Some(seed));
            for fed in 0..2 {
                let fed_tasks = |i: usize| half[i] == fed && in_scope(i);
                let measured = |i: usize| half[i] != fed && in_scope(i);
                let o = learn_and_measure(&base, tests, vecs, &fed_tasks, &measured, "outcomes+retry")?;
                let l = learn_and_measure(&base, tests, vecs, &fed_tasks, &measured, "labelled examples")?;
                out.push(HalvingRun {
                    scope: if first_round { "first round" } else { "all tasks" }.into(),
                    seed,
                    fed: ["A", "B"][fed].into(),
                    before: o.before,
                    outcomes_retry: o.after,
                    labelled: l.after,
                    total: o.total,
                });
            }
        }
        Ok(out)
    };
    let results: Vec<Result<Vec<HalvingRun>>> = std::thread::scope(|sc| {
        let handles: Vec<_> = seeds.chunks(per).map(|chunk| sc.spawn(move || worker(chunk))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(Error::Internal("a halving worker panicked".into())))).collect()
    });
    let mut all = Vec::new();
    for r in results {
        all.extend(r?);
    }
    Ok(all)
}

/// Mean and standard error of `x`, and how many are above, at and below zero.
fn change_stats(x: &[f64]) -> (f64, f64, [usize; 3]) {
    let n = x.len().max(1) as f64;
    let m = x.iter().sum::<f64>() / n;
    let sd = (x.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt();
    let count = |f: &dyn Fn(f64) -> bool| x.iter().filter(|&&v| f(v)).count();
    (m, sd / n.sqrt(), [count(&|v| v > 0.0), count(&|v| v == 0.0), count(&|v| v < 0.0)])
}

/// The task related to held-out task `i`: its follow-up, or the task it follows.
pub fn related(tests: &[TestTask], i: usize) -> Option<usize> {
    tests[i].follows.or_else(|| tests.iter().position(|t| t.follows == Some(i)))
}

/// Runs the whole benchmark. `progress` gets one line per phase.
pub fn run(embedder: Arc<dyn Embedder>, opts: &BenchOptions, progress: &mut dyn FnMut(&str)) -> Result<BenchReport> {
    let specs = catalogue::default_agent_specs()?;
    let agents: Vec<String> = specs.iter().map(|a| a.name.clone()).collect();
    let tests = catalogue::test_split()?;
    let cat = catalogue::claude_flow_agents()?;

    progress("building the router from the catalogue (training examples only)");
    let t = Instant::now();
    let mut router = Router::with_config(specs, embedder.clone(), Params::default(), IndexConfig { background: false, ..Default::default() })?;
    let build_ms = t.elapsed().as_secs_f64() * 1e3;

    progress("embedding the test split");
    let texts: Vec<&str> = tests.iter().map(|t| t.text.as_str()).collect();
    let t = Instant::now();
    let test_vecs = embedder.embed(&texts)?;
    let embed_batch_per_text_us = t.elapsed().as_secs_f64() * 1e6 / texts.len().max(1) as f64;
    let _ = embedder.embed(&[texts[0]])?; // warm-up
    let mut one = Vec::new();
    for &x in &texts {
        let t = Instant::now();
        embedder.embed(&[x])?;
        one.push(t.elapsed().as_secs_f64() * 1e6);
    }

    progress("routing the test split");
    let mut with_embed = Vec::new();
    let mut predicted = Vec::new();
    let mut conf = Vec::new();
    for &x in &texts {
        let t = Instant::now();
        let r = router.route(x)?;
        with_embed.push(t.elapsed().as_secs_f64() * 1e6);
        predicted.push(r.agent);
        conf.push(r.confidence);
    }
    let mut no_embed = Vec::new();
    for _ in 0..opts.repeats {
        for (x, v) in texts.iter().zip(&test_vecs) {
            let t = Instant::now();
            let r = router.route_vector(x, v)?;
            no_embed.push(t.elapsed().as_secs_f64() * 1e6);
            std::hint::black_box(r);
        }
    }
    let acc = accuracy(&agents, &tests, &predicted);
    let ok: Vec<bool> = tests.iter().zip(&predicted).map(|(t, p)| &t.agent == p).collect();
    let calib = calibration(&conf, &ok);
    let rounds = [("first round", false), ("follow-ups", true)]
        .iter()
        .map(|&(name, f)| {
            let of = |i: &usize| tests[*i].follows.is_some() == f;
            (name.to_string(), (0..tests.len()).filter(of).filter(|&i| ok[i]).count(), (0..tests.len()).filter(of).count())
        })
        .filter(|r| r.2 > 0)
        .collect();

    progress("keyword baseline");
    let kw = KeywordRouter::new(&cat, "coder");
    let mut kw_pred = Vec::new();
    let mut kw_lat = Vec::new();
    for _ in 0..opts.repeats.max(1) {
        kw_pred.clear();
        for &x in &texts {
            let t = Instant::now();
            let (a, _) = kw.route(x);
            kw_lat.push(t.elapsed().as_secs_f64() * 1e6);
            kw_pred.push(a);
        }
    }
    let kw_acc = accuracy(&agents, &tests, &kw_pred);

    progress("learning experiment");
    let half = halves(&tests, &agents);
    let mut learning = Vec::new();
    let scopes: &[&str] = if tests.iter().any(|t| t.follows.is_some()) { &["all tasks", "first round"] } else { &["all tasks"] };
    for &scope in scopes {
        let in_scope = |i: usize| scope == "all tasks" || tests[i].follows.is_none();
        for (fed, measured) in [(0usize, 1usize), (1, 0)] {
            for variant in ["outcomes", "outcomes+retry", "labelled examples"] {
                let measured_tasks = |i: usize| half[i] == measured && in_scope(i);
                let fed_tasks = |i: usize| half[i] == fed && in_scope(i);
                let o = learn_and_measure(&router, &tests, &test_vecs, &fed_tasks, &measured_tasks, variant)?;
                let (before, after, total, calls) = (o.before, o.after, o.total, o.calls);
                let changed = o.changed.into_iter().map(|(i, b, a)| (tests[i].text.clone(), tests[i].agent.clone(), b, a)).collect();
                learning.push(LearningRun {
                    scope: scope.into(),
                    fed: ["A", "B"][fed].into(),
                    measured: ["A", "B"][measured].into(),
                    variant: variant.into(),
                    before: before as f64 / total as f64,
                    after: after as f64 / total as f64,
                    before_correct: before,
                    after_correct: after,
                    total,
                    feedback_calls: calls,
                    changed,
                });
            }
        }
    }

    let mut halvings = Vec::new();
    if opts.halvings > 0 {
        // Independent halvings, one router copy per thread; the results do not depend on the
        // thread count (tests/bench.rs).
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, 8).min(opts.halvings);
        progress(&format!("learning over {} random halvings on {threads} threads (about {} min)", opts.halvings, (opts.halvings * 100).div_ceil(60 * threads)));
        for &scope in scopes {
            halvings.extend(learning_over_halvings(&router, &tests, &test_vecs, &agents, 1..opts.halvings as u64 + 1, scope == "first round", threads)?);
        }
    }

    progress("corrections");
    // The immediate effect of one correction: each task the router gets wrong, alone, on a fresh
    // copy: failure with the routed agent, success with the right one; then it and its related
    // task are routed again. With the outcome memory on and off, side by side.
    let mut corrections = Vec::new();
    for (memory, gain) in [("on", router.params().memory_gain), ("off", 0.0)] {
        let mut run = CorrectionRun { memory: memory.into(), tasks: 0, fixed: 0, related: 0, related_before: 0, related_after: 0 };
        for (i, t) in tests.iter().enumerate() {
            if predicted[i] == t.agent {
                continue;
            }
            let mut r = clone_router(&router, IndexConfig { background: false, ..Default::default() })?;
            let mut p = r.params().clone();
            p.memory_gain = gain;
            r.set_params(p);
            let rel = related(&tests, i);
            let rel_right = |r: &mut Router| -> Result<bool> {
                Ok(match rel {
                    Some(j) => r.route_vector(&tests[j].text, &test_vecs[j])?.agent == tests[j].agent,
                    None => false,
                })
            };
            let rel_before = rel_right(&mut r)?;
            let wrong = r.agent_index(&predicted[i])?;
            r.feedback_vector(&t.text, &test_vecs[i], wrong, false)?;
            let right = r.agent_index(&t.agent)?;
            r.feedback_vector(&t.text, &test_vecs[i], right, true)?;
            run.tasks += 1;
            run.fixed += (r.route_vector(&t.text, &test_vecs[i])?.agent == t.agent) as usize;
            if rel.is_some() {
                run.related += 1;
                run.related_before += rel_before as usize;
                run.related_after += rel_right(&mut r)? as usize;
            }
        }
        corrections.push(run);
    }

    let mut scale = Vec::new();
    for &n in &opts.scale_sizes {
        progress(&format!("scale test: {n} patterns (synthetic extras around the real ones)"));
        let mut r = clone_router(&router, IndexConfig { background: false, ..Default::default() })?;
        let base = r.patterns().len();
        let mut rng = Rng(0x9e3779b97f4a7c15 ^ n as u64);
        let mut extra = Vec::with_capacity(n.saturating_sub(base));
        // Noise of std 0.06 per dimension gives cos about 0.75 to the source pattern.
        for j in 0..n.saturating_sub(base) {
            let src = (rng.next() as usize) % base;
            let v: Vec<f32> = r.index().vector(src).iter().map(|x| x + 0.06 * rng.gauss()).collect();
            extra.push((format!("synthetic {j}"), r.patterns()[src].agent, ruvllm_embed::l2_normalized(v), Source::Synthetic));
        }
        let t = Instant::now();
        r.add_embedded(extra)?;
        r.wait_index();
        let build_ms = t.elapsed().as_secs_f64() * 1e3;
        let mut lat = Vec::new();
        let mut correct = 0;
        for rep in 0..opts.repeats.clamp(1, 20) {
            for (i, v) in test_vecs.iter().enumerate() {
                let t = Instant::now();
                let route = r.route_vector(&tests[i].text, v)?;
                lat.push(t.elapsed().as_secs_f64() * 1e6);
                if rep == 0 {
                    correct += (route.agent == tests[i].agent) as usize;
                }
            }
        }
        let k = r.params().k;
        let mut exact = Vec::new();
        let mut knn = Vec::new();
        let mut hit = 0;
        for rep in 0..opts.repeats.clamp(1, 10) {
            for v in &test_vecs {
                let t = Instant::now();
                let approx: Vec<usize> = r_index_search(&mut r, v, k);
                knn.push(t.elapsed().as_secs_f64() * 1e6);
                if rep == 0 {
                    let t = Instant::now();
                    let ex = r.index().search_exact(v, k);
                    exact.push(t.elapsed().as_secs_f64() * 1e6);
                    hit += ex.iter().filter(|(id, _)| approx.contains(id)).count();
                }
            }
        }
        scale.push(ScaleRow {
            patterns: r.patterns().len(),
            index: if r.index().graph_len() > 0 {
                format!("HNSW over {} + exact tail {}", r.index().graph_len(), r.index().len() - r.index().graph_len())
            } else {
                "exact scan".into()
            },
            build_ms,
            route_no_embed: latency(lat),
            knn_search: latency(knn),
            exact_scan: latency(exact),
            recall_at_10: hit as f64 / (k * test_vecs.len()).max(1) as f64,
            accuracy: correct as f64 / tests.len() as f64,
        });
    }

    progress("paraphrase / unrelated pairs");
    let mut pairs = Vec::new();
    for p in catalogue::paraphrase_pairs()? {
        let v = embedder.embed(&[&p.text, &p.paraphrase, &p.unrelated])?;
        pairs.push(PairRow {
            sim_paraphrase: cosine(&v[0], &v[1]),
            sim_unrelated: cosine(&v[0], &v[2]),
            text: p.text,
            paraphrase: p.paraphrase,
            unrelated: p.unrelated,
        });
    }
    let pairs_passed = pairs.iter().filter(|p| p.sim_paraphrase > p.sim_unrelated).count();

    Ok(BenchReport {
        embedder: embedder.id().to_string(),
        dim: embedder.dim(),
        agents,
        train_patterns: router.patterns().len(),
        test_tasks: tests.len(),
        build_ms,
        params: router.params().clone(),
        embed_one: latency(one),
        embed_batch_per_text_us,
        router: acc,
        router_with_embed: latency(with_embed),
        router_no_embed: latency(no_embed),
        keyword: kw_acc,
        keyword_latency: latency(kw_lat),
        calibration: calib,
        rounds,
        learning,
        halvings,
        corrections,
        scale,
        pairs,
        pairs_passed,
    })
}

fn r_index_search(r: &mut Router, v: &[f32], k: usize) -> Vec<usize> {
    r.index_search(v, k).into_iter().map(|(id, _)| id).collect()
}

fn pct(c: usize, n: usize) -> String {
    format!("{:.1} % ({c}/{n})", 100.0 * c as f64 / n.max(1) as f64)
}

impl BenchReport {
    /// The report as Markdown tables.
    pub fn to_markdown(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(s, "## Routing benchmark (held-out split)\n");
        let _ = writeln!(
            s,
            "embedder `{}` (dim {}); router built from {} catalogue patterns (13 descriptions + examples) in {:.0} ms; {} held-out tasks; fitted k={} tau={} beta_linear={} beta_knn={} beta_nearest={} beta_centroid={}\n",
            self.embedder, self.dim, self.train_patterns, self.build_ms, self.test_tasks, self.params.k, self.params.tau, self.params.beta_linear, self.params.beta_knn, self.params.beta_nearest, self.params.beta_centroid
        );
        let _ = writeln!(s, "| router | accuracy | easy | medium | hard | route p50 | route p99 |");
        let _ = writeln!(s, "|---|---|---|---|---|---|---|");
        let d = |a: &Accuracy, i: usize| pct(a.per_difficulty[i].1, a.per_difficulty[i].2);
        let _ = writeln!(
            s,
            "| embedding router (with embedding) | {} | {} | {} | {} | {:.0} µs | {:.0} µs |",
            pct(self.router.correct, self.router.total),
            d(&self.router, 0),
            d(&self.router, 1),
            d(&self.router, 2),
            self.router_with_embed.p50_us,
            self.router_with_embed.p99_us
        );
        let _ = writeln!(
            s,
            "| embedding router (pre-embedded task) | same | | | | {:.1} µs | {:.1} µs |",
            self.router_no_embed.p50_us, self.router_no_embed.p99_us
        );
        let _ = writeln!(
            s,
            "| keyword baseline | {} | {} | {} | {} | {:.1} µs | {:.1} µs |\n",
            pct(self.keyword.correct, self.keyword.total),
            d(&self.keyword, 0),
            d(&self.keyword, 1),
            d(&self.keyword, 2),
            self.keyword_latency.p50_us,
            self.keyword_latency.p99_us
        );
        if self.rounds.len() > 1 {
            let r: Vec<String> = self.rounds.iter().map(|(n, c, t)| format!("{n} {}", pct(*c, *t))).collect();
            let _ = writeln!(s, "Embedding router by round: {}.\n", r.join(", "));
        }
        let _ = writeln!(
            s,
            "Embedding one task (1 thread): p50 {:.2} ms, p99 {:.2} ms; batched: {:.2} ms per task.\n",
            self.embed_one.p50_us / 1e3,
            self.embed_one.p99_us / 1e3,
            self.embed_batch_per_text_us / 1e3
        );
        let _ = writeln!(s, "### Per agent\n\n| agent | router | keyword |\n|---|---|---|");
        for ((a, c, n), (_, kc, kn)) in self.router.per_agent.iter().zip(&self.keyword.per_agent) {
            let _ = writeln!(s, "| {a} | {} | {} |", pct(*c, *n), pct(*kc, *kn));
        }
        let short = |a: &str| -> String {
            match a {
                "security-architect" => "sec".into(),
                "api-docs" => "api".into(),
                other => other.chars().take(4).collect(),
            }
        };
        for (title, acc) in [("embedding router", &self.router), ("keyword baseline", &self.keyword)] {
            let _ = writeln!(s, "\n### Confusion matrix, {title} (rows: true agent, columns: routed)\n");
            let _ = write!(s, "| true \\ routed |");
            for a in &self.agents {
                let _ = write!(s, " {} |", short(a));
            }
            let _ = write!(s, "\n|---|");
            for _ in &self.agents {
                let _ = write!(s, "---|");
            }
            let _ = writeln!(s);
            for (a, row) in self.agents.iter().zip(&acc.confusion) {
                let _ = write!(s, "| {a} |");
                for c in row {
                    let _ = write!(s, " {} |", if *c == 0 { ".".to_string() } else { c.to_string() });
                }
                let _ = writeln!(s);
            }
        }
        let _ = writeln!(s, "\n### Misrouted held-out tasks (embedding router)\n\n| task | difficulty | true | routed |\n|---|---|---|---|");
        for (t, a, p, dd) in &self.router.errors {
            let _ = writeln!(s, "| {t} | {dd} | {a} | {p} |");
        }
        let _ = writeln!(
            s,
            "\n### Calibration of `confidence` (held-out)\n\nECE {:.3}, Brier {:.3}, mean confidence {:.3} vs accuracy {:.3}\n\n| confidence | tasks | mean confidence | accuracy |\n|---|---|---|---|",
            self.calibration.ece, self.calibration.brier, self.calibration.mean_confidence, self.router.accuracy
        );
        for b in self.calibration.buckets.iter().filter(|b| b.count > 0) {
            let _ = writeln!(s, "| {:.1}–{:.1} | {} | {:.3} | {:.3} |", b.lo, b.hi, b.count, b.mean_confidence, b.accuracy);
        }
        let _ = writeln!(
            s,
            "\n### Learning (feed back one half's outcomes, measure the other half)\n\n`outcomes`: post-task with the routed agent and success = (routed == true). `outcomes+retry`: additionally, after a failure, the retry with the right agent reports success. Halves: first-round tasks alternate within each agent; a follow-up is in the other half from the task it follows. `first round`: the same experiment with the follow-ups left out (the split as it was before they were added). `labelled examples` is the reference, not learning: the fed half's tasks with their true agents added as catalogue examples (head retrained), what the router would learn if every outcome named the right agent.\n\n| tasks | fed | measured | variant | feedback calls / examples | before | after |\n|---|---|---|---|---|---|---|"
        );
        for l in &self.learning {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} |",
                l.scope,
                l.fed,
                l.measured,
                l.variant,
                l.feedback_calls,
                pct(l.before_correct, l.total),
                pct(l.after_correct, l.total)
            );
        }
        let _ = writeln!(
            s,
            "\nTasks whose routing the feedback changed (`outcomes+retry`, all tasks):\n\n| fed | task | true | before | after |\n|---|---|---|---|---|"
        );
        for l in self.learning.iter().filter(|l| l.variant == "outcomes+retry" && l.scope == "all tasks") {
            for (t, a, b, x) in &l.changed {
                let _ = writeln!(s, "| {} | {t} | {a} | {b} | {x} |", l.fed);
            }
        }
        if !self.halvings.is_empty() {
            let n = self.halvings.iter().map(|h| h.seed).max().unwrap_or(0);
            let _ = writeln!(
                s,
                "\n### Learning over {n} random halvings\n\nThe protocol above (`outcomes+retry`, and the `labelled examples` reference) over {n} halvings built like the fixed one, but with each agent's first-round tasks in a seeded random order (seeds 1..{n}) before they alternate. A directed run feeds one half and measures the other (two per halving); the change is in tasks of the measured half. Per halving, both directions summed.\n\n| tasks | variant | mean before (per half) | mean change per directed run (s.e.) | directed runs higher / same / lower | mean change per halving (s.e.) | halvings higher / same / lower |\n|---|---|---|---|---|---|---|"
            );
            for scope in ["all tasks", "first round"] {
                let runs: Vec<&HalvingRun> = self.halvings.iter().filter(|h| h.scope == scope).collect();
                if runs.is_empty() {
                    continue;
                }
                let before = runs.iter().map(|h| h.before as f64).sum::<f64>() / runs.len() as f64;
                for (variant, after) in [
                    ("outcomes+retry", &(|h: &HalvingRun| h.outcomes_retry) as &dyn Fn(&HalvingRun) -> usize),
                    ("labelled examples", &|h: &HalvingRun| h.labelled),
                ] {
                    let directed: Vec<f64> = runs.iter().map(|h| after(h) as f64 - h.before as f64).collect();
                    let mut seeds: Vec<u64> = runs.iter().map(|h| h.seed).collect();
                    seeds.dedup();
                    let summed: Vec<f64> =
                        seeds.iter().map(|&sd| runs.iter().filter(|h| h.seed == sd).map(|h| after(h) as f64 - h.before as f64).sum()).collect();
                    let (dm, dse, dc) = change_stats(&directed);
                    let (hm, hse, hc) = change_stats(&summed);
                    let _ = writeln!(
                        s,
                        "| {scope} | {variant} | {before:.1} of {} | {dm:+.2} ({dse:.2}) | {} / {} / {} | {hm:+.2} ({hse:.2}) | {} / {} / {} |",
                        runs[0].total, dc[0], dc[1], dc[2], hc[0], hc[1], hc[2]
                    );
                }
            }
        }
        let _ = writeln!(
            s,
            "\n### One correction at a time\n\nEach held-out task the router gets wrong, alone, on a fresh copy of the router: post-task failure with the routed agent, then success with the right agent; then the task and its related task (its follow-up, or the task it follows) are routed again. Outcome memory on (default) and off, same run.\n\n| outcome memory | corrected tasks | routed right afterwards | related tasks right before | after |\n|---|---|---|---|---|"
        );
        for c in &self.corrections {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                c.memory,
                c.tasks,
                pct(c.fixed, c.tasks),
                pct(c.related_before, c.related),
                pct(c.related_after, c.related)
            );
        }
        let _ = writeln!(
            s,
            "\n### Scale: route latency without embedding (catalogue + synthetic patterns)\n\n| patterns | index | build | route p50 | route p99 | k-NN search p50 | k-NN search p99 | exact scan p50 | recall@10 vs exact | held-out accuracy |\n|---|---|---|---|---|---|---|---|---|---|"
        );
        for r in &self.scale {
            let _ = writeln!(
                s,
                "| {} | {} | {:.1} s | {:.1} µs | {:.1} µs | {:.1} µs | {:.1} µs | {:.1} µs | {:.3} | {:.1} % |",
                r.patterns,
                r.index,
                r.build_ms / 1e3,
                r.route_no_embed.p50_us,
                r.route_no_embed.p99_us,
                r.knn_search.p50_us,
                r.knn_search.p99_us,
                r.exact_scan.p50_us,
                r.recall_at_10,
                100.0 * r.accuracy
            );
        }
        let _ = writeln!(
            s,
            "\n### Paraphrase vs unrelated: {}/{} pairs have paraphrase similarity above unrelated\n\n| text | paraphrase | cos | unrelated | cos |\n|---|---|---|---|---|",
            self.pairs_passed,
            self.pairs.len()
        );
        for p in &self.pairs {
            let _ = writeln!(s, "| {} | {} | {:.3} | {} | {:.3} |", p.text, p.paraphrase, p.sim_paraphrase, p.unrelated, p.sim_unrelated);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The learning halves (the fixed one and seeded shuffles): each covers every agent with half of its first-round tasks (give or
    /// take one), and every follow-up is in the other half from the task it follows.
    #[test]
    fn halves_cover_every_agent_and_split_follow_ups() {
        let tests = catalogue::test_split().expect("test split");
        let agents: Vec<String> = catalogue::default_agent_specs().expect("catalogue").into_iter().map(|s| s.name).collect();
        let splits: Vec<Vec<usize>> = [None, Some(1), Some(2)].into_iter().map(|seed| shuffled_halves(&tests, &agents, seed)).collect();
        assert_eq!(splits[0], halves(&tests, &agents));
        assert_ne!(splits[1], splits[2], "different seeds, different halvings");
        assert_eq!(splits[1], shuffled_halves(&tests, &agents, Some(1)), "a seed gives one halving");
        for half in &splits {
            for a in &agents {
                let first: Vec<usize> = (0..tests.len()).filter(|&i| &tests[i].agent == a && tests[i].follows.is_none()).collect();
                let in_a = first.iter().filter(|&&i| half[i] == 0).count();
                assert!(in_a.abs_diff(first.len() - in_a) <= 1, "{a}: {in_a} of {}", first.len());
            }
            for (i, t) in tests.iter().enumerate() {
                if let Some(f) = t.follows {
                    assert_ne!(half[i], half[f], "{}", t.text);
                }
            }
        }
    }
}
