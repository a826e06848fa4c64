//! Learning for a masked-diffusion model (RuvDLLM): TALoRA, one BaseLoRA per range of mask
//! ratios (timestep bucket), trained from feedback with the masked-diffusion loss, served by the
//! diffusion decoder at the ratios of its bucket, and federated bucket by bucket (DAF).
//!
//! - **What trains.** A trajectory's sequence (the prompt's end and the correction, or the answer
//!   when its quality reaches the gate) as SONA's BaseLoRA takes it. For bucket `b` with ratios
//!   `[t₀, t₁)`, each pass draws `t` uniformly in the range and masks every position after the
//!   first with probability `t` (at least one): the model sees the sequence bidirectionally with
//!   the mask embedding in place of the masked tokens and is trained on their cross-entropy
//!   (with the conversion's AR shift, the position before each masked token predicts it): the
//!   ELBO's terms at that `t`, under the model's conversion adapter (frozen) and the
//!   federation's global adapter of the bucket (frozen).
//! - **What it reports.** Each `consolidate` measures every bucket's loss on the round's new
//!   sequences under masks drawn apart from training's, before and after: the improvement a DAF
//!   round weights (TimestepAligned) by.
//! - **What it leaves out** (SONA's autoregressive learner has them): the instant MicroLoRA,
//!   EWC++ and the adapter bank. Training runs in `consolidate` only.
//!
//! Files in the learning directory: `talora.json` (the model, counters), `talora-b{k}.bin` (the
//! bucket's BaseLoRA with its optimiser state), `talora-global-b{k}.bin` (the bucket's global
//! adapter), `talora-start-b{k}.bin` (where the last round left the BaseLoRA), the trajectories
//! as SONA keeps them; each written atomically.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use ruvllm_core::engine::decode::{DiffusionModel, LearnedRange};
use ruvllm_core::engine::{Completion, Engine};
use ruvllm_core::nn::{LoraAdapter, Proj};
use ruvllm_daf::aggregate::Aggregate;
use ruvllm_daf::update::{Tier, Update};
use ruvllm_daf::validate::AdapterSpec;
use serde::{Deserialize, Serialize};

use crate::adam::Adam;
use crate::federate::{FederatedLearner, Provenance};
use crate::grad::{DiffusionInput, Example, Frozen, LoraParams, Rng};
use crate::learner::{example_of, feedback_input, now_ms, pause_while_busy, remember_in, trained_answer, FeedbackOutcome, LearningOptions, Remembered};
use crate::store::{self, Trajectory};
use crate::{Error, Result};

/// The id nodes agree on for the TALoRA adapter.
pub const ADAPTER_ID: &str = "sona.talora";
/// The mask-ratio ranges of the buckets (those of the conversion's TALoRA runs).
pub const BUCKETS: [(f32, f32); 3] = [(0.0, 0.3), (0.3, 0.6), (0.6, 1.0)];
/// The learner's state file; its presence marks a directory as a diffusion model's.
pub const STATE_FILE: &str = "talora.json";
/// Lowest mask ratio drawn (bucket 0 starts at 0, where nothing would be masked).
const T_MIN: f32 = 0.02;

/// The files of bucket `b`: its BaseLoRA, global adapter and round start.
pub fn bucket_files(b: usize) -> [String; 3] {
    [format!("talora-b{b}.bin"), format!("talora-global-b{b}.bin"), format!("talora-start-b{b}.bin")]
}

/// What the learner has done (saved in `talora.json`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaCounters {
    pub rounds: u64,
    pub steps: u64,
    pub tokens: u64,
    /// Trajectories `0..trained` have been trained on.
    pub trained: usize,
    /// Trajectories `0..federated` were learned before the last applied federated round.
    pub federated: usize,
    pub federated_rounds: u64,
    /// Per bucket: whether its BaseLoRA has trained since it was made.
    pub bucket_trained: Vec<bool>,
    /// Per bucket: the loss improvement (nats per masked token) measured since the last
    /// federated round, summed over rounds.
    pub improvement: Vec<f64>,
}

