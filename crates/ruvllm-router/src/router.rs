//! The learning agent router.
//!
//! A router holds agents and labelled patterns (example tasks with their embedding). A task is
//! scored per agent from these signals:
//!
//! - **softmax-regression head** (`linear.rs`) over the embedding plus sparse TF-IDF word
//!   features of the task text (`lexical.rs`): trained on the patterns (weights as sample
//!   weights, class-balanced, L2-regularised) and on failed outcomes as "not this agent" rows;
//! - **centroid similarity**: cosine between the task and the agent's (weight-averaged,
//!   normalised) pattern centroid;
//! - optionally (`Params::knn_features`), a **k-NN vote** over the `k` nearest patterns
//!   (`pattern.weight * exp((cos - cos_best) / tau)`, normalised to shares) and each agent's
//!   **nearest-pattern similarity**;
//!
//! `logit[a] = beta_linear * head[a] + beta_centroid * cos_centroid[a] (+ beta_knn * share[a] +
//! beta_nearest * nearest[a])`, and `confidence` is the softmax of the logits at the
//! winning agent. The betas are fitted by maximum likelihood over the router's own patterns
//! (out-of-fold head logits, leave-one-out centroids and neighbours), so the confidence is a
//! calibrated probability on tasks that look like the patterns (the benchmark reports how well
//! that holds on held-out tasks: reliability buckets and ECE). With the k-NN features off (the
//! default; they add nothing on catalogue cross-validation), a route costs 2 x agents dot
//! products plus a lookup per word of the task, whatever the number of stored patterns.
//!
//! Learning (`feedback`): a success adds the task as a new pattern of that agent with weight
//! `feedback_weight` (or, if a near-identical pattern of the agent exists, raises its weight); a
//! failure is kept as a negative row for the head, and near-identical patterns of that agent
//! (cosine >= `failure_cos`) count it: from their `failures_to_penalise`-th failure on, each
//! failure multiplies their weight by `failure_decay`. Either way the centroids update and the
//! head is retrained from scratch (300 full-batch steps over all rows, ~0.2 s at ~900 rows): a
//! warm-started head drifted a little with every retrain, so routing depended on how many
//! outcomes had come in and in what order, not only on what they said.
//!
//! Outcome memory: every learned pattern and every failure is also listed, in order, in a memory.
//! A route adds, for each of the 16 outcomes nearest the task (among the latest 512) with cosine `s >=
//! memory_cos`, `memory_gain * (s - memory_cos) / (1 - memory_cos)` to that outcome's agent
//! (plus for a success, minus for a failure). One outcome among ~900 head rows barely moves the
//! head near it; the memory makes an outcome count where it is close to the task and nowhere
//! else. Chosen on the catalogue simulations (`catalogue_cv --learning`, never the test split):
//! gain 4 at cosine 0.5 scored -5 in distribution (as without the memory) and +146 on the
//! shifted setups (+137 without).

use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use ruvllm_embed::files::write_atomic;
use ruvllm_embed::Embedder;

use crate::error::{Error, Result};
use crate::index::{IndexConfig, VectorIndex};
use crate::lexical::{Lexicon, Sparse};
use crate::linear::{LinearHead, Row};
use crate::simd::dot;

/// An agent the router can choose.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AgentSpec {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Example tasks this agent should get (embedded when the router is built).
    #[serde(default)]
    pub examples: Vec<String>,
}

/// Where a pattern came from.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The agent's description.
    Description,
    /// Given at construction or through `add_examples`.
    Example,
    /// Learned from a successful outcome.
    Feedback,
    /// Synthetic (benchmarks only).
    Synthetic,
}

/// One stored pattern.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Pattern {
    pub text: String,
    pub agent: usize,
    pub weight: f32,
    pub successes: u32,
    pub failures: u32,
    pub source: Source,
}

