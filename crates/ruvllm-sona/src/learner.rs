//! The learner: trajectories in, adapters out, on two threads of its own.
//!
//! - `feedback` stores the trajectory (journal, fsync) and queues it for the **instant** thread,
//!   which captures it (one forward pass with the current adapters) and takes one MicroLoRA
//!   step; the engine uses the new adapter from its next request on.
//! - The **background** thread trains the BaseLoRA (rank 4–8, every projection of every block)
//!   with full backward passes over the good trajectories not trained yet (plus as many older
//!   ones replayed), within a time budget per round, at the lowest CPU priority, on a copy of
//!   the factors: the engine never waits for it. Each round first folds the MicroLoRA into the
//!   BaseLoRA (truncated SVD back to the base rank), and ends with an EWC++ update of the
//!   Fisher estimate on general text.
//! - `consolidate` runs a round now (whatever is pending), moves the EWC anchor to the result,
//!   snapshots it into the adapter bank, saves everything and returns.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use ruvllm_core::engine::{AdapterUse, Completion, Engine, GenerateParams, Prompt};
use ruvllm_core::nn::{AdapterSet, LoraAdapter, Proj};
use ruvllm_core::sampling::SamplingParams;
use serde::{Deserialize, Serialize};

use crate::adam::Adam;
use crate::bank::Bank;
use crate::grad::{Example, Frozen, LoraParams};
use crate::store::{self, Trajectory};
use crate::{micro, Error, Result};

/// How the learner behaves; every field has a default.
#[derive(Debug, Clone)]
pub struct LearningOptions {
    pub dir: PathBuf,
    /// MicroLoRA rank (1 or 2).
    pub micro_rank: usize,
    /// BaseLoRA rank (4 to 8 recommended; 1 to 64 allowed).
    pub base_rank: usize,
    pub micro_lr: f32,
    pub base_lr: f32,
    /// Feedback without a correction trains only at or above this quality.
    pub quality_gate: f32,
    /// Candidates per position for the MicroLoRA step's truncated softmax.
    pub micro_candidates: usize,
    /// Run BaseLoRA rounds on its own (else only in `consolidate`).
    pub background: bool,
    /// Start a background round once this many good trajectories are untrained.
    pub background_min: usize,
    /// Time budget of one background round, seconds.
    pub round_seconds: f64,
    /// Passes over the new trajectories per round.
    pub epochs: usize,
    /// EWC++ on (the penalty and the Fisher updates).
    pub ewc: bool,
    pub ewc_lambda: f32,
    /// Strength of the MicroLoRA's own EWC penalty (its Fisher on general text, anchored at the
    /// last merge): the instant loop trades less general ability for what it learns at once.
    pub micro_ewc_lambda: f32,
    /// Decay of the online Fisher estimate.
    pub ewc_decay: f32,
    /// General text for the Fisher estimate; empty: the model's own samples, made once.
    pub general_text: Vec<String>,
    /// Longest training sequence (the prompt's start is cut).
    pub max_seq: usize,
    pub seed: u64,
    /// Consent to federate the learned adapter (`llm.federation.join`); off unless asked for.
    pub federate: bool,
}

impl LearningOptions {
    pub fn new(dir: PathBuf) -> Self {
        LearningOptions {
            dir,
            micro_rank: 2,
            base_rank: 8,
            micro_lr: 3e-3,
            base_lr: 1e-3,
            quality_gate: 0.7,
            micro_candidates: 32,
            background: true,
            background_min: 8,
            round_seconds: 60.0,
            epochs: 2,
            ewc: true,
            ewc_lambda: 30.0,
            micro_ewc_lambda: 3.0,
            ewc_decay: 0.9,
            general_text: Vec::new(),
            max_seq: 256,
            seed: 0,
            federate: false,
        }
    }

    fn check(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::InvalidArg(format!("learning.{m}")));
        if !(1..=2).contains(&self.micro_rank) {
            return bad("microRank must be 1 or 2");
        }
        if !(1..=64).contains(&self.base_rank) {
            return bad("baseRank must be between 1 and 64");
        }
        for (v, n) in [(self.micro_lr, "microLr"), (self.base_lr, "baseLr"), (self.ewc_lambda, "ewcLambda"), (self.micro_ewc_lambda, "microEwcLambda")] {
            if !(v.is_finite() && (0.0..=1e6).contains(&v)) {
                return bad(&format!("{n} must be a finite number ≥ 0"));
            }
        }
        if !(0.0..=1.0).contains(&self.quality_gate) {
            return bad("qualityGate must be in [0, 1]");
        }
        if !(0.0..1.0).contains(&self.ewc_decay) {
            return bad("ewcDecay must be in [0, 1)");
        }
        if !(1..=4096).contains(&self.micro_candidates) {
            return bad("microCandidates must be between 1 and 4096");
        }
        if !(self.round_seconds.is_finite() && self.round_seconds > 0.0) {
            return bad("roundSeconds must be > 0");
        }
        if !(1..=100).contains(&self.epochs) || self.background_min == 0 {
            return bad("epochs must be 1..100 and backgroundMin ≥ 1");
        }
        if !(16..=4096).contains(&self.max_seq) {
            return bad("maxSeq must be between 16 and 4096");
        }
        Ok(())
    }
}

/// What the instant update did.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstantReport {
    /// Truncated-softmax loss before the step (mean per target token).
    pub loss: f64,
    pub step_ms: f64,
    pub capture_ms: f64,
    /// Mean probability mass of the candidate set.
    pub covered_mass: f64,
    pub tokens: usize,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FeedbackOutcome {
    pub trajectory: u64,
    /// Why nothing was learned (`null` when it was).
    pub skipped: Option<String>,
    pub instant: Option<InstantReport>,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RoundReport {
    pub trajectories: usize,
    pub steps: usize,
    pub tokens: usize,
    /// The whole round: training, the Fisher estimate, saving.
    pub seconds: f64,
    /// Training tokens per second of the training steps alone.
    pub tokens_per_second: f64,
    /// Mean loss per target token over the round.
    pub loss: f64,
    pub micro_merged: bool,
    pub fisher_updated: bool,
    /// The bank entry `consolidate` made.
    pub bank_entry: Option<u64>,
    /// Whether the round stopped at its time budget with work left.
    pub budget_hit: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Counters {
    pub instant_updates: u64,
    pub rounds: u64,
    pub steps: u64,
    pub tokens: u64,
    pub fisher_updates: u64,
    pub consolidations: u64,
    pub micro_merges: u64,
    pub micro_since_merge: u64,
    /// Trajectories `0..trained` (journal order) have been through a BaseLoRA round.
    pub trained: usize,
    /// Trajectories `0..banked` are in some bank snapshot.
    pub banked: usize,
    pub base_trained: bool,
    /// Trajectories `0..federated` were learned before the last federated round was applied
    /// (the local BaseLoRA holds what came after).
    #[serde(default)]
    pub federated: usize,
    /// Federated rounds applied.
    #[serde(default)]
    pub federated_rounds: u64,
}

/// `llm.learningStats()`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LearningStats {
    pub dir: String,
    pub trajectories: usize,
    /// Trajectories that train (a correction, or quality at or above the gate).
    pub good: usize,
    /// Good trajectories no BaseLoRA round has trained on yet.
    pub pending: usize,
    pub counters: Counters,
    pub instant_step_ms_p50: f64,
    pub instant_step_ms_p99: f64,
    pub last_instant: Option<InstantReport>,
    pub last_round: Option<RoundReport>,
    pub training: bool,
    pub bank_size: usize,
    pub micro_rank: usize,
    pub base_rank: usize,
    /// The federation's global adapter's rank (`None` before any federated round).
    pub global_rank: Option<usize>,
    pub ewc: bool,
}

#[derive(Serialize, Deserialize)]
struct StateFile {
    format: String,
    architecture: String,
    n_layer: usize,
    d_model: usize,
    vocab_size: usize,
    next_id: u64,
    counters: Counters,
}

struct State {
    micro: LoraParams,
    micro_adam: Adam,
    base: LoraParams,
    base_adam: Adam,
    /// The base factors the instant thread captures with (replaced after each round).
    base_snapshot: Option<Arc<LoraParams>>,
    fisher: Vec<f32>,
    anchor: Vec<f32>,
    /// EWC for the MicroLoRA: its Fisher on general text (under the truncated softmax), made on
    /// the first instant update, and its anchor (the factors after the last merge).
    micro_fisher: Option<Vec<f32>>,
    micro_anchor: Vec<f32>,
    trajectories: Vec<Trajectory>,
    next_id: u64,
    counters: Counters,
    step_ms: VecDeque<f64>,
    last_instant: Option<InstantReport>,
    last_round: Option<RoundReport>,
    bank: Bank,
    micro_adapter: Option<Arc<LoraAdapter>>,
    base_adapter: Option<Arc<LoraAdapter>>,
    /// The federation's global adapter (frozen here; see `federate`) and its runtime form.
    global: Option<Arc<LoraParams>>,
    global_adapter: Option<Arc<LoraAdapter>>,
}

struct InstantJob {
    traj: Trajectory,
    reply: Sender<Result<FeedbackOutcome>>,
}

#[derive(Default)]
struct Control {
    /// Replies of `consolidate` calls waiting for the next round.
    consolidate: Vec<Sender<Result<RoundReport>>>,
    stop: bool,
    training: bool,
    /// Set by `feedback` when there is enough new work.
    wake: bool,
}

/// A completion `feedback` can refer to: (id, prompt ids, output ids).
pub(crate) type Remembered = (String, Vec<u32>, Vec<u32>);

/// The learner of one loaded model.
pub struct Learner {
    engine: Arc<Engine>,
    opts: LearningOptions,
    state: Arc<Mutex<State>>,
    /// Recent completions: (id, prompt ids, output ids).
    recent: Mutex<VecDeque<Remembered>>,
    instant_tx: Mutex<Option<Sender<InstantJob>>>,
    control: Arc<(Mutex<Control>, Condvar)>,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Lowers the calling thread's CPU priority (Linux: nice 19) so the engine's decode wins
/// whenever both want a core.
pub(crate) fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid has no preconditions; setpriority on our own thread id only changes its
    // nice value.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 19);
    }
}