/// What one `consolidate` did.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaRoundReport {
    pub trajectories: usize,
    pub steps: usize,
    /// Masked tokens trained on.
    pub tokens: usize,
    pub seconds: f64,
    /// Per bucket: mean loss per masked token of the round's sequences (masks apart from
    /// training's) before and after the round.
    pub loss_before: Vec<f64>,
    pub loss_after: Vec<f64>,
}

/// `llm.learningStats()` of a diffusion model.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaStats {
    pub dir: String,
    pub kind: &'static str,
    pub trajectories: usize,
    pub good: usize,
    pub pending: usize,
    pub counters: TaCounters,
    pub last_round: Option<TaRoundReport>,
    pub base_rank: usize,
    pub buckets: Vec<[f64; 2]>,
    pub global_rank: Vec<Option<usize>>,
}

#[derive(Serialize, Deserialize)]
struct StateFile {
    format: String,
    architecture: String,
    n_layer: usize,
    d_model: usize,
    vocab_size: usize,
    next_id: u64,
    counters: TaCounters,
}

struct Bucket {
    base: LoraParams,
    adam: Adam,
    global: Option<Arc<LoraParams>>,
    base_adapter: Option<Arc<LoraAdapter>>,
    global_adapter: Option<Arc<LoraAdapter>>,
}

struct State {
    buckets: Vec<Bucket>,
    trajectories: Vec<Trajectory>,
    next_id: u64,
    counters: TaCounters,
    last_round: Option<TaRoundReport>,
}