/// Scoring and learning parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Params {
    /// Neighbours that vote.
    pub k: usize,
    /// Softness of the k-NN vote.
    pub tau: f32,
    pub beta_knn: f32,
    pub beta_centroid: f32,
    /// Weight of each agent's best similarity among the `k` neighbours ("nearest pattern").
    #[serde(default)]
    pub beta_nearest: f32,
    /// Weight of the softmax-regression head's logits (`linear.rs`).
    #[serde(default)]
    pub beta_linear: f32,
    /// A success this close to an existing pattern of the same agent reinforces it instead of
    /// adding a new one.
    pub dedup_cos: f32,
    /// A failure counts against the agent's patterns at least this similar (near-identical
    /// tasks only); see `failures_to_penalise`.
    pub failure_cos: f32,
    /// A pattern's weight is lowered (times `failure_decay`) from its this-many-th failure on:
    /// one failure may be the agent's bad luck, repeated ones say the pattern misleads.
    #[serde(default = "default_failures_to_penalise")]
    pub failures_to_penalise: u32,
    /// Sample weight in the head of a failed (task, agent) outcome, trained as "not this agent"
    /// (`-log(1 - p)`); 0 ignores failures in the head.
    #[serde(default = "default_negative_weight")]
    pub negative_weight: f32,
    /// Weight multiplier per failure.
    pub failure_decay: f32,
    /// Weight floor.
    pub min_weight: f32,
    /// Weight ceiling (reinforced patterns).
    pub max_weight: f32,
    /// Starting weight of a pattern learned from a successful outcome. 1 (as a catalogue
    /// example): the learning simulation on the catalogue (`catalogue_cv --learning`) showed no
    /// gain from weighting outcomes higher (weight 2 did slightly worse).
    #[serde(default = "default_feedback_weight")]
    pub feedback_weight: f32,
    /// Let `fit` use the k-NN vote and nearest-pattern features. Off by default: on 5-fold
    /// cross-validation over the catalogue they added nothing (85.3 % with and without, measured
    /// with the embedding-only head), and
    /// without them a route costs one dot product per agent (plus the head), independent of the
    /// number of stored patterns; the index then serves feedback (dedup, penalties) only.
    #[serde(default)]
    pub knn_features: bool,
    /// Outcome memory (see `Router::memory_logits`): logit added per unit of similarity ramp by a
    /// stored outcome near the task; 0 turns the memory off. 4 (with `memory_cos` 0.5) by the
    /// catalogue learning simulations; memory alone (no outcomes in the head) scored +37 shifted
    /// at gain 8, far below the head's +137, so it works next to the head, not instead of it.
    #[serde(default = "default_memory_gain")]
    pub memory_gain: f32,
    /// Outcomes less similar than this to the task do not touch its routing.
    #[serde(default = "default_memory_cos")]
    pub memory_cos: f32,
    /// Train the head on the outcomes too (learned patterns and failures as rows, retrained after
    /// each outcome); when false the head is trained on the given examples only and outcomes act
    /// through the outcome memory and the centroids.
    #[serde(default = "default_true")]
    pub outcomes_in_head: bool,
}

fn default_feedback_weight() -> f32 {
    1.0
}
fn default_failures_to_penalise() -> u32 {
    2
}
fn default_negative_weight() -> f32 {
    1.0
}
fn default_memory_gain() -> f32 {
    4.0
}
fn default_memory_cos() -> f32 {
    0.5
}
fn default_true() -> bool {
    true
}

impl Default for Params {
    fn default() -> Self {
        Params {
            k: 10,
            tau: 0.05,
            beta_knn: 6.0,
            beta_centroid: 20.0,
            beta_nearest: 0.0,
            beta_linear: 0.0,
            dedup_cos: 0.97,
            failure_cos: 0.9,
            failures_to_penalise: default_failures_to_penalise(),
            negative_weight: default_negative_weight(),
            failure_decay: 0.6,
            min_weight: 0.05,
            max_weight: 3.0,
            feedback_weight: default_feedback_weight(),
            knn_features: false,
            memory_gain: default_memory_gain(),
            memory_cos: default_memory_cos(),
            outcomes_in_head: true,
        }
    }
}

/// An agent and its score.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AgentScore {
    pub agent: String,
    pub score: f32,
}

/// What `route` answers.
#[derive(Debug, Clone, Serialize)]
pub struct Route {
    pub agent: String,
    /// Calibrated probability that `agent` is right.
    pub confidence: f32,
    /// The next agents, best first, with their probabilities.
    pub alternatives: Vec<AgentScore>,
}

/// What `feedback` did.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub enum FeedbackEffect {
    /// A new pattern was stored.
    Added { pattern: usize },
    /// An existing near-identical pattern was reinforced.
    Reinforced { pattern: usize },
    /// These patterns' weights were lowered.
    Penalised { patterns: Vec<usize> },
}

/// The router.
pub struct Router {
    embedder: Arc<dyn Embedder>,
    agents: Vec<AgentSpec>,
    patterns: Vec<Pattern>,
    index: VectorIndex,
    /// Per agent: weighted sum of pattern vectors, and its normalised form.
    centroid_sum: Vec<Vec<f32>>,
    centroid: Vec<Vec<f32>>,
    /// Softmax-regression head over the non-synthetic patterns and the negatives.
    head: LinearHead,
    /// Words of the non-synthetic pattern texts (the head's lexical features).
    lexicon: Lexicon,
    /// Failed outcomes: the task did not go well with this agent.
    negatives: Vec<Negative>,
    /// Outcome memory, oldest first: the learned patterns and failed outcomes that
    /// `memory_logits` scans (their vectors live in `index` and `negatives`). Saved, since the
    /// order cannot be rebuilt from the two lists.
    memory_items: Vec<MemoryItem>,
    params: Params,
}

/// An entry of the outcome memory.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum MemoryItem {
    /// A pattern learned from a success (its current weight counts).
    Success(usize),
    /// A failed outcome (index into `negatives`).
    Failure(usize),
}

/// Outcomes (nearest first) that vote per route.
const MEMORY_K: usize = 16;
/// The memory scans the most recent this-many outcomes: full, it costs ~12 µs more per
/// route (14.7 vs 2.2 µs p50, `ruvllm-eval`'s `examples/memory_latency`); older outcomes act through the head.
const MEMORY_MAX: usize = 512;