fn percentile(v: &VecDeque<f64>, q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s: Vec<f64> = v.iter().copied().collect();
    s.sort_by(|a, b| a.total_cmp(b));
    s[((s.len() - 1) as f64 * q).round() as usize]
}

/// Keeps `c` in `recent` for `feedback` to find by id (the last 4,096).
pub(crate) fn remember_in(recent: &Mutex<VecDeque<Remembered>>, c: &Completion) {
    let mut r = lock(recent);
    if r.len() >= 4096 {
        r.pop_front();
    }
    r.push_back((c.id.clone(), c.prompt_ids.clone(), c.tokens.clone()));
}

/// Prompt ids, output ids and the correction's ids of a feedback.
pub(crate) type FeedbackInput = (Vec<u32>, Vec<u32>, Option<Vec<u32>>);

/// What feedback on completion `id` trains on, checked: its prompt and output ids (from
/// `recent`) and the correction's ids.
pub(crate) fn feedback_input(recent: &Mutex<VecDeque<Remembered>>, engine: &Engine, id: &str, quality: f32, correction: Option<&str>) -> Result<FeedbackInput> {
    if !(quality.is_finite() && (0.0..=1.0).contains(&quality)) {
        return Err(Error::InvalidArg(format!("quality must be a number in [0, 1], got {quality}")));
    }
    let found = lock(recent).iter().rev().find(|(cid, _, _)| cid == id).cloned();
    let Some((_, prompt, output)) = found else {
        return Err(Error::InvalidArg(format!("no completion '{id}' is known to this model (feedback takes the id of a completion it made)")));
    };
    let correction = match correction {
        Some(text) => {
            let ids = engine.tokenize(text, false)?;
            if ids.is_empty() {
                return Err(Error::InvalidArg("correction is empty".into()));
            }
            Some(ids)
        }
        None => None,
    };
    Ok((prompt, output, correction))
}

/// A training pause that steps aside while `engine` serves a request (checked between blocks,
/// projections and LM-head chunks; at most 1 s at a time, so training still moves under
/// constant load).
pub(crate) fn pause_while_busy(engine: &Arc<Engine>) -> crate::grad::Pause {
    let engine = Arc::downgrade(engine);
    Arc::new(move || {
        let start = Instant::now();
        while engine.upgrade().is_some_and(|e| e.busy()) && start.elapsed().as_millis() < 1000 {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    })
}

/// What of a trajectory trains, and with what weight: the correction, or the answer when its
/// quality reaches the gate; else why nothing does.
pub(crate) fn trained_answer(t: &Trajectory, gate: f32) -> std::result::Result<(&[u32], f32), &'static str> {
    match &t.correction {
        Some(c) if !c.is_empty() => Ok((c, 1.0f32.max(t.quality))),
        Some(_) => Err("the correction is empty"),
        None if t.quality >= gate && !t.output.is_empty() => Ok((&t.output, t.quality)),
        None if t.output.is_empty() => Err("the answer is empty"),
        None => Err("quality is below the gate and there is no correction"),
    }
}

/// What a trajectory trains on: (tokens, targets), or why it does not.
pub(crate) fn example_of(t: &Trajectory, gate: f32, max_seq: usize) -> std::result::Result<Example, &'static str> {
    let (answer, weight) = trained_answer(t, gate)?;
    let answer: Vec<u32> = answer.iter().copied().take(max_seq - 1).collect();
    let keep = (max_seq - answer.len()).min(t.prompt.len()).max(1);
    let prompt = &t.prompt[t.prompt.len().saturating_sub(keep)..];
    let mut tokens = prompt.to_vec();
    let first = tokens.len() - 1;
    tokens.extend_from_slice(&answer);
    let targets = (first..tokens.len() - 1).map(|i| (i, weight)).collect();
    Ok(Example { tokens, targets, labels: None })
}