/// The TALoRA learner of one loaded diffusion model.
pub struct TaLearner {
    engine: Arc<Engine>,
    dm: Arc<DiffusionModel>,
    opts: LearningOptions,
    /// Per bucket, the conversion adapter at the bucket's ratios, as frozen factors.
    conversion: Vec<Arc<LoraParams>>,
    input: DiffusionInput,
    state: Mutex<State>,
    recent: Mutex<VecDeque<Remembered>>,
    /// The training model (built on the first round); holding it serialises rounds and
    /// federated applies.
    frozen: Mutex<Option<Frozen>>,
    closed: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `ex`'s sequence with every position after the first masked with probability `t` (at least
/// one): the masked input, targets (the position predicting each masked token, weight 1) and
/// the labels.
fn masked(tokens: &[u32], t: f32, mask_token: u32, shift: bool, rng: &mut Rng) -> Example {
    let n = tokens.len();
    let mut input = tokens.to_vec();
    let mut picked: Vec<usize> = (1..n).filter(|_| (rng.uniform() + 1.0) * 0.5 < t).collect();
    if picked.is_empty() && n > 1 {
        picked.push(1 + (((rng.uniform() + 1.0) * 0.5 * (n - 1) as f32) as usize).min(n - 2));
    }
    for &i in &picked {
        input[i] = mask_token;
    }
    // `Example::label(r)` is `labels[r + 1]`: with the shift row i − 1 predicts token i (the
    // labels are the tokens); without it row i does (the labels one place later).
    let (targets, labels) = if shift {
        (picked.iter().map(|&i| (i - 1, 1.0)).collect(), tokens.to_vec())
    } else {
        (picked.iter().map(|&i| (i, 1.0)).collect(), std::iter::once(0).chain(tokens.iter().copied()).collect())
    };
    Example { tokens: input, targets, labels: Some(labels) }
}

/// A mask ratio drawn uniformly in bucket `b`'s range.
fn ratio_in(b: usize, rng: &mut Rng) -> f32 {
    let (lo, hi) = BUCKETS[b];
    (lo + (rng.uniform() + 1.0) * 0.5 * (hi - lo)).clamp(T_MIN, 1.0)
}

impl TaLearner {
    /// Opens (or creates) the learning directory of a diffusion model loaded in `engine`.
    pub fn open(engine: Arc<Engine>, opts: LearningOptions) -> Result<Arc<TaLearner>> {
        let dm = engine.diffusion_model().ok_or_else(|| Error::InvalidArg("TALoRA learning needs a diffusion model".into()))?;
        let dir = opts.dir.clone();
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        store::remove_stale_temporaries(&dir);
        if dir.join("state.json").exists() {
            return Err(Error::corrupt(
                &dir.join("state.json"),
                "this directory holds an autoregressive model's SONA learning; give this model its own dir".into(),
            ));
        }
        let model = engine.model();
        let cfg = model.cfg.clone();
        let shape = |p: Proj| Some(p.shape(&cfg));
        let state_path = dir.join(STATE_FILE);
        let (next_id, mut counters) = match store::read_optional(&state_path)? {
            Some(b) => {
                let s: StateFile = serde_json::from_slice(&b).map_err(|e| Error::corrupt(&state_path, e.to_string()))?;
                if s.format != "ruvllm-talora-1" {
                    return Err(Error::corrupt(&state_path, format!("unknown format '{}'", s.format)));
                }
                if (s.architecture.as_str(), s.n_layer, s.d_model, s.vocab_size) != (cfg.architecture.as_str(), cfg.n_layer, cfg.d_model, cfg.vocab_size) {
                    return Err(Error::corrupt(
                        &state_path,
                        format!("it belongs to another model ({} with {} blocks of {})", s.architecture, s.n_layer, s.d_model),
                    ));
                }
                (s.next_id, s.counters)
            }
            None => (1, TaCounters::default()),
        };
        counters.bucket_trained.resize(BUCKETS.len(), false);
        counters.improvement.resize(BUCKETS.len(), 0.0);
        let all: Vec<(usize, Proj)> = (0..cfg.n_layer).flat_map(|l| Proj::ALL.map(|p| (l, p))).collect();
        let mut buckets = Vec::with_capacity(BUCKETS.len());
        for b in 0..BUCKETS.len() {
            let [base_name, global_name, _] = bucket_files(b);
            let path = dir.join(&base_name);
            let (base, adam) = match store::read_optional(&path)? {
                Some(bytes) => {
                    let (p, a) = store::params_from_bytes(&path, &bytes, cfg.n_layer, shape)?;
                    let mut a = a.unwrap_or_else(|| Adam::new(p.len(), opts.base_lr));
                    a.lr = opts.base_lr;
                    (p, a)
                }
                None => {
                    let p = LoraParams::new(&model, &all, opts.base_rank, 2.0 * opts.base_rank as f32, opts.seed ^ 0x7A ^ ((b as u64) << 8));
                    let a = Adam::new(p.len(), opts.base_lr);
                    (p, a)
                }
            };
            let gpath = dir.join(&global_name);
            let global = match store::read_optional(&gpath)? {
                Some(bytes) => Some(Arc::new(store::params_from_bytes(&gpath, &bytes, cfg.n_layer, shape)?.0)),
                None => None,
            };
            let global_adapter = match &global {
                Some(g) => Some(crate::export::to_adapter(g, &cfg, &gpath)?),
                None => None,
            };
            let base_adapter = if counters.bucket_trained[b] { Some(crate::export::to_adapter(&base, &cfg, &path)?) } else { None };
            buckets.push(Bucket { base, adam, global, base_adapter, global_adapter });
        }
        let trajectories = store::read_trajectories(&dir)?;
        let next_id = next_id.max(trajectories.iter().map(|t| t.id + 1).max().unwrap_or(1));
        counters.trained = counters.trained.min(trajectories.len());
        counters.federated = counters.federated.min(counters.trained);
        // One copy per distinct conversion adapter (one for all buckets without TALoRA).
        let mut conversion: Vec<Arc<LoraParams>> = Vec::with_capacity(BUCKETS.len());
        let mut seen: Vec<(&Arc<LoraAdapter>, Arc<LoraParams>)> = Vec::new();
        for &(lo, hi) in &BUCKETS {
            let a = dm.adapter_for((lo + hi) / 2.0);
            let p = match seen.iter().find(|(s, _)| Arc::ptr_eq(s, a)) {
                Some((_, p)) => p.clone(),
                None => {
                    let p = Arc::new(crate::export::from_adapter(a, cfg.n_layer));
                    seen.push((a, p.clone()));
                    p
                }
            };
            conversion.push(p);
        }
        let info = dm.adapter_for(1.0).diffusion.clone();
        let input = DiffusionInput { mask_token: dm.mask_token, mask_embd: info.and_then(|d| d.mask_embd) };
        let learner = Arc::new(TaLearner {
            engine,
            dm,
            opts,
            conversion,
            input,
            state: Mutex::new(State { buckets, trajectories, next_id, counters, last_round: None }),
            recent: Mutex::new(VecDeque::new()),
            frozen: Mutex::new(None),
            closed: AtomicBool::new(false),
        });
        {
            let st = lock(&learner.state);
            learner.publish(&st);
            if !state_path.exists() {
                learner.save_state(&st)?;
            }
        }
        let weak = Arc::downgrade(&learner);
        learner.engine.set_observer(Some(Arc::new(move |c: &Completion| {
            if let Some(l) = weak.upgrade() {
                l.remember(c)
            }
        })));
        Ok(learner)
    }