/// A failed outcome kept for the head: `agent` was wrong for `text`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Negative {
    pub text: String,
    pub agent: usize,
    /// Little-endian f32 vector, base64.
    v: String,
    #[serde(skip)]
    vec: Vec<f32>,
}

const FORMAT: &str = "ruvllm-router";
const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct SavedPattern {
    #[serde(flatten)]
    p: Pattern,
    /// Little-endian f32 vector, base64.
    v: String,
}

#[derive(Serialize, Deserialize)]
struct Saved {
    format: String,
    version: u32,
    embedder: String,
    dim: usize,
    agents: Vec<AgentSpec>,
    params: Params,
    #[serde(default)]
    head: LinearHead,
    patterns: Vec<SavedPattern>,
    #[serde(default)]
    negatives: Vec<Negative>,
    /// The outcome memory's order (absent in files from before it: rebuilt as patterns, then
    /// negatives).
    #[serde(default)]
    memory: Vec<MemoryItem>,
}

fn encode_vec(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn decode_vec(s: &str, dim: usize) -> Option<Vec<f32>> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(s).ok()?;
    if bytes.len() != dim * 4 {
        return None;
    }
    Some(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// Per agent, from the neighbours `nn` (best first): the k-NN vote share (weights times
/// `exp((cos - cos_best) / tau)`, normalised to sum 1) and the best weighted similarity of the
/// agent's patterns among them (the last neighbour's similarity when the agent has none there:
/// an upper bound of what it could have). A pattern's weight scales its similarity for the
/// latter as `cos * min(weight, 1)`, so penalised patterns stop counting as near.
fn neighbour_features(patterns: &[Pattern], nn: &[(usize, f32)], na: usize, tau: f32) -> (Vec<f32>, Vec<f32>) {
    let mut share = vec![0.0f32; na];
    let floor = nn.last().map_or(0.0, |x| x.1);
    let mut nearest = vec![f32::NEG_INFINITY; na];
    let best = nn.first().map_or(0.0, |x| x.1);
    let mut total = 0.0;
    for &(id, s) in nn {
        let p = &patterns[id];
        let w = p.weight * ((s - best) / tau).exp();
        share[p.agent] += w;
        total += w;
        nearest[p.agent] = nearest[p.agent].max(s * p.weight.min(1.0));
    }
    if total > 0.0 {
        share.iter_mut().for_each(|x| *x /= total);
    }
    nearest.iter_mut().for_each(|x| *x = if x.is_finite() { x.max(floor) } else { floor });
    (share, nearest)
}

fn softmax(logits: &[f32]) -> Vec<f32> {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = logits.iter().map(|l| (l - m).exp()).collect();
    let s: f32 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

/// One training row of the head: (embedding, agent, weight, is a negative).
type HeadRow<'a> = (&'a [f32], usize, f32, bool);

impl Router {
    /// An empty router over `agents` (their examples and descriptions are embedded and stored).
    pub fn new(agents: Vec<AgentSpec>, embedder: Arc<dyn Embedder>) -> Result<Self> {
        Self::with_config(agents, embedder, Params::default(), IndexConfig::default())
    }

    /// As `new`, with explicit parameters. Fits the scoring parameters when there are enough
    /// patterns.
    pub fn with_config(agents: Vec<AgentSpec>, embedder: Arc<dyn Embedder>, params: Params, index: IndexConfig) -> Result<Self> {
        if agents.is_empty() {
            return Err(Error::InvalidArg("a router needs at least one agent".into()));
        }
        let mut seen = std::collections::HashSet::new();
        for a in &agents {
            if a.name.trim().is_empty() {
                return Err(Error::InvalidArg("agent names must not be empty".into()));
            }
            if !seen.insert(a.name.as_str()) {
                return Err(Error::InvalidArg(format!("agent '{}' is listed twice", a.name)));
            }
        }
        let dim = embedder.dim();
        let mut r = Router {
            centroid_sum: vec![vec![0.0; dim]; agents.len()],
            centroid: vec![vec![0.0; dim]; agents.len()],
            memory_items: Vec::new(),
            index: VectorIndex::new(dim, index),
            embedder,
            patterns: Vec::new(),
            head: LinearHead::default(),
            lexicon: Lexicon::default(),
            negatives: Vec::new(),
            params,
            agents: Vec::new(),
        };
        let mut items: Vec<(String, usize, Source)> = Vec::new();
        for (i, a) in agents.iter().enumerate() {
            if !a.description.trim().is_empty() {
                items.push((a.description.clone(), i, Source::Description));
            }
            for ex in &a.examples {
                if !ex.trim().is_empty() {
                    items.push((ex.clone(), i, Source::Example));
                }
            }
        }
        r.agents = agents.into_iter().map(|a| AgentSpec { examples: Vec::new(), ..a }).collect();
        let texts: Vec<&str> = items.iter().map(|(t, _, _)| t.as_str()).collect();
        let vecs = if texts.is_empty() { Vec::new() } else { r.embedder.embed(&texts)? };
        let batch = items
            .into_iter()
            .zip(vecs)
            .map(|((text, agent, source), v)| (Pattern { text, agent, weight: 1.0, successes: 0, failures: 0, source }, v))
            .collect();
        r.push_many(batch);
        r.fit();
        Ok(r)
    }

    pub fn embedder(&self) -> &Arc<dyn Embedder> {
        &self.embedder
    }
    pub fn agents(&self) -> &[AgentSpec] {
        &self.agents
    }
    pub fn patterns(&self) -> &[Pattern] {
        &self.patterns
    }
    /// Failed outcomes kept for the head.
    pub fn negatives(&self) -> &[Negative] {
        &self.negatives
    }
    pub fn params(&self) -> &Params {
        &self.params
    }
    pub fn set_params(&mut self, p: Params) {
        self.params = p;
    }
    pub fn index(&self) -> &VectorIndex {
        &self.index
    }
    /// The `k` nearest patterns to `q` as `(pattern id, cosine)` through the index.
    pub fn index_search(&mut self, q: &[f32], k: usize) -> Vec<(usize, f32)> {
        self.index.search(q, k)
    }
    /// Waits for a background index rebuild (benchmarks).
    pub fn wait_index(&mut self) {
        self.index.wait();
    }

    /// Index of agent `name`.
    pub fn agent_index(&self, name: &str) -> Result<usize> {
        self.agents.iter().position(|a| a.name == name).ok_or_else(|| {
            Error::InvalidArg(format!("unknown agent '{name}'; known agents: {}", self.agents.iter().map(|a| a.name.as_str()).collect::<Vec<_>>().join(", ")))
        })
    }

    fn push_pattern(&mut self, p: Pattern, v: &[f32]) -> usize {
        let a = p.agent;
        for (s, x) in self.centroid_sum[a].iter_mut().zip(v) {
            *s += p.weight * x;
        }
        if p.source != Source::Synthetic {
            self.lexicon.add_doc(&p.text);
        }
        let learned = p.source == Source::Feedback;
        self.patterns.push(p);
        let id = self.index.push(v);
        if learned {
            self.memory_items.push(MemoryItem::Success(id));
        }
        self.renorm_centroid(a);
        id
    }

    /// Adds many patterns, updating the index once at the end (one rebuild decision).
    fn push_many(&mut self, items: Vec<(Pattern, Vec<f32>)>) {
        let mut touched = vec![false; self.agents.len()];
        let mut vecs = Vec::with_capacity(items.len());
        for (p, v) in items {
            for (s, x) in self.centroid_sum[p.agent].iter_mut().zip(&v) {
                *s += p.weight * x;
            }
            touched[p.agent] = true;
            if p.source != Source::Synthetic {
                self.lexicon.add_doc(&p.text);
            }
            if p.source == Source::Feedback {
                self.memory_items.push(MemoryItem::Success(self.patterns.len()));
            }
            self.patterns.push(p);
            vecs.push(v);
        }
        self.index.extend(vecs.iter().map(|v| v.as_slice()));
        for (a, t) in touched.into_iter().enumerate() {
            if t {
                self.renorm_centroid(a);
            }
        }
    }

    fn renorm_centroid(&mut self, a: usize) {
        self.centroid[a] = ruvllm_embed::l2_normalized(self.centroid_sum[a].clone());
    }

    fn set_weight(&mut self, id: usize, w: f32) {
        let a = self.patterns[id].agent;
        let dw = w - self.patterns[id].weight;
        let v = self.index.vector(id).to_vec();
        for (s, x) in self.centroid_sum[a].iter_mut().zip(&v) {
            *s += dw * x;
        }
        self.patterns[id].weight = w;
        self.renorm_centroid(a);
    }

    /// Adds labelled examples (embedded in one batch). Unknown agents are an error.
    pub fn add_examples(&mut self, examples: &[(String, String)]) -> Result<usize> {
        let mut resolved = Vec::with_capacity(examples.len());
        for (text, agent) in examples {
            if text.trim().is_empty() {
                return Err(Error::InvalidArg("example text must not be empty".into()));
            }
            resolved.push((text.clone(), self.agent_index(agent)?));
        }
        let texts: Vec<&str> = resolved.iter().map(|(t, _)| t.as_str()).collect();
        let vecs = self.embedder.embed(&texts)?;
        self.add_embedded(resolved.into_iter().zip(vecs).map(|((t, a), v)| (t, a, v, Source::Example)).collect())
    }

    /// Adds already-embedded patterns `(text, agent index, vector, source)`.
    pub fn add_embedded(&mut self, items: Vec<(String, usize, Vec<f32>, Source)>) -> Result<usize> {
        let n = items.len();
        for (_, agent, v, _) in &items {
            if *agent >= self.agents.len() {
                return Err(Error::InvalidArg(format!("agent index {agent} out of range")));
            }
            if v.len() != self.embedder.dim() {
                return Err(Error::InvalidArg(format!("vector has {} entries, expected {}", v.len(), self.embedder.dim())));
            }
        }
        let learn = items.iter().any(|x| x.3 != Source::Synthetic);
        let batch = items.into_iter().map(|(text, agent, v, source)| (Pattern { text, agent, weight: 1.0, successes: 0, failures: 0, source }, v)).collect();
        self.push_many(batch);
        if learn {
            self.retrain_head();
        }
        Ok(n)
    }

    /// Embeds `task` with the router's embedder.
    pub fn embed_one(&self, task: &str) -> Result<Vec<f32>> {
        if task.trim().is_empty() {
            return Err(Error::InvalidArg("the task text must not be empty".into()));
        }
        self.embedder.embed(&[task])?.pop().ok_or_else(|| ruvllm_embed::Error::Embed("embedder returned nothing".into()).into())
    }

    /// Routes a task text (embeds it, then `route_vector`).
    pub fn route(&mut self, task: &str) -> Result<Route> {
        let v = self.embed_one(task)?;
        self.route_vector(task, &v)
    }

    /// The lexical features of `task` over the router's vocabulary.
    pub fn lexical_features(&self, task: &str) -> Sparse {
        self.lexicon.features(task)
    }

    /// Per-agent probabilities for a task, given its text and its embedding `q`.
    pub fn probabilities(&mut self, task: &str, q: &[f32]) -> Result<Vec<f32>> {
        if self.patterns.is_empty() {
            return Err(Error::Empty("the router has no patterns: give agents examples or descriptions, or call addExamples".into()));
        }
        if q.len() != self.embedder.dim() {
            return Err(Error::InvalidArg(format!("vector has {} entries, expected {}", q.len(), self.embedder.dim())));
        }
        // With a fitted beta_knn of 0 the vote cannot change the result: skip the search, so a
        // route costs one dot product per agent whatever the number of patterns.
        let use_nn = self.params.beta_knn > 0.0 || self.params.beta_nearest > 0.0;
        let nn = if use_nn { self.index.search(q, self.params.k) } else { Vec::new() };
        let na = self.agents.len();
        let (share, nearest) = neighbour_features(&self.patterns, &nn, na, self.params.tau);
        let mut logits = vec![0.0f32; na];
        for a in 0..na {
            logits[a] = self.params.beta_knn * share[a] + self.params.beta_nearest * nearest[a] + self.params.beta_centroid * dot(q, &self.centroid[a]);
        }
        if self.params.beta_linear > 0.0 && self.head.is_trained() {
            let lex = self.lexicon.features(task);
            for (l, z) in logits.iter_mut().zip(self.head.logits(q, &lex)) {
                *l += self.params.beta_linear * z;
            }
        }
        self.memory_logits(q, &mut logits);
        Ok(softmax(&logits))
    }

    /// Adds the outcome memory's votes to `logits`: each of the `MEMORY_K` outcomes nearest to
    /// `q` among the latest `MEMORY_MAX`, with cosine `s >= memory_cos`, moves its agent's logit
    /// by `memory_gain * (s - memory_cos) / (1 - memory_cos)`: up for a success (times the
    /// learned pattern's weight), down for a failure (times `negative_weight`). Tasks unlike
    /// every outcome are routed exactly as without the memory.
    fn memory_logits(&self, q: &[f32], logits: &mut [f32]) {
        let p = &self.params;
        let n = self.memory_items.len();
        if p.memory_gain <= 0.0 || n == 0 {
            return;
        }
        let (gain, floor, neg) = (p.memory_gain, p.memory_cos, p.negative_weight);
        let mut near: Vec<(usize, f32)> = (n.saturating_sub(MEMORY_MAX)..n)
            .map(|m| {
                let v = match self.memory_items[m] {
                    MemoryItem::Success(id) => self.index.vector(id),
                    MemoryItem::Failure(i) => self.negatives[i].vec.as_slice(),
                };
                (m, dot(q, v))
            })
            .filter(|&(_, s)| s >= floor)
            .collect();
        near.sort_by(|a, b| b.1.total_cmp(&a.1));
        for &(m, s) in near.iter().take(MEMORY_K) {
            let ramp = gain * (s - floor) / (1.0 - floor).max(1e-6);
            match self.memory_items[m] {
                MemoryItem::Success(id) => logits[self.patterns[id].agent] += ramp * self.patterns[id].weight,
                MemoryItem::Failure(i) => logits[self.negatives[i].agent] -= ramp * neg,
            }
        }
    }

    /// Routes a task whose embedding `q` is already known (`task` is its text, for the lexical
    /// features): the winning agent, its probability and the runners-up.
    pub fn route_vector(&mut self, task: &str, q: &[f32]) -> Result<Route> {
        let probs = self.probabilities(task, q)?;
        let mut order: Vec<usize> = (0..probs.len()).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
        let top = order[0];
        Ok(Route {
            agent: self.agents[top].name.clone(),
            confidence: probs[top],
            alternatives: order[1..].iter().take(3).map(|&a| AgentScore { agent: self.agents[a].name.clone(), score: probs[a] }).collect(),
        })
    }

    /// Learns from an outcome: `agent` handled `task`, and it went well or not.
    pub fn feedback(&mut self, task: &str, agent: &str, success: bool) -> Result<FeedbackEffect> {
        let a = self.agent_index(agent)?;
        let v = self.embed_one(task)?;
        self.feedback_vector(task, &v, a, success)
    }

    /// `feedback` with the task already embedded.
    pub fn feedback_vector(&mut self, task: &str, v: &[f32], a: usize, success: bool) -> Result<FeedbackEffect> {
        if a >= self.agents.len() {
            return Err(Error::InvalidArg(format!("agent index {a} out of range")));
        }
        let nn = self.index.search(v, self.params.k.max(1));
        if success {
            if let Some(&(id, _)) = nn.iter().find(|&&(id, s)| self.patterns[id].agent == a && s >= self.params.dedup_cos) {
                self.patterns[id].successes += 1;
                let w = (self.patterns[id].weight.max(1.0) + 0.25).min(self.params.max_weight);
                self.set_weight(id, w);
                self.learn_outcome();
                return Ok(FeedbackEffect::Reinforced { pattern: id });
            }
            let id = self.push_pattern(
                Pattern {
                    text: task.to_string(),
                    agent: a,
                    weight: self.params.feedback_weight.clamp(self.params.min_weight, self.params.max_weight),
                    successes: 1,
                    failures: 0,
                    source: Source::Feedback,
                },
                v,
            );
            self.learn_outcome();
            Ok(FeedbackEffect::Added { pattern: id })
        } else {
            // The failure itself: "not this agent" for this task (and, through the head, for
            // tasks like it).
            self.negatives.push(Negative { text: task.to_string(), agent: a, v: String::new(), vec: v.to_vec() });
            self.memory_items.push(MemoryItem::Failure(self.negatives.len() - 1));
            // Near-identical patterns of the agent count the failure; from the
            // `failures_to_penalise`-th on, their weight drops.
            let near: Vec<usize> = nn.iter().filter(|&&(id, s)| self.patterns[id].agent == a && s >= self.params.failure_cos).map(|&(id, _)| id).collect();
            let mut hit = Vec::new();
            for &id in &near {
                self.patterns[id].failures += 1;
                if self.patterns[id].failures >= self.params.failures_to_penalise {
                    let w = (self.patterns[id].weight * self.params.failure_decay).max(self.params.min_weight);
                    self.set_weight(id, w);
                    hit.push(id);
                }
            }
            self.learn_outcome();
            Ok(FeedbackEffect::Penalised { patterns: hit })
        }
    }

    /// The head's training set: every non-synthetic pattern (weighted by its weight) and every
    /// negative (weighted by `negative_weight`), with their lexical features. With `skip_fold =
    /// (f, k)`, patterns `i` with `i % k == f` (other than descriptions) and all negatives are
    /// left out.
    fn head_rows(&self, skip_fold: Option<(usize, usize)>) -> (Vec<Sparse>, Vec<HeadRow<'_>>) {
        let mut lex = Vec::new();
        let mut rows = Vec::new();
        for (i, p) in self.patterns.iter().enumerate() {
            let outcome = p.source == Source::Feedback;
            if p.source != Source::Synthetic
                && p.weight > 0.0
                && (!outcome || self.params.outcomes_in_head)
                && skip_fold.is_none_or(|(f, k)| p.source == Source::Description || i % k != f)
            {
                lex.push(self.lexicon.features(&p.text));
                rows.push((self.index.vector(i), p.agent, p.weight, false));
            }
        }
        if skip_fold.is_none() && self.params.negative_weight > 0.0 && self.params.outcomes_in_head {
            for n in &self.negatives {
                lex.push(self.lexicon.features(&n.text));
                rows.push((n.vec.as_slice(), n.agent, self.params.negative_weight, true));
            }
        }
        (lex, rows)
    }

    fn train_head(&self, skip_fold: Option<(usize, usize)>) -> LinearHead {
        let (lex, mut rows) = self.head_rows(skip_fold);
        // Class balance: each agent's positive rows weigh as much in total as the mean agent's,
        // so an agent with more examples (or more learned successes) does not gain a prior edge
        // (catalogue CV: 92.3 % unbalanced, 92.6 % balanced).
        // (Balancing over the given examples only, learned rows on top at weight 2 or 4, was
        // screened on the catalogue learning simulations: -18 / -24 in distribution, against -5.)
        let mut per_agent = vec![0.0f32; self.agents.len()];
        for r in rows.iter().filter(|r| !r.3) {
            per_agent[r.1] += r.2;
        }
        let present: Vec<f32> = per_agent.iter().copied().filter(|&w| w > 0.0).collect();
        let mean = present.iter().sum::<f32>() / present.len().max(1) as f32;
        for r in rows.iter_mut().filter(|r| !r.3) {
            r.2 *= mean / per_agent[r.1];
        }
        let rows: Vec<Row> = rows.iter().zip(&lex).map(|(&(x, label, weight, negative), l)| Row { x, lex: l, label, weight, negative }).collect();
        LinearHead::train(&rows, self.agents.len(), self.embedder.dim(), self.lexicon.len())
    }

    /// Retrains the softmax-regression head from scratch on the current rows, so the head is a
    /// function of the patterns and outcomes alone, not of how many retrains came before.
    fn retrain_head(&mut self) {
        if self.agents.len() < 2 {
            return;
        }
        self.head = self.train_head(None);
    }

    /// After an outcome: retrain the head if it learns from outcomes.
    fn learn_outcome(&mut self) {
        if self.params.outcomes_in_head {
            self.retrain_head();
        }
    }

    /// Trains the softmax-regression head, then fits `(beta_linear, beta_knn, beta_nearest,
    /// beta_centroid, tau)` by log-likelihood over (up to 1500 of) the router's own patterns:
    /// leave-one-out for the k-NN and centroid features, 5-fold out-of-fold logits for the head.
    /// Does nothing with fewer than 2 agents or 20 patterns.
    pub fn fit(&mut self) {
        let n = self.patterns.len();
        let na = self.agents.len();
        if na < 2 {
            return;
        }
        self.retrain_head();
        if n < 20 {
            return;
        }
        const FOLDS: usize = 5;
        let fold_heads: Vec<LinearHead> = (0..FOLDS).map(|f| self.train_head(Some((f, FOLDS)))).collect();
        let step = (n / 1500).max(1);
        let k = self.params.k;
        // Per sampled pattern: its neighbours without itself, and LOO centroid cosines.
        struct Sample {
            label: usize,
            nn: Vec<(usize, f32)>,
            cent: Vec<f32>,
            oof: Vec<f32>,
        }
        let mut samples = Vec::new();
        for i in (0..n).step_by(step) {
            if matches!(self.patterns[i].source, Source::Description | Source::Synthetic) {
                continue;
            }
            let v = self.index.vector(i).to_vec();
            let nn: Vec<(usize, f32)> =
                if self.params.knn_features { self.index.search(&v, k + 1).into_iter().filter(|&(id, _)| id != i).take(k).collect() } else { Vec::new() };
            let label = self.patterns[i].agent;
            let w = self.patterns[i].weight;
            let cent: Vec<f32> = (0..na)
                .map(|a| {
                    if a == label {
                        let c: Vec<f32> = self.centroid_sum[a].iter().zip(&v).map(|(s, x)| s - w * x).collect();
                        dot(&v, &ruvllm_embed::l2_normalized(c))
                    } else {
                        dot(&v, &self.centroid[a])
                    }
                })
                .collect();
            let oof = fold_heads[i % FOLDS].logits(&v, &self.lexicon.features(&self.patterns[i].text));
            samples.push(Sample { label, nn, cent, oof });
        }
        if samples.len() < 10 {
            return;
        }
        let p0 = &self.params;
        let mut best = (f64::NEG_INFINITY, p0.beta_knn, p0.beta_centroid, p0.tau, p0.beta_nearest, p0.beta_linear);
        let mut logits = vec![0.0f32; na];
        let taus: &[f32] = if self.params.knn_features { &[0.02, 0.05, 0.1] } else { &[0.05] };
        for &tau in taus {
            let feats: Vec<(Vec<f32>, Vec<f32>)> = samples.iter().map(|s| neighbour_features(&self.patterns, &s.nn, na, tau)).collect();
            for bl in [0.0f32, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0] {
                let bns: &[f32] = if self.params.knn_features { &[0.0, 5.0, 10.0, 20.0] } else { &[0.0] };
                let bks: Vec<f32> = if self.params.knn_features { (0..=6).map(|i| i as f32 * 1.5).collect() } else { vec![0.0] };
                for &bn in bns {
                    for &bk in &bks {
                        for bc in (0..=8).map(|i| i as f32 * 10.0) {
                            let mut ll = 0.0f64;
                            for (s, (sh, ne)) in samples.iter().zip(&feats) {
                                for a in 0..na {
                                    logits[a] = bk * sh[a] + bn * ne[a] + bc * s.cent[a] + bl * s.oof[a];
                                }
                                let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                                let z: f32 = logits.iter().map(|l| (l - m).exp()).sum();
                                ll += ((logits[s.label] - m) - z.ln()) as f64;
                            }
                            if ll > best.0 {
                                best = (ll, bk, bc, tau, bn, bl);
                            }
                        }
                    }
                }
            }
        }
        self.params.beta_knn = best.1;
        self.params.beta_centroid = best.2;
        self.params.tau = best.3;
        self.params.beta_nearest = best.4;
        self.params.beta_linear = best.5;
    }

    /// Serialises the router (agents, parameters, patterns with their vectors).
    pub fn to_json(&self) -> Result<String> {
        let saved = Saved {
            format: FORMAT.into(),
            version: VERSION,
            embedder: self.embedder.id().to_string(),
            dim: self.embedder.dim(),
            agents: self.agents.clone(),
            params: self.params.clone(),
            head: self.head.clone(),
            patterns: self.patterns.iter().enumerate().map(|(i, p)| SavedPattern { p: p.clone(), v: encode_vec(self.index.vector(i)) }).collect(),
            negatives: self.negatives.iter().map(|n| Negative { v: encode_vec(&n.vec), vec: Vec::new(), ..n.clone() }).collect(),
            memory: self.memory_items.clone(),
        };
        serde_json::to_string(&saved).map_err(|e| Error::Internal(format!("serialising the router: {e}")))
    }

    /// Saves atomically (temp file + rename).
    pub fn save(&self, path: &Path) -> Result<()> {
        Ok(write_atomic(path, self.to_json()?.as_bytes())?)
    }

    /// Loads a saved router. If it was saved with another embedder, its pattern texts are
    /// embedded again with `embedder`.
    pub fn load(path: &Path, embedder: Arc<dyn Embedder>, index: IndexConfig) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io("reading", path, e))?;
        Self::from_json(&text, path, embedder, index)
    }

    /// Parses what `to_json` wrote; `path` is only used in errors.
    pub fn from_json(text: &str, path: &Path, embedder: Arc<dyn Embedder>, index: IndexConfig) -> Result<Self> {
        let bad = |reason: String| Error::BadState { path: path.to_path_buf(), reason };
        let saved: Saved = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        if saved.format != FORMAT {
            return Err(bad(format!("not a router file (format '{}')", saved.format)));
        }
        if saved.version != VERSION {
            return Err(bad(format!("unsupported version {}", saved.version)));
        }
        if saved.agents.is_empty() {
            return Err(bad("no agents".into()));
        }
        let dim = embedder.dim();
        let same = saved.embedder == embedder.id() && saved.dim == dim;
        let mut vecs: Vec<Vec<f32>> = Vec::with_capacity(saved.patterns.len());
        if same {
            for (i, sp) in saved.patterns.iter().enumerate() {
                vecs.push(decode_vec(&sp.v, dim).ok_or_else(|| bad(format!("pattern {i}: bad vector")))?);
            }
        } else {
            let texts: Vec<&str> = saved.patterns.iter().map(|sp| sp.p.text.as_str()).collect();
            if !texts.is_empty() {
                vecs = embedder.embed(&texts)?;
            }
        }
        let na = saved.agents.len();
        let mut r = Router {
            centroid_sum: vec![vec![0.0; dim]; na],
            centroid: vec![vec![0.0; dim]; na],
            memory_items: Vec::new(),
            index: VectorIndex::new(dim, index),
            embedder,
            patterns: Vec::with_capacity(saved.patterns.len()),
            head: if same { saved.head } else { LinearHead::default() },
            lexicon: Lexicon::default(),
            negatives: Vec::new(),
            params: saved.params,
            agents: saved.agents,
        };
        let mut negatives = saved.negatives;
        if same {
            for (i, n) in negatives.iter_mut().enumerate() {
                n.vec = decode_vec(&n.v, dim).ok_or_else(|| bad(format!("negative {i}: bad vector")))?;
            }
        } else if !negatives.is_empty() {
            let texts: Vec<String> = negatives.iter().map(|n| n.text.clone()).collect();
            let vecs = r.embedder.embed(&texts.iter().map(|t| t.as_str()).collect::<Vec<_>>())?;
            for (n, v) in negatives.iter_mut().zip(vecs) {
                n.vec = v;
            }
        }
        for (i, n) in negatives.iter_mut().enumerate() {
            if n.agent >= na {
                return Err(bad(format!("negative {i}: agent index {} out of range", n.agent)));
            }
            n.v = String::new();
        }
        r.negatives = negatives;
        let mut batch = Vec::with_capacity(vecs.len());
        for (i, (sp, v)) in saved.patterns.into_iter().zip(vecs).enumerate() {
            if sp.p.agent >= na {
                return Err(bad(format!("pattern {i}: agent index {} out of range", sp.p.agent)));
            }
            if !sp.p.weight.is_finite() || sp.p.weight < 0.0 {
                return Err(bad(format!("pattern {i}: bad weight")));
            }
            batch.push((sp.p, v));
        }
        r.push_many(batch);
        // push_many listed the learned patterns; the saved order interleaves the failures.
        if saved.memory.is_empty() {
            r.memory_items.extend((0..r.negatives.len()).map(MemoryItem::Failure));
        } else {
            let learned = r.memory_items.len();
            let valid = saved.memory.len() == learned + r.negatives.len()
                && saved.memory.iter().all(|m| match *m {
                    MemoryItem::Success(id) => r.patterns.get(id).is_some_and(|p| p.source == Source::Feedback),
                    MemoryItem::Failure(i) => i < r.negatives.len(),
                });
            if !valid {
                return Err(bad("outcome memory does not match the patterns and negatives".into()));
            }
            r.memory_items = saved.memory;
        }
        if !same {
            r.fit();
        }
        Ok(r)
    }
}