/// Folds `micro` into `base` (ΔW_base + ΔW_micro, truncated back to the base rank by subspace
/// iteration) where both adapt the same projection; `micro` starts over (B = 0).
fn merge_micro(base: &mut LoraParams, adam: &mut Adam, micro: &mut LoraParams) -> bool {
    let mut merged = false;
    for ms in micro.slots.clone() {
        let Some(bs) = base.slot(ms.layer, ms.proj).cloned() else { continue };
        let (d_in, d_out, r) = (bs.d_in, bs.d_out, base.rank);
        // M = s_b·B_b·A_b + s_m·B_m·A_m, d_out × d_in.
        let mut m = vec![0.0f32; d_out * d_in];
        for (p, s) in [(&*base, &bs), (&*micro, &ms)] {
            let (a, b) = p.factors(s, &p.w);
            for o in 0..d_out {
                let row = &mut m[o * d_in..(o + 1) * d_in];
                for j in 0..p.rank {
                    let k = p.scale * b[o * p.rank + j];
                    if k != 0.0 {
                        for (x, &av) in row.iter_mut().zip(&a[j * d_in..(j + 1) * d_in]) {
                            *x += k * av;
                        }
                    }
                }
            }
        }
        if m.iter().all(|&x| x == 0.0) {
            continue;
        }
        // Subspace iteration for the top-r left singular vectors Y (d_out × r).
        let mut rng = crate::grad::Rng(0x5EED_u64 + ms.layer as u64);
        let mut q: Vec<f32> = (0..d_in * r).map(|_| rng.uniform()).collect(); // d_in × r
        let mut y = vec![0.0f32; d_out * r];
        for _ in 0..6 {
            // Y = M·Q
            for o in 0..d_out {
                for j in 0..r {
                    y[o * r + j] = (0..d_in).map(|i| m[o * d_in + i] * q[i * r + j]).sum();
                }
            }
            orthonormalize(&mut y, d_out, r);
            // Q = Mᵀ·Y
            q.iter_mut().for_each(|x| *x = 0.0);
            for o in 0..d_out {
                for i in 0..d_in {
                    let mv = m[o * d_in + i];
                    for j in 0..r {
                        q[i * r + j] += mv * y[o * r + j];
                    }
                }
            }
            orthonormalize(&mut q, d_in, r);
        }
        for o in 0..d_out {
            for j in 0..r {
                y[o * r + j] = (0..d_in).map(|i| m[o * d_in + i] * q[i * r + j]).sum();
            }
        }
        let live = orthonormalize(&mut y, d_out, r);
        // M ≈ Y·(Yᵀ·M): B_b = Y / s_b, A_b = Yᵀ·M. Where M has lower rank than the base, the
        // spare components start afresh (B column 0, A row random) so they can still learn.
        let bound = 1.0 / (d_in as f32).sqrt();
        for j in 0..r {
            for i in 0..d_in {
                base.w[bs.a + j * d_in + i] = if live[j] { (0..d_out).map(|o| y[o * r + j] * m[o * d_in + i]).sum() } else { rng.uniform() * bound };
            }
        }
        for o in 0..d_out {
            for j in 0..r {
                base.w[bs.b + o * r + j] = y[o * r + j] / base.scale;
            }
        }
        adam.reset(bs.a..bs.b + d_out * r);
        micro.w[ms.b..ms.b + ms.d_out * micro.rank].iter_mut().for_each(|x| *x = 0.0);
        merged = true;
    }
    merged
}

/// `f += (g / w)² / n`: one of `n` sequences' share of an empirical Fisher diagonal, `g` the
/// gradient of its loss summed over `w` target weight.
fn add_fisher_sample(f: &mut [f32], g: &[f32], w: f64, n: usize) {
    if w > 0.0 {
        let inv = (1.0 / w) as f32;
        for (fi, gi) in f.iter_mut().zip(g) {
            *fi += (gi * inv) * (gi * inv) / n as f32;
        }
    }
}

/// Gram–Schmidt (two passes) on the `c` columns of a row-major `n × c` matrix. A column that is
/// (numerically) in the span of the ones before it becomes zero; returns which columns are
/// non-zero.
fn orthonormalize(x: &mut [f32], n: usize, c: usize) -> Vec<bool> {
    let mut live = vec![false; c];
    for j in 0..c {
        let before = (0..n).map(|i| x[i * c + j] * x[i * c + j]).sum::<f32>().sqrt();
        for _pass in 0..2 {
            for k in 0..j {
                if !live[k] {
                    continue;
                }
                let dot: f32 = (0..n).map(|i| x[i * c + j] * x[i * c + k]).sum();
                for i in 0..n {
                    x[i * c + j] -= dot * x[i * c + k];
                }
            }
        }
        let norm = (0..n).map(|i| x[i * c + j] * x[i * c + j]).sum::<f32>().sqrt();
        if norm > 1e-4 * before && norm > 1e-20 {
            (0..n).for_each(|i| x[i * c + j] /= norm);
            live[j] = true;
        } else {
            (0..n).for_each(|i| x[i * c + j] = 0.0);
        }
    }
    live
}

impl Learner {
    /// Opens (or creates) the learning directory for `engine`'s model and starts the threads.
    /// Learned adapters found there are active from now on.
    pub fn open(engine: Arc<Engine>, opts: LearningOptions) -> Result<Arc<Learner>> {
        opts.check()?;
        let dir = &opts.dir;
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        store::remove_stale_temporaries(dir);
        let model = engine.model();
        let cfg = model.cfg.clone();
        let shape = |p: Proj| Some(p.shape(&cfg));
        let state_path = dir.join("state.json");
        if dir.join(crate::talora::STATE_FILE).exists() {
            return Err(Error::corrupt(&state_path, "this directory holds a diffusion model's TALoRA learning; give this model its own dir".into()));
        }
        let (next_id, counters) = match store::read_optional(&state_path)? {
            Some(b) => {
                let s: StateFile = serde_json::from_slice(&b).map_err(|e| Error::corrupt(&state_path, e.to_string()))?;
                if (s.architecture.as_str(), s.n_layer, s.d_model, s.vocab_size) != (cfg.architecture.as_str(), cfg.n_layer, cfg.d_model, cfg.vocab_size) {
                    return Err(Error::corrupt(
                        &state_path,
                        format!("it belongs to another model ({} with {} blocks of {}); give this model its own dir", s.architecture, s.n_layer, s.d_model),
                    ));
                }
                (s.next_id, s.counters)
            }
            None => (1, Counters::default()),
        };
        let load = |name: &str, targets: Vec<(usize, Proj)>, rank: usize, lr: f32, seed: u64| -> Result<(LoraParams, Adam)> {
            let path = dir.join(name);
            match store::read_optional(&path)? {
                Some(b) => {
                    let (p, a) = store::params_from_bytes(&path, &b, cfg.n_layer, shape)?;
                    let mut a = a.unwrap_or_else(|| Adam::new(p.len(), lr));
                    a.lr = lr;
                    Ok((p, a))
                }
                None => {
                    let p = LoraParams::new(&model, &targets, rank, 2.0 * rank as f32, seed);
                    let a = Adam::new(p.len(), lr);
                    Ok((p, a))
                }
            }
        };
        let all: Vec<(usize, Proj)> = (0..cfg.n_layer).flat_map(|l| Proj::ALL.map(|p| (l, p))).collect();
        let (micro, micro_adam) = load("micro.bin", micro::targets(cfg.n_layer), opts.micro_rank, opts.micro_lr, opts.seed ^ 0x4D)?;
        let (base, base_adam) = load("base.bin", all, opts.base_rank, opts.base_lr, opts.seed ^ 0xBA)?;
        let global_path = dir.join("global.bin");
        let global = match store::read_optional(&global_path)? {
            Some(b) => Some(Arc::new(store::params_from_bytes(&global_path, &b, cfg.n_layer, shape)?.0)),
            None => None,
        };
        let global_adapter = match &global {
            Some(g) => Some(crate::export::to_adapter(g, &cfg, &global_path)?),
            None => None,
        };
        let fisher_path = dir.join("fisher.bin");
        let (fisher, anchor, micro_fisher, micro_anchor) = match store::read_optional(&fisher_path)? {
            Some(b) => {
                let v = store::f32s_from_bytes(&fisher_path, &b)?;
                let fits = v.len() == 4 && v[0].len() == base.len() && v[1].len() == base.len() && v[3].len() == micro.len();
                if !fits || !(v[2].is_empty() || v[2].len() == micro.len()) {
                    return Err(Error::corrupt(&fisher_path, "it does not match base.bin and micro.bin".into()));
                }
                let mut v = v.into_iter();
                let (f, a, mf, ma) = (v.next().unwrap(), v.next().unwrap(), v.next().unwrap(), v.next().unwrap());
                (f, a, (!mf.is_empty()).then_some(mf), ma)
            }
            None => (vec![0.0; base.len()], base.w.clone(), None, micro.w.clone()),
        };
        let trajectories = store::read_trajectories(dir)?;
        let next_id = next_id.max(trajectories.iter().map(|t| t.id + 1).max().unwrap_or(1));
        let bank = Bank::open(dir)?;
        let mut counters = counters;
        counters.trained = counters.trained.min(trajectories.len());
        counters.banked = counters.banked.min(trajectories.len());
        let state = State {
            base_snapshot: counters.base_trained.then(|| Arc::new(base.clone())),
            micro,
            micro_adam,
            base,
            base_adam,
            fisher,
            anchor,
            micro_fisher,
            micro_anchor,
            trajectories,
            next_id,
            counters,
            step_ms: VecDeque::new(),
            last_instant: None,
            last_round: None,
            bank,
            micro_adapter: None,
            base_adapter: None,
            global,
            global_adapter,
        };
        let learner = Arc::new(Learner {
            engine,
            opts,
            state: Arc::new(Mutex::new(state)),
            recent: Mutex::new(VecDeque::new()),
            instant_tx: Mutex::new(None),
            control: Arc::new((Mutex::new(Control::default()), Condvar::new())),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Mutex::new(Vec::new()),
        });
        {
            let mut st = lock(&learner.state);
            learner.refresh_adapters(&mut st, true, true)?;
            // The directory belongs to this model from now on.
            if !state_path.exists() {
                learner.save_state(&st)?;
            }
        }
        let (tx, rx) = channel();
        *lock(&learner.instant_tx) = Some(tx);
        let weak = Arc::downgrade(&learner);
        let instant = std::thread::Builder::new()
            .name("ruvllm-sona-instant".into())
            .spawn(move || instant_loop(weak, rx))
            .map_err(|e| Error::Internal(format!("cannot start the learning thread: {e}")))?;
        let weak = Arc::downgrade(&learner);
        let background = std::thread::Builder::new()
            .name("ruvllm-sona-background".into())
            .spawn(move || background_loop(weak))
            .map_err(|e| Error::Internal(format!("cannot start the learning thread: {e}")))?;
        lock(&learner.threads).extend([instant, background]);
        let weak = Arc::downgrade(&learner);
        learner.engine.set_observer(Some(Arc::new(move |c: &Completion| {
            if let Some(l) = weak.upgrade() {
                l.remember(c)
            }
        })));
        let weak = Arc::downgrade(&learner);
        learner.engine.set_auto_resolver(Some(Arc::new(move |q: &[f32]| {
            let l = weak.upgrade().ok_or(ruvllm_core::Error::Closed)?;
            let (set, used) = l.auto_adapters(q, 1).map_err(|e| match e {
                Error::Core(e) => e,
                e => ruvllm_core::Error::Internal(e.to_string()),
            })?;
            Ok((set, used.into_iter().map(|(id, similarity)| AdapterUse { id: format!("bank-{id}"), similarity }).collect()))
        })));
        // Work left from a previous process.
        learner.maybe_wake();
        Ok(learner)
    }