    pub fn options(&self) -> &LearningOptions {
        &self.opts
    }

    /// Serves the learned adapters: each bucket's global adapter and BaseLoRA at its ratios.
    fn publish(&self, st: &State) {
        let ranges = BUCKETS
            .iter()
            .zip(&st.buckets)
            .map(|(&(t_min, t_max), b)| LearnedRange { t_min, t_max, adapters: b.global_adapter.iter().chain(&b.base_adapter).cloned().collect() })
            .filter(|r| !r.adapters.is_empty())
            .collect();
        self.dm.set_learned(ranges);
    }

    fn save_state(&self, st: &State) -> Result<()> {
        let cfg = self.engine.config();
        let f = StateFile {
            format: "ruvllm-talora-1".into(),
            architecture: cfg.architecture.clone(),
            n_layer: cfg.n_layer,
            d_model: cfg.d_model,
            vocab_size: cfg.vocab_size,
            next_id: st.next_id,
            counters: st.counters.clone(),
        };
        store::write_atomic(&self.opts.dir.join(STATE_FILE), &serde_json::to_vec_pretty(&f).map_err(|e| Error::Internal(e.to_string()))?)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.opts.dir.join(name)
    }

    /// Remembers a completion so `feedback` can find it by id (the last 4,096 are kept).
    pub fn remember(&self, c: &Completion) {
        remember_in(&self.recent, c)
    }

    /// Records feedback on completion `id` (trained on at the next `consolidate`).
    pub fn feedback(&self, id: &str, quality: f32, correction: Option<&str>) -> Result<FeedbackOutcome> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        let (prompt, output, correction) = feedback_input(&self.recent, &self.engine, id, quality, correction)?;
        let mut st = lock(&self.state);
        let t = Trajectory { id: st.next_id, completion_id: id.to_string(), time: now_ms(), prompt, output, quality, correction };
        store::append_trajectory(&self.opts.dir, &t)?;
        st.next_id += 1;
        let skipped = trained_answer(&t, self.opts.quality_gate).err().map(str::to_string);
        let trajectory = t.id;
        st.trajectories.push(t);
        Ok(FeedbackOutcome { trajectory, skipped, instant: None })
    }