    pub fn options(&self) -> &LearningOptions {
        &self.opts
    }

    /// Publishes the learned adapters to the engine (rebuilding the ones that changed).
    fn refresh_adapters(&self, st: &mut State, micro_changed: bool, base_changed: bool) -> Result<()> {
        let cfg = self.engine.config().clone();
        if micro_changed {
            let trained = st.micro.slots.iter().any(|s| st.micro.w[s.b..s.b + s.d_out * st.micro.rank].iter().any(|&x| x != 0.0));
            st.micro_adapter = if trained { Some(crate::export::to_adapter(&st.micro, &cfg, &self.opts.dir.join("micro.bin"))?) } else { None };
        }
        if base_changed {
            st.base_adapter = if st.counters.base_trained { Some(crate::export::to_adapter(&st.base, &cfg, &self.opts.dir.join("base.bin"))?) } else { None };
        }
        let set: Vec<(Arc<LoraAdapter>, f32)> = st.global_adapter.iter().chain(&st.base_adapter).chain(&st.micro_adapter).map(|a| (a.clone(), 1.0)).collect();
        self.engine.set_learned(AdapterSet::new(set));
        Ok(())
    }

    /// Remembers a completion so `feedback` can find it by id (the last 4,096 are kept).
    pub fn remember(&self, c: &Completion) {
        remember_in(&self.recent, c)
    }

    /// Records feedback on completion `id` and queues the instant update; the receiver gets
    /// its outcome. Never waits for training.
    pub fn feedback(&self, id: &str, quality: f32, correction: Option<&str>) -> Result<Receiver<Result<FeedbackOutcome>>> {
        let (prompt, output, correction) = feedback_input(&self.recent, &self.engine, id, quality, correction)?;
        let traj = {
            let mut st = lock(&self.state);
            let t = Trajectory { id: st.next_id, completion_id: id.to_string(), time: now_ms(), prompt, output, quality, correction };
            store::append_trajectory(&self.opts.dir, &t)?;
            st.next_id += 1;
            st.trajectories.push(t.clone());
            t
        };
        let (reply, rx) = channel();
        match lock(&self.instant_tx).as_ref() {
            Some(tx) => tx.send(InstantJob { traj, reply }).map_err(|_| Error::Closed)?,
            None => return Err(Error::Closed),
        }
        self.maybe_wake();
        Ok(rx)
    }

    fn good_pending(&self, st: &State) -> usize {
        st.trajectories[st.counters.trained..].iter().filter(|t| trained_answer(t, self.opts.quality_gate).is_ok()).count()
    }

    fn maybe_wake(&self) {
        if !self.opts.background {
            return;
        }
        let pending = {
            let st = lock(&self.state);
            self.good_pending(&st)
        };
        if pending >= self.opts.background_min {
            let (m, cv) = &*self.control;
            lock(m).wake = true;
            cv.notify_all();
        }
    }

    /// Runs a BaseLoRA round over everything pending now, updates the Fisher estimate, moves
    /// the EWC anchor, snapshots the adapter into the bank and saves; blocks until done.
    pub fn consolidate(&self) -> Result<RoundReport> {
        let (tx, rx) = channel();
        {
            let (m, cv) = &*self.control;
            let mut c = lock(m);
            if c.stop {
                return Err(Error::Closed);
            }
            c.consolidate.push(tx);
            cv.notify_all();
        }
        rx.recv().map_err(|_| Error::Closed)?
    }

    pub fn stats(&self) -> LearningStats {
        let training = lock(&self.control.0).training;
        let st = lock(&self.state);
        LearningStats {
            dir: self.opts.dir.display().to_string(),
            trajectories: st.trajectories.len(),
            good: st.trajectories.iter().filter(|t| trained_answer(t, self.opts.quality_gate).is_ok()).count(),
            pending: self.good_pending(&st),
            counters: st.counters.clone(),
            instant_step_ms_p50: percentile(&st.step_ms, 0.5),
            instant_step_ms_p99: percentile(&st.step_ms, 0.99),
            last_instant: st.last_instant.clone(),
            last_round: st.last_round.clone(),
            training,
            bank_size: st.bank.len(),
            micro_rank: st.micro.rank,
            base_rank: st.base.rank,
            global_rank: st.global.as_ref().map(|g| g.rank),
            ewc: self.opts.ewc,
        }
    }

    /// Writes the learned adapter (BaseLoRA and MicroLoRA summed) as a llama.cpp LoRA GGUF.
    pub fn export(&self, path: &Path) -> Result<()> {
        let st = lock(&self.state);
        let mut parts: Vec<&LoraParams> = st.global.iter().map(|g| &**g).collect();
        if st.counters.base_trained {
            parts.push(&st.base);
        }
        if st.micro_adapter.is_some() {
            parts.push(&st.micro);
        }
        crate::export::write_gguf(&parts, &self.engine.config().architecture, path)
    }