    /// The model training runs on (built once: transposed weights, the mask embedding).
    fn frozen<'a>(&self, slot: &'a mut Option<Frozen>) -> &'a mut Frozen {
        slot.get_or_insert_with(|| {
            let mut fr = Frozen::new(self.engine.model(), self.engine.info().threads.max(1));
            fr.set_diffusion(Some(self.input.clone()));
            fr.set_pause(Some(pause_while_busy(&self.engine)));
            fr
        })
    }

    /// Mean loss per masked token of `seqs` in bucket `b` under `params` (masks from `seed`).
    fn eval(&self, fr: &Frozen, b: usize, params: &LoraParams, seqs: &[Vec<u32>], seed: u64) -> f64 {
        let mut rng = Rng(seed | 1);
        let (mut l, mut w) = (0.0, 0.0);
        for s in seqs {
            let t = ratio_in(b, &mut rng);
            let ex = masked(s, t, self.dm.mask_token, self.dm.shift, &mut rng);
            let (a, c) = fr.loss(&ex, Some(params));
            l += a;
            w += c;
        }
        if w > 0.0 {
            l / w
        } else {
            0.0
        }
    }

    /// Trains every bucket on the trajectories not trained yet (`epochs` passes, as many older
    /// ones replayed), measures each bucket's improvement on them, saves and serves the result.
    pub fn consolidate(&self) -> Result<TaRoundReport> {
        let start = Instant::now();
        let mut slot = lock(&self.frozen);
        let fr = self.frozen(&mut slot);
        let opts = &self.opts;
        let (new, old, upto, round_no) = {
            let st = lock(&self.state);
            let seq = |t: &Trajectory| example_of(t, opts.quality_gate, opts.max_seq).ok().map(|e| e.tokens).filter(|s| s.len() >= 2);
            let upto = st.trajectories.len();
            let new: Vec<Vec<u32>> = st.trajectories[st.counters.trained..upto].iter().filter_map(seq).collect();
            let old: Vec<Vec<u32>> = st.trajectories[..st.counters.trained].iter().filter_map(seq).collect();
            (new, old, upto, st.counters.rounds)
        };
        let mut report = TaRoundReport { trajectories: new.len(), ..Default::default() };
        fr.prepare_backward();
        let mut trained: Vec<Option<(LoraParams, Adam)>> = Vec::new();
        for b in 0..BUCKETS.len() {
            if self.closed.load(Ordering::SeqCst) {
                return Err(Error::Closed);
            }
            let (mut params, mut adam, global) = {
                let st = lock(&self.state);
                let bk = &st.buckets[b];
                (bk.base.clone(), bk.adam.clone(), bk.global.clone())
            };
            fr.set_extras(std::iter::once(self.conversion[b].clone()).chain(global).collect());
            let eval_seed = opts.seed ^ 0xE7A1 ^ (round_no << 16) ^ ((b as u64) << 8);
            if new.is_empty() {
                report.loss_before.push(0.0);
                report.loss_after.push(0.0);
                trained.push(None);
                continue;
            }
            report.loss_before.push(self.eval(fr, b, &params, &new, eval_seed));
            let mut rng = Rng((opts.seed ^ 0x5EED ^ (round_no << 20) ^ ((b as u64) << 12)) | 1);
            let mut grad = vec![0.0f32; params.len()];
            for e in 0..opts.epochs {
                let mut round: Vec<&Vec<u32>> = new.iter().collect();
                if !old.is_empty() {
                    for i in 0..new.len().min(old.len()) {
                        round.push(&old[(i * 7919 + e * 104_729 + round_no as usize * 31) % old.len()]);
                    }
                }
                let n = round.len();
                for i in (1..n).rev() {
                    let j = ((rng.uniform() + 1.0) * 0.5 * (i + 1) as f32) as usize % (i + 1);
                    round.swap(i, j);
                }
                for s in round {
                    if self.closed.load(Ordering::SeqCst) {
                        return Err(Error::Closed);
                    }
                    let t = ratio_in(b, &mut rng);
                    let ex = masked(s, t, self.dm.mask_token, self.dm.shift, &mut rng);
                    grad.iter_mut().for_each(|g| *g = 0.0);
                    let (_, w) = fr.loss_and_grad(&ex, &params, &mut grad);
                    if w <= 0.0 {
                        continue;
                    }
                    let inv = (1.0 / w) as f32;
                    grad.iter_mut().for_each(|g| *g *= inv);
                    adam.step(&mut params.w, &grad, 1.0);
                    report.steps += 1;
                    report.tokens += ex.targets.len();
                }
            }
            report.loss_after.push(self.eval(fr, b, &params, &new, eval_seed));
            trained.push(Some((params, adam)));
        }
        let cfg = self.engine.config().clone();
        let mut st = lock(&self.state);
        for (b, t) in trained.into_iter().enumerate() {
            let Some((params, adam)) = t else { continue };
            let path = self.path(&bucket_files(b)[0]);
            store::write_atomic(&path, &store::params_bytes(&params, Some(&adam)))?;
            st.buckets[b].base_adapter = Some(crate::export::to_adapter(&params, &cfg, &path)?);
            st.buckets[b].base = params;
            st.buckets[b].adam = adam;
            st.counters.bucket_trained[b] = true;
            st.counters.improvement[b] += report.loss_before[b] - report.loss_after[b];
        }
        st.counters.trained = upto;
        st.counters.rounds += 1;
        st.counters.steps += report.steps as u64;
        st.counters.tokens += report.tokens as u64;
        report.seconds = start.elapsed().as_secs_f64();
        st.last_round = Some(report.clone());
        self.save_state(&st)?;
        self.publish(&st);
        Ok(report)
    }

    pub fn stats(&self) -> TaStats {
        let st = lock(&self.state);
        let good = st.trajectories.iter().filter(|t| trained_answer(t, self.opts.quality_gate).is_ok()).count();
        let pending =
            st.trajectories[st.counters.trained.min(st.trajectories.len())..].iter().filter(|t| trained_answer(t, self.opts.quality_gate).is_ok()).count();
        TaStats {
            dir: self.opts.dir.display().to_string(),
            kind: "talora",
            trajectories: st.trajectories.len(),
            good,
            pending,
            counters: st.counters.clone(),
            last_round: st.last_round.clone(),
            base_rank: self.opts.base_rank,
            buckets: BUCKETS.iter().map(|&(a, b)| [a, b].map(|x| (x as f64 * 1e6).round() / 1e6)).collect(),
            global_rank: st.buckets.iter().map(|b| b.global.as_ref().map(|g| g.rank)).collect(),
        }
    }

    /// Writes bucket `b`'s learned adapter (global adapter and BaseLoRA summed) as a llama.cpp
    /// LoRA GGUF: it applies on top of the conversion adapter at that bucket's mask ratios.
    pub fn export(&self, path: &Path, b: usize) -> Result<()> {
        let st = lock(&self.state);
        let bk = st.buckets.get(b).ok_or_else(|| Error::InvalidArg(format!("bucket {b} does not exist (0..{})", BUCKETS.len())))?;
        let mut parts: Vec<&LoraParams> = bk.global.iter().map(|g| &**g).collect();
        if st.counters.bucket_trained[b] {
            parts.push(&bk.base);
        }
        if parts.is_empty() {
            return Err(Error::InvalidArg("nothing learned yet".into()));
        }
        crate::export::write_gguf(&parts, &self.engine.config().architecture, path)
    }

    fn digest_of(st: &State) -> String {
        let mut s = String::new();
        for b in &st.buckets {
            let g = b.global.as_deref().map(crate::federate::digest).unwrap_or_default();
            s.push_str(&g[..g.len().min(16)]);
            s.push_str(&crate::federate::digest(&b.base)[..16]);
        }
        s
    }

    /// Stops learning (state on disk stays as last saved).
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.engine.set_observer(None);
    }
}

impl FederatedLearner for TaLearner {
    fn fed_specs(&self, tier: Tier) -> Result<(Vec<AdapterSpec>, usize)> {
        if !self.opts.federate {
            return Err(Error::NoConsent("federation needs explicit consent: load the model with learning: { dir, federate: true }".into()));
        }
        let st = lock(&self.state);
        let base = &st.buckets[0].base;
        Ok((vec![crate::federate::adapter_spec_as(base, ADAPTER_ID, Some(BUCKETS.len() as u16), tier)], base.rank))
    }

    /// One update per bucket: its BaseLoRA, weighted by the trajectories learned since the last
    /// applied round, their mean quality and the bucket's measured improvement.
    fn fed_updates(&self, tier: Tier, round: u64) -> Result<Vec<Update>> {
        let st = lock(&self.state);
        let upto = st.counters.trained.min(st.trajectories.len());
        let since = st.counters.federated.min(upto);
        let good: Vec<f32> =
            st.trajectories[since..upto].iter().filter(|t| trained_answer(t, self.opts.quality_gate).is_ok()).map(|t| t.quality.min(1.0)).collect();
        let quality = if good.is_empty() { 0.0 } else { good.iter().sum::<f32>() / good.len() as f32 };
        (0..BUCKETS.len())
            .map(|b| {
                let prov = Provenance { samples: good.len() as u64, quality, improvement: st.counters.improvement[b] as f32 };
                crate::federate::to_update_as(&st.buckets[b].base, (ADAPTER_ID, Some(b as u16)), tier, round, prov)
            })
            .collect()
    }