    /// The adapters for a request with `adapters: 'auto'` whose prompt embeds to `q` (unit
    /// length): the `k` nearest bank snapshots, each at scale 1/k, plus the MicroLoRA; with an
    /// empty bank, the current learned adapters. Returns the set and (bank id, cosine) of each
    /// snapshot used.
    pub fn auto_adapters(&self, q: &[f32], k: usize) -> Result<(AdapterSet, Vec<(u64, f32)>)> {
        let cfg = self.engine.config().clone();
        let mut st = lock(&self.state);
        let hits = st.bank.nearest(q, k.max(1));
        if hits.is_empty() {
            return Ok((self.engine.learned(), Vec::new()));
        }
        let mut set: Vec<(Arc<LoraAdapter>, f32)> = self.engine.default_adapters().entries().to_vec();
        // The federation's global adapter is part of the model here; the snapshots were learned
        // on top of it.
        if let Some(g) = &st.global_adapter {
            set.push((g.clone(), 1.0));
        }
        let mut used = Vec::new();
        let scale = 1.0 / hits.len() as f32;
        for &(i, cos) in &hits {
            set.push((st.bank.adapter(i, &cfg)?, scale));
            used.push((st.bank.entries[i].id, cos));
        }
        if let Some(m) = &st.micro_adapter {
            set.push((m.clone(), 1.0));
        }
        Ok((AdapterSet::new(set), used))
    }

    /// The BaseLoRA's factors as trained (f32), once a round has trained them.
    pub fn base_params(&self) -> Option<Arc<LoraParams>> {
        lock(&self.state).base_snapshot.clone()
    }

    /// The BaseLoRA's federation spec at `tier`; refused without consent (`federate: true`).
    pub fn federation_spec(&self, tier: ruvllm_daf::update::Tier) -> Result<(ruvllm_daf::validate::AdapterSpec, usize)> {
        if !self.opts.federate {
            return Err(Error::NoConsent("federation needs explicit consent: load the model with learning: { dir, federate: true }".into()));
        }
        let st = lock(&self.state);
        Ok((crate::federate::adapter_spec(&st.base, tier), st.base.rank))
    }

    /// The local BaseLoRA (this node's change since the last applied round; untrained: `B = 0`)
    /// as an unsigned update for `round`, weighted by the trajectories it learned since then
    /// and their mean quality.
    pub fn federated_update(&self, tier: ruvllm_daf::update::Tier, round: u64) -> Result<ruvllm_daf::update::Update> {
        let st = lock(&self.state);
        let upto = st.counters.trained.min(st.trajectories.len());
        let since = st.counters.federated.min(upto);
        let good: Vec<f32> =
            st.trajectories[since..upto].iter().filter(|t| trained_answer(t, self.opts.quality_gate).is_ok()).map(|t| t.quality.min(1.0)).collect();
        let quality = if good.is_empty() { 0.0 } else { good.iter().sum::<f32>() / good.len() as f32 };
        let prov = crate::federate::Provenance { samples: good.len() as u64, quality, improvement: 0.0 };
        crate::federate::to_update(&st.base, tier, round, prov)
    }

    /// Applies a round's aggregate (of the nodes' BaseLoRAs, all trained on top of the same
    /// global adapter): the global adapter plus the aggregate, kept to at most `cap` components
    /// per projection, is split again (`federate::accumulate`): its strongest components become
    /// the BaseLoRA (new optimiser state, EWC anchor there), the rest the new global adapter.
    /// Both are saved and served from the next request on. A BaseLoRA round running meanwhile
    /// overwrites the BaseLoRA when it ends, so call this between rounds (after
    /// `consolidate`). Returns the adapters' digest and the cap's truncation error.
    ///
    /// `server_lr` ≠ 1 is a server learning rate: the adapters move from where the last round
    /// left them by that many times the step to the exact mean (`federate::accumulate`); every
    /// node must apply the same rounds with the same rate to stay equal.
    pub fn apply_federated(&self, agg: &ruvllm_daf::aggregate::Aggregate, cap: usize, server_lr: f64) -> Result<(String, f64)> {
        let mut st = lock(&self.state);
        let st = &mut *st;
        let seed = self.opts.seed ^ 0xBA ^ st.counters.federated_rounds.wrapping_add(1).wrapping_mul(0x51);
        let cfg = self.engine.config().clone();
        let start_path = self.opts.dir.join("round-start.bin");
        let start = match store::read_optional(&start_path)? {
            // Checked against the model's shapes as `open` checks base.bin.
            Some(b) => Some(store::params_from_bytes(&start_path, &b, cfg.n_layer, |p: Proj| Some(p.shape(&cfg)))?.0),
            None => None,
        };
        let (base, global, err) = crate::federate::accumulate(st.global.as_deref(), &st.base, agg, cap, seed, (start.as_ref(), server_lr))?;
        let path = self.opts.dir.join("global.bin");
        let adapter = match &global {
            Some(g) => Some(crate::export::to_adapter(g, &cfg, &path)?),
            None => None,
        };
        // Each file is written atomically, but not the pair: a crash between the two leaves the
        // new global adapter under the old BaseLoRA (`federatedRounds` in state.json, written
        // last, still counts the round as not applied).
        match &global {
            Some(g) => store::write_atomic(&path, &store::params_bytes(g, None))?,
            None => store::remove_if_exists(&path)?,
        }
        // The factors are a new basis (the SVD rotates them): moments kept from the old ones
        // would step in the old one, so the optimiser starts afresh.
        st.base_adam = Adam::new(base.len(), st.base_adam.lr);
        st.anchor = base.w.clone();
        st.base = base;
        st.counters.base_trained = true;
        st.counters.federated = st.counters.trained;
        st.counters.federated_rounds += 1;
        store::write_atomic(&self.opts.dir.join("base.bin"), &store::params_bytes(&st.base, Some(&st.base_adam)))?;
        // Where the next round starts (what a server learning rate steps from).
        store::write_atomic(&start_path, &store::params_bytes(&st.base, None))?;
        self.save_fisher(st)?;
        self.save_state(st)?;
        st.global = global.map(Arc::new);
        st.global_adapter = adapter;
        st.base_snapshot = Some(Arc::new(st.base.clone()));
        self.refresh_adapters(st, false, true)?;
        Ok((self.digest_of(st), err))
    }

    /// The global adapter (what the federation learned), once a round was applied.
    pub fn global_params(&self) -> Option<Arc<LoraParams>> {
        lock(&self.state).global.clone()
    }

    fn digest_of(&self, st: &State) -> String {
        let g = st.global.as_deref().map(crate::federate::digest).unwrap_or_default();
        format!("{}{}", &g[..g.len().min(32)], &crate::federate::digest(&st.base)[..32])
    }

    /// SHA-256 of the global adapter's factors (first 32 hex digits; empty before any round)
    /// and of the BaseLoRA's (32): nodes that applied the same aggregates agree.
    pub fn adapter_digest(&self) -> String {
        self.digest_of(&lock(&self.state))
    }