    fn fed_apply(&self, aggs: &[Aggregate], cap: usize, server_lr: f64) -> Result<Option<(String, f64)>> {
        let _training = lock(&self.frozen);
        let cfg = self.engine.config().clone();
        let mut st = lock(&self.state);
        let st = &mut *st;
        let mut any = false;
        let mut err = 0.0f64;
        for b in 0..BUCKETS.len() {
            let Some(agg) = aggs.iter().find(|a| a.adapter == ADAPTER_ID && a.bucket == Some(b as u16)) else { continue };
            any = true;
            let [base_name, global_name, start_name] = bucket_files(b);
            let start_path = self.path(&start_name);
            let start = match store::read_optional(&start_path)? {
                Some(bytes) => Some(store::params_from_bytes(&start_path, &bytes, cfg.n_layer, |p: Proj| Some(p.shape(&cfg)))?.0),
                None => None,
            };
            let seed = self.opts.seed ^ 0x7A ^ ((b as u64) << 8) ^ st.counters.federated_rounds.wrapping_add(1).wrapping_mul(0x51);
            let bk = &mut st.buckets[b];
            let (base, global, e) = crate::federate::accumulate_any(bk.global.as_deref(), &bk.base, agg, cap, seed, (start.as_ref(), server_lr))?;
            err = err.max(e);
            let gpath = self.path(&global_name);
            match &global {
                Some(g) => store::write_atomic(&gpath, &store::params_bytes(g, None))?,
                None => store::remove_if_exists(&gpath)?,
            }
            bk.global_adapter = match &global {
                Some(g) => Some(crate::export::to_adapter(g, &cfg, &gpath)?),
                None => None,
            };
            bk.global = global.map(Arc::new);
            bk.adam = Adam::new(base.len(), bk.adam.lr);
            let bpath = self.path(&base_name);
            store::write_atomic(&bpath, &store::params_bytes(&base, Some(&bk.adam)))?;
            store::write_atomic(&start_path, &store::params_bytes(&base, None))?;
            bk.base_adapter = Some(crate::export::to_adapter(&base, &cfg, &bpath)?);
            bk.base = base;
            st.counters.bucket_trained[b] = true;
        }
        if !any {
            return Ok(None);
        }
        st.counters.federated = st.counters.trained;
        st.counters.federated_rounds += 1;
        st.counters.improvement.iter_mut().for_each(|x| *x = 0.0);
        self.save_state(st)?;
        self.publish(st);
        Ok(Some((Self::digest_of(st), err)))
    }

    fn fed_digest(&self) -> String {
        Self::digest_of(&lock(&self.state))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masking_targets_the_masked_tokens_with_and_without_the_shift() {
        let tokens: Vec<u32> = (10..40).collect();
        for shift in [true, false] {
            for (seed, t) in [(1u64, 0.02f32), (2, 0.5), (3, 1.0)] {
                let mut rng = Rng(seed);
                let ex = masked(&tokens, t, 4, shift, &mut rng);
                let masked_at: Vec<usize> = (0..tokens.len()).filter(|&i| ex.tokens[i] == 4).collect();
                assert!(!masked_at.is_empty() && masked_at[0] >= 1, "at least one, never the first");
                assert_eq!(ex.targets.len(), masked_at.len());
                for (&(row, w), &i) in ex.targets.iter().zip(&masked_at) {
                    assert_eq!(row, if shift { i - 1 } else { i });
                    assert_eq!(ex.label(row), tokens[i]);
                    assert_eq!(w, 1.0);
                    assert!(row < ex.tokens.len());
                }
                if t >= 1.0 {
                    assert_eq!(masked_at.len(), tokens.len() - 1);
                }
            }
        }
        let mut rng = Rng(9);
        for (b, &(lo, hi)) in BUCKETS.iter().enumerate() {
            for _ in 0..100 {
                let t = ratio_in(b, &mut rng);
                assert!(t >= lo.max(T_MIN) && t <= hi);
            }
        }
    }
}