    /// Stops the threads after their current step (state on disk stays as last saved).
    pub fn close(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.engine.set_observer(None);
        self.engine.set_auto_resolver(None);
        *lock(&self.instant_tx) = None;
        {
            let (m, cv) = &*self.control;
            let mut c = lock(m);
            c.stop = true;
            for tx in c.consolidate.drain(..) {
                let _ = tx.send(Err(Error::Closed));
            }
            cv.notify_all();
        }
        let handles: Vec<_> = lock(&self.threads).drain(..).collect();
        let me = std::thread::current().id();
        for h in handles {
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
    }

    fn save_fisher(&self, st: &State) -> Result<()> {
        let mf: &[f32] = st.micro_fisher.as_deref().unwrap_or(&[]);
        store::write_atomic(&self.opts.dir.join("fisher.bin"), &store::f32s_bytes(&[&st.fisher, &st.anchor, mf, &st.micro_anchor]))
    }

    fn save_state(&self, st: &State) -> Result<()> {
        let cfg = self.engine.config();
        let f = StateFile {
            format: "ruvllm-sona-state-1".into(),
            architecture: cfg.architecture.clone(),
            n_layer: cfg.n_layer,
            d_model: cfg.d_model,
            vocab_size: cfg.vocab_size,
            next_id: st.next_id,
            counters: st.counters.clone(),
        };
        store::write_atomic(&self.opts.dir.join("state.json"), &serde_json::to_vec_pretty(&f).map_err(|e| Error::Internal(e.to_string()))?)
    }

    /// Token sequences of general text for the Fisher estimate: the user's, or the model's own
    /// samples from neutral openings (made once, kept in `general.json`).
    fn general_examples(&self) -> Result<Vec<Example>> {
        let path = self.opts.dir.join("general.json");
        let seqs: Vec<Vec<u32>> = if !self.opts.general_text.is_empty() {
            self.opts.general_text.iter().map(|t| self.engine.tokenize(t, true)).collect::<std::result::Result<_, _>>()?
        } else if let Some(b) = store::read_optional(&path)? {
            serde_json::from_slice(&b).map_err(|e| Error::corrupt(&path, e.to_string()))?
        } else {
            let openings = ["The", "In the", "Once upon a time", "Here is", "A new study", "When I was", "The history of", "How to"];
            let mut out = Vec::new();
            for (i, o) in openings.iter().enumerate() {
                let params = GenerateParams {
                    max_tokens: 96,
                    sampling: SamplingParams { temperature: 0.8, top_p: 0.95, seed: 1000 + i as u64, ..SamplingParams::default() },
                    stop: Vec::new(),
                    chat_template: None,
                    diffusion: None,
                    ..Default::default()
                };
                let c = self.engine.generate_blocking_with(Prompt::Text((*o).to_string()), params, Some(AdapterSet::default()))?;
                let mut ids = c.prompt_ids;
                ids.extend(c.tokens);
                out.push(ids);
            }
            store::write_atomic(&path, &serde_json::to_vec(&out).map_err(|e| Error::Internal(e.to_string()))?)?;
            out
        };
        Ok(seqs
            .into_iter()
            .filter(|s| s.len() >= 2)
            .map(|mut s| {
                s.truncate(self.opts.max_seq);
                let targets = (0..s.len() - 1).map(|i| (i, 1.0)).collect();
                Example { tokens: s, targets, labels: None }
            })
            .collect())
    }

    /// The empirical Fisher diagonal of the LM loss on general text at `params`: the mean over
    /// up to 8 sequences of each parameter's squared gradient (per-token loss).
    fn fisher_estimate(&self, fr: &mut Frozen, params: &LoraParams) -> Result<Vec<f32>> {
        let general = self.general_examples()?;
        let n = general.len().min(8);
        let mut f = vec![0.0f32; params.len()];
        let mut grad = vec![0.0f32; params.len()];
        for ex in general.iter().take(n) {
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            grad.iter_mut().for_each(|g| *g = 0.0);
            let (_, w) = fr.loss_and_grad(ex, params, &mut grad);
            add_fisher_sample(&mut f, &grad, w, n);
        }
        Ok(f)
    }

    /// One BaseLoRA round (see the module docs).
    fn round(&self, fr: &mut Frozen, consolidate: bool) -> Result<RoundReport> {
        let start = Instant::now();
        let opts = &self.opts;
        // Fold the MicroLoRA in, copy what to train.
        let (mut params, mut adam, examples, upto, micro_merged, fisher, anchor) = {
            let mut st = lock(&self.state);
            let st = &mut *st;
            // The federation's global adapter is part of the model the BaseLoRA trains on.
            fr.set_extra(st.global.clone());
            let micro_merged = st.counters.micro_since_merge > 0 && merge_micro(&mut st.base, &mut st.base_adam, &mut st.micro);
            if micro_merged {
                st.counters.micro_merges += 1;
                st.counters.micro_since_merge = 0;
                st.micro_adam = Adam::new(st.micro.len(), opts.micro_lr);
                st.micro_anchor = st.micro.w.clone();
                st.counters.base_trained = true;
                // What the MicroLoRA learned now lives in the BaseLoRA: serve it from there at
                // once, not only when the round ends.
                self.refresh_adapters(st, true, true)?;
            }
            let upto = st.trajectories.len();
            let new: Vec<Example> =
                st.trajectories[st.counters.trained..upto].iter().filter_map(|t| example_of(t, opts.quality_gate, opts.max_seq).ok()).collect();
            let old: Vec<Example> = st.trajectories[..st.counters.trained].iter().filter_map(|t| example_of(t, opts.quality_gate, opts.max_seq).ok()).collect();
            // Replay as many old ones as there are new ones (deterministic picks).
            let mut examples = Vec::new();
            for e in 0..opts.epochs {
                let mut round: Vec<Example> = new.clone();
                if !old.is_empty() {
                    for i in 0..new.len().min(old.len()) {
                        round.push(old[(i * 7919 + e * 104_729 + st.counters.rounds as usize * 31) % old.len()].clone());
                    }
                }
                // Interleave deterministically.
                let n = round.len();
                let mut order: Vec<usize> = (0..n).collect();
                let mut rng = crate::grad::Rng(opts.seed.wrapping_add(st.counters.rounds * 1000 + e as u64) | 1);
                for i in (1..n).rev() {
                    let j = ((rng.uniform() + 1.0) * 0.5 * (i + 1) as f32) as usize % (i + 1);
                    order.swap(i, j);
                }
                examples.extend(order.into_iter().map(|i| round[i].clone()));
            }
            let fisher = opts.ewc.then(|| (st.fisher.clone(), st.counters.fisher_updates));
            (st.base.clone(), st.base_adam.clone(), examples, upto, micro_merged, fisher, st.anchor.clone())
        };
        // EWC++ needs a Fisher estimate before the first training: at the anchor (the model as
        // it was), on general text.
        let mut first_fisher = None;
        let fisher = match fisher {
            Some((_, 0)) if !examples.is_empty() => {
                let f = self.fisher_estimate(fr, &params)?;
                first_fisher = Some(f.clone());
                Some(f)
            }
            Some((f, _)) => Some(f),
            None => None,
        };
        let mut report = RoundReport { micro_merged, ..Default::default() };
        report.trajectories = examples.len() / opts.epochs.max(1);
        // EWC++ weights, normalised to mean 1 over the parameters with any Fisher mass.
        let ewc_w: Option<Vec<f32>> = fisher.and_then(|f| {
            let mean = f.iter().map(|&x| x as f64).sum::<f64>() / f.len().max(1) as f64;
            (mean > 0.0).then(|| f.iter().map(|&x| (x as f64 / mean) as f32).collect())
        });
        let mut grad = vec![0.0f32; params.len()];
        let (mut loss_sum, mut w_sum) = (0.0f64, 0.0f64);
        let mut trained_all = true;
        // The budget counts training steps only (not the Fisher estimate or building the
        // transposed weights), and a round always takes at least one step.
        fr.prepare_backward();
        let steps_start = Instant::now();
        for ex in &examples {
            let over = report.steps > 0 && !consolidate && steps_start.elapsed().as_secs_f64() > opts.round_seconds;
            if self.stop.load(Ordering::Relaxed) || over {
                trained_all = false;
                report.budget_hit = !self.stop.load(Ordering::Relaxed);
                break;
            }
            grad.iter_mut().for_each(|g| *g = 0.0);
            let (l, w) = fr.loss_and_grad(ex, &params, &mut grad);
            if w <= 0.0 {
                continue;
            }
            let inv = (1.0 / w) as f32;
            grad.iter_mut().for_each(|g| *g *= inv);
            if let Some(f) = &ewc_w {
                let lam = opts.ewc_lambda;
                for i in 0..grad.len() {
                    grad[i] += lam * f[i] * (params.w[i] - anchor[i]);
                }
            }
            adam.step(&mut params.w, &grad, 1.0);
            loss_sum += l;
            w_sum += w;
            report.steps += 1;
            report.tokens += ex.tokens.len();
        }
        report.loss = if w_sum > 0.0 { loss_sum / w_sum } else { 0.0 };
        let train_seconds = steps_start.elapsed().as_secs_f64();
        // Fisher on general text (EWC++: decayed running mean of squared gradients).
        let mut new_fisher = None;
        if opts.ewc && !self.stop.load(Ordering::Relaxed) && (report.steps > 0 || consolidate) {
            new_fisher = Some(self.fisher_estimate(fr, &params)?);
        }
        report.seconds = start.elapsed().as_secs_f64();
        report.tokens_per_second = if train_seconds > 0.0 { report.tokens as f64 / train_seconds } else { 0.0 };
        // Write back, save, publish.
        let mut st = lock(&self.state);
        if report.steps > 0 {
            st.base = params;
            st.base_adam = adam;
            st.counters.base_trained = true;
        }
        if trained_all {
            st.counters.trained = upto;
        }
        if let Some(f) = first_fisher {
            st.fisher = f;
            st.counters.fisher_updates += 1;
        }
        if let Some(f) = new_fisher {
            let g = opts.ewc_decay;
            let first = st.counters.fisher_updates == 0;
            for (a, b) in st.fisher.iter_mut().zip(&f) {
                *a = if first { *b } else { g * *a + (1.0 - g) * b };
            }
            st.counters.fisher_updates += 1;
            report.fisher_updated = true;
        }
        st.counters.rounds += 1;
        st.counters.steps += report.steps as u64;
        st.counters.tokens += report.tokens as u64;
        if consolidate {
            st.anchor = st.base.w.clone();
            st.counters.consolidations += 1;
            if st.counters.base_trained && st.counters.banked < st.counters.trained {
                let texts: Vec<String> = st.trajectories[st.counters.banked..st.counters.trained]
                    .iter()
                    .filter_map(|t| self.engine.detokenize(&t.prompt).ok())
                    .filter(|s| !s.trim().is_empty())
                    .take(64)
                    .collect();
                let n = st.counters.trained - st.counters.banked;
                drop(st);
                let refs: Vec<&str> = texts.iter().map(|s| s.as_str()).collect();
                let embeds = if refs.is_empty() { Vec::new() } else { self.engine.embed_blocking(&refs)? };
                st = lock(&self.state);
                if let Some(first) = embeds.first() {
                    let mut mean = vec![0.0f32; first.len()];
                    for e in &embeds {
                        for (m, v) in mean.iter_mut().zip(e) {
                            *m += v;
                        }
                    }
                    let base = st.base.clone();
                    let id = st.bank.add(&base, mean, n, now_ms())?;
                    report.bank_entry = Some(id);
                }
                st.counters.banked = st.counters.trained;
            }
        }
        let dir = &opts.dir;
        store::write_atomic(&dir.join("base.bin"), &store::params_bytes(&st.base, Some(&st.base_adam)))?;
        store::write_atomic(&dir.join("micro.bin"), &store::params_bytes(&st.micro, Some(&st.micro_adam)))?;
        self.save_fisher(&st)?;
        self.save_state(&st)?;
        st.base_snapshot = st.counters.base_trained.then(|| Arc::new(st.base.clone()));
        st.last_round = Some(report.clone());
        self.refresh_adapters(&mut st, micro_merged, true)?;
        Ok(report)
    }

    /// The MicroLoRA's Fisher diagonal on general text, under the same truncated softmax its
    /// steps use (once, on the first instant update; the base captured with `base`).
    fn micro_fisher_estimate(&self, fr: &Frozen, base: Option<&LoraParams>) -> Result<Vec<f32>> {
        let general = self.general_examples()?;
        let micro = lock(&self.state).micro.clone();
        let n = general.len().min(4);
        let mut f = vec![0.0f32; micro.len()];
        for ex in general.iter().take(n) {
            let cap = micro::capture(fr, &ex.tokens, &ex.targets, base, self.opts.micro_candidates);
            let mut grad = vec![0.0f32; micro.len()];
            let (_, w) = micro::loss_and_grad(fr, &micro, &cap, &mut grad);
            add_fisher_sample(&mut f, &grad, w, n);
        }
        Ok(f)
    }

    fn instant(&self, fr: &Frozen, traj: Trajectory) -> Result<FeedbackOutcome> {
        let ex = match example_of(&traj, self.opts.quality_gate, self.opts.max_seq) {
            Ok(ex) => ex,
            Err(why) => return Ok(FeedbackOutcome { trajectory: traj.id, skipped: Some(why.to_string()), instant: None }),
        };
        let (base, need_fisher) = {
            let st = lock(&self.state);
            (st.base_snapshot.clone(), self.opts.ewc && st.micro_fisher.is_none())
        };
        if need_fisher {
            let f = self.micro_fisher_estimate(fr, base.as_deref())?;
            let mut st = lock(&self.state);
            st.micro_fisher = Some(f);
            self.save_fisher(&st)?;
        }
        let cap = micro::capture(fr, &ex.tokens, &ex.targets, base.as_deref(), self.opts.micro_candidates);
        let mut st = lock(&self.state);
        let st = &mut *st;
        let penalty = match (&st.micro_fisher, self.opts.ewc) {
            (Some(f), true) => Some(micro::Penalty { lambda: self.opts.micro_ewc_lambda, fisher: f, anchor: &st.micro_anchor }),
            _ => None,
        };
        let (loss, step_ms) = micro::step(fr, &mut st.micro, &mut st.micro_adam, &cap, penalty.as_ref());
        st.counters.instant_updates += 1;
        st.counters.micro_since_merge += 1;
        if st.step_ms.len() >= 1000 {
            st.step_ms.pop_front();
        }
        st.step_ms.push_back(step_ms);
        let report = InstantReport { loss, step_ms, capture_ms: cap.ms, covered_mass: cap.covered_mass, tokens: cap.rows.len() };
        st.last_instant = Some(report.clone());
        store::write_atomic(&self.opts.dir.join("micro.bin"), &store::params_bytes(&st.micro, Some(&st.micro_adam)))?;
        self.save_state(st)?;
        self.refresh_adapters(st, true, false)?;
        Ok(FeedbackOutcome { trajectory: traj.id, skipped: None, instant: Some(report) })
    }
}

/// What `ruvllm learn status` shows of a learning directory, read without loading a model.
pub fn offline_status(dir: &Path) -> Result<serde_json::Value> {
    let state_path = dir.join("state.json");
    let state: Option<StateFile> = match store::read_optional(&state_path)? {
        Some(b) => Some(serde_json::from_slice(&b).map_err(|e| Error::corrupt(&state_path, e.to_string()))?),
        None => None,
    };
    // A diffusion model's TALoRA directory keeps its state in talora.json.
    let ta_path = dir.join(crate::talora::STATE_FILE);
    let talora: Option<serde_json::Value> = match store::read_optional(&ta_path)? {
        Some(b) => Some(serde_json::from_slice(&b).map_err(|e| Error::corrupt(&ta_path, e.to_string()))?),
        None => None,
    };
    let trajectories = store::read_trajectories(dir)?;
    let bank = Bank::open(dir)?;
    let size = |name: &str| std::fs::metadata(dir.join(name)).map(|m| m.len()).ok();
    let model = match (&state, &talora) {
        (Some(s), _) => Some(serde_json::json!({ "architecture": s.architecture, "blocks": s.n_layer, "dModel": s.d_model, "vocabSize": s.vocab_size })),
        (None, Some(t)) => {
            Some(serde_json::json!({ "architecture": t["architecture"], "blocks": t["n_layer"], "dModel": t["d_model"], "vocabSize": t["vocab_size"] }))
        }
        (None, None) => None,
    };
    Ok(serde_json::json!({
        "dir": dir.display().to_string(),
        "kind": if talora.is_some() { "talora" } else { "sona" },
        "exists": state.is_some() || talora.is_some() || !trajectories.is_empty(),
        "model": model,
        "trajectories": trajectories.len(),
        "corrections": trajectories.iter().filter(|t| t.correction.is_some()).count(),
        "counters": state.as_ref().map(|s| serde_json::to_value(&s.counters).unwrap_or_default()).or_else(|| talora.as_ref().map(|t| t["counters"].clone())),
        "bankSize": bank.len(),
        "files": { "global": size("global.bin"), "base": size("base.bin"), "micro": size("micro.bin"), "fisher": size("fisher.bin"), "trajectories": size("trajectories.jsonl") },
    }))
}

/// `ruvllm learn export`: the learned adapter of `dir` as a llama.cpp LoRA GGUF, without the model.
pub fn offline_export(dir: &Path, out: &Path) -> Result<()> {
    let state_path = dir.join("state.json");
    let b = store::read_optional(&state_path)?.ok_or_else(|| Error::InvalidArg(format!("{} holds no learning state", dir.display())))?;
    let s: StateFile = serde_json::from_slice(&b).map_err(|e| Error::corrupt(&state_path, e.to_string()))?;
    let mut parts = Vec::new();
    for (name, used) in [("global.bin", true), ("base.bin", s.counters.base_trained), ("micro.bin", true)] {
        let path = dir.join(name);
        if let (Some(bytes), true) = (store::read_optional(&path)?, used) {
            let (p, _) = store::params_from_bytes(&path, &bytes, s.n_layer, |_| None)?;
            if p.slots.iter().any(|sl| p.w[sl.b..sl.b + sl.d_out * p.rank].iter().any(|&x| x != 0.0)) {
                parts.push(p);
            }
        }
    }
    let refs: Vec<&LoraParams> = parts.iter().collect();
    crate::export::write_gguf(&refs, &s.architecture, out)
}

impl Drop for Learner {
    fn drop(&mut self) {
        self.close();
    }
}

fn instant_loop(learner: std::sync::Weak<Learner>, rx: Receiver<InstantJob>) {
    let Some(model) = learner.upgrade().map(|l| l.engine.model()) else { return };
    let mut fr = Frozen::new(model, 1);
    while let Ok(job) = rx.recv() {
        let Some(l) = learner.upgrade() else { break };
        fr.set_extra(l.global_params());
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| l.instant(&fr, job.traj)))
            .unwrap_or_else(|_| Err(Error::Internal("the instant update panicked".into())));
        let _ = job.reply.send(out);
    }
}

impl crate::federate::FederatedLearner for Learner {
    fn fed_specs(&self, tier: ruvllm_daf::update::Tier) -> Result<(Vec<ruvllm_daf::validate::AdapterSpec>, usize)> {
        let (spec, rank) = self.federation_spec(tier)?;
        Ok((vec![spec], rank))
    }

    fn fed_updates(&self, tier: ruvllm_daf::update::Tier, round: u64) -> Result<Vec<ruvllm_daf::update::Update>> {
        Ok(vec![self.federated_update(tier, round)?])
    }

    fn fed_apply(&self, aggs: &[ruvllm_daf::aggregate::Aggregate], cap: usize, server_lr: f64) -> Result<Option<(String, f64)>> {
        match aggs.iter().find(|a| a.adapter == crate::federate::ADAPTER_ID && a.bucket.is_none()) {
            Some(agg) => Ok(Some(self.apply_federated(agg, cap, server_lr)?)),
            None => Ok(None),
        }
    }

    fn fed_digest(&self) -> String {
        self.adapter_digest()
    }
}

fn background_loop(learner: std::sync::Weak<Learner>) {
    lower_priority();
    let Some((model, control)) = learner.upgrade().map(|l| (l.engine.model(), l.control.clone())) else { return };
    let mut fr = Frozen::new(model, 1);
    // Step aside while the engine serves a request (between blocks, projections and LM-head
    // chunks; at most 1 s at a time, so training still moves under constant load).
    if let Some(l) = learner.upgrade() {
        fr.set_pause(Some(pause_while_busy(&l.engine)));
    }
    loop {
        let replies = {
            let (m, cv) = &*control;
            let mut c = lock(m);
            while !c.stop && !c.wake && c.consolidate.is_empty() {
                c = cv.wait(c).unwrap_or_else(|p| p.into_inner());
            }
            if c.stop {
                return;
            }
            c.wake = false;
            c.training = true;
            std::mem::take(&mut c.consolidate)
        };
        let Some(l) = learner.upgrade() else { return };
        let consolidate = !replies.is_empty();
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| l.round(&mut fr, consolidate)))
            .unwrap_or_else(|_| Err(Error::Internal("a background round panicked".into())));
        lock(&control.0).training = false;
        for tx in replies {
            let _ = tx.send(out.as_ref().map(|r| r.clone()).map_err(|e| Error::Internal(e.to_string())));
        }
        if let Err(e) = &out {
            eprintln!("ruvllm learning: background round failed: {e}");
        }
        // More arrived meanwhile?
        l.maybe_wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grad::Slot;

    fn dense(p: &LoraParams, s: &Slot) -> Vec<f32> {
        let (a, b) = p.factors(s, &p.w);
        let mut m = vec![0.0f32; s.d_out * s.d_in];
        for o in 0..s.d_out {
            for i in 0..s.d_in {
                m[o * s.d_in + i] = p.scale * (0..p.rank).map(|j| b[o * p.rank + j] * a[j * s.d_in + i]).sum::<f32>();
            }
        }
        m
    }

    fn params(rank: usize, scale: f32, d_out: usize, d_in: usize, seed: u64, zero_b: bool) -> LoraParams {
        let slot = Slot { layer: 0, proj: Proj::Down, d_in, d_out, a: 0, b: rank * d_in };
        let mut rng = crate::grad::Rng(seed);
        let mut w: Vec<f32> = (0..rank * (d_in + d_out)).map(|_| rng.uniform()).collect();
        if zero_b {
            w[rank * d_in..].iter_mut().for_each(|x| *x = 0.0);
        }
        LoraParams::from_parts(1, rank, scale, vec![slot], w)
    }

    #[test]
    fn merging_keeps_the_sum_when_the_rank_allows() {
        let (d_out, d_in) = (24, 40);
        // Base untrained (B = 0) + a rank-2 micro: the sum has rank 2 ≤ 4, kept exactly.
        let mut base = params(4, 2.0, d_out, d_in, 3, true);
        let mut micro = params(2, 1.5, d_out, d_in, 5, false);
        let want = dense(&micro, &micro.slots[0].clone());
        let mut adam = Adam::new(base.len(), 1e-3);
        assert!(merge_micro(&mut base, &mut adam, &mut micro));
        let got = dense(&base, &base.slots[0].clone());
        let err = want.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(err < 1e-4, "max error {err}");
        assert!(dense(&micro, &micro.slots[0].clone()).iter().all(|&x| x == 0.0), "micro starts over");
        // Base rank 4 + micro rank 2 on a full-rank base: the best rank-4 approximation, whose
        // error is below the micro part's size.
        let mut base = params(4, 2.0, d_out, d_in, 7, false);
        let mut micro = params(2, 0.1, d_out, d_in, 9, false);
        let sum: Vec<f32> = dense(&base, &base.slots[0].clone()).iter().zip(dense(&micro, &micro.slots[0].clone())).map(|(a, b)| a + b).collect();
        let micro_norm = dense(&micro, &micro.slots[0].clone()).iter().map(|x| x * x).sum::<f32>().sqrt();
        merge_micro(&mut base, &mut adam, &mut micro);
        let got = dense(&base, &base.slots[0].clone());
        let err = sum.iter().zip(&got).map(|(a, b)| (a - b) * (a - b)).sum::<f32>().sqrt();
        assert!(err < micro_norm, "{err} vs {micro_norm}");
    }
}
