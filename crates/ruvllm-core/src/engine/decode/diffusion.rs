//! Masked-diffusion decoding (MDLM / LLaDA with semi-autoregressive blocks, Fast-dLLM's prefix
//! cache and confidence-threshold parallel decoding). The answer starts as mask tokens; it is
//! produced block by block, left to right. Within a block, each step runs the model over the
//! block (and, with the AR shift, the position before it) under the bidirectional mask, takes
//! the logits of the masked positions only, samples a token for each and commits some of them:
//! as many as the noise schedule leaves masked after the step (by confidence or at random), or
//! every one whose probability exceeds a threshold (at least one). The prompt's and finished
//! blocks' keys and values stay in the cache and are not recomputed; a finished block is run
//! once more so its cached rows hold its final tokens. The adapter of each step is the
//! diffusion model's bucket for the block's current mask ratio (TALoRA).
//!
//! An end-of-generation token ends the answer where it is committed: later positions are
//! dropped and no later block runs.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::{DecodeContext, DecodeRequest, DecodeStrategy, Decoded};
use crate::backend::TOP_LOGITS;
use crate::engine::{Event, FinishReason};
use crate::models::{Outputs, Segment, Transformer};
use crate::nn::{AdapterSet, AttentionMask, LoraAdapter};
use crate::sampling::{log_softmax_at, log_softmax_top, Rng, Sampler, StopMatcher, StopResult};
use crate::tokenizer::StreamDecoder;
use crate::{Error, Result};

/// How many positions stay masked after each step of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Schedule {
    /// Masked fraction `1 - s/K` after step `s` of `K`: the same number committed each step.
    #[default]
    Linear,
    /// Masked fraction `cos(π/2 · s/K)`: few commits first, more as the block fills in.
    Cosine,
}

/// Which of a step's sampled positions are committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Remasking {
    /// The most confident (LLaDA's low-confidence remasking).
    #[default]
    Confidence,
    /// A random choice (MDLM's sampler).
    Random,
}

/// A request's diffusion settings.
#[derive(Debug, Clone, PartialEq)]
pub struct DiffusionParams {
    /// Denoising steps for the whole answer, split over its blocks by length (`steps == len`: one
    /// token per step). Ignored with a threshold; without either, the threshold is
    /// [`DEFAULT_THRESHOLD`].
    pub steps: Option<usize>,
    /// Positions per block (default 4: as fast as 8 on a GPU and on AVX-512, faster where a
    /// step's rows are dear, at the same quality).
    pub block_size: usize,
    /// Confidence-threshold decoding: commit every masked position whose probability exceeds
    /// it, at least one per step.
    pub threshold: Option<f32>,
    pub schedule: Schedule,
    pub remasking: Remasking,
    /// Repetition-aware remasking: a sampled token that would complete a run of this many
    /// decided tokens (prompt and committed answer) repeating a run elsewhere in them is
    /// replaced by the position's next choice, and a commit that would create such a repeat
    /// stays masked for a later step (0: off).
    pub no_repeat_ngram: usize,
    /// Rows of the block whose token has not changed since they last ran keep their cached
    /// keys and values, a step runs only from the first row that changed or is asked for, and
    /// a finished block's changed rows run with the next block's first step (so they also see
    /// its masks) instead of in a pass of their own (`false`: every step runs the whole block
    /// and each finished block runs once more, Fast-dLLM's prefix cache).
    pub reuse_rows: bool,
}

impl Default for DiffusionParams {
    fn default() -> Self {
        DiffusionParams {
            steps: None,
            block_size: 4,
            threshold: None,
            schedule: Schedule::Linear,
            remasking: Remasking::Confidence,
            no_repeat_ngram: 0,
            reuse_rows: true,
        }
    }
}

impl DiffusionParams {
    /// Checks the ranges (`steps` >= 1, `block_size` 1..=512, `threshold` in (0, 1),
    /// `no_repeat_ngram` 0..=64).
    pub fn validate(&self) -> Result<()> {
        if self.steps == Some(0) {
            return Err(Error::InvalidArg("diffusion.steps must be at least 1".into()));
        }
        if !(1..=512).contains(&self.block_size) {
            return Err(Error::InvalidArg(format!("diffusion.blockSize must be between 1 and 512, got {}", self.block_size)));
        }
        if let Some(t) = self.threshold {
            if !(t > 0.0 && t < 1.0) {
                return Err(Error::InvalidArg(format!("diffusion.threshold must be between 0 and 1 (exclusive), got {t}")));
            }
        }
        if self.no_repeat_ngram > 64 {
            return Err(Error::InvalidArg(format!("diffusion.noRepeatNgram must be between 0 and 64, got {}", self.no_repeat_ngram)));
        }
        Ok(())
    }
}

/// The confidence threshold a request runs with when it sets neither `steps` nor `threshold`:
/// the setting that makes diffusion pay (two or more tokens per forward pass) at the
/// generative perplexity of one token per step (BENCHMARKS.md, Diffusion LM).
pub const DEFAULT_THRESHOLD: f32 = 0.9;

/// A masked-diffusion model: the base model with its conversion adapters, one per range of mask
/// ratios (one adapter for all of `[0, 1]` without TALoRA), and what was learned on top of them
/// (SONA's TALoRA: adapters per range of mask ratios, [`DiffusionModel::set_learned`]).
#[derive(Clone)]
pub struct DiffusionModel {
    pub mask_token: u32,
    pub shift: bool,
    /// Sorted by `t_min`; together they cover `[0, 1]`.
    pub adapters: Vec<Arc<LoraAdapter>>,
    learned: Arc<std::sync::RwLock<Vec<LearnedRange>>>,
    /// The base model with the one conversion adapter folded into its weights
    /// ([`DiffusionModel::merge`]), and that adapter without its factors (its mask embedding).
    merged: Option<(Arc<Transformer>, Arc<LoraAdapter>)>,
}

impl std::fmt::Debug for DiffusionModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiffusionModel")
            .field("mask_token", &self.mask_token)
            .field("shift", &self.shift)
            .field("adapters", &self.adapters)
            .field("merged", &self.merged.is_some())
            .finish_non_exhaustive()
    }
}

/// Learned adapters applied, after the conversion adapter, at mask ratios in `[t_min, t_max)`
/// (`t_max` = 1 includes 1).
#[derive(Debug, Clone)]
pub struct LearnedRange {
    pub t_min: f32,
    pub t_max: f32,
    pub adapters: Vec<Arc<LoraAdapter>>,
}

impl DiffusionModel {
    /// Checks that every adapter is a diffusion adapter, that they agree on the mask token and
    /// the shift, and that their ranges tile `[0, 1]` without gaps or overlaps.
    pub fn new(adapters: Vec<Arc<LoraAdapter>>) -> Result<Self> {
        let bad = |a: &LoraAdapter, m: String| Error::adapter(&a.path, m);
        let info = |a: &Arc<LoraAdapter>| -> Result<(f32, f32, u32, bool)> {
            let d = a.diffusion.as_ref().ok_or_else(|| bad(a, "it is not a diffusion adapter (no ruvllm.diffusion.mask_token_id)".into()))?;
            Ok((d.t_min, d.t_max, d.mask_token, d.shift))
        };
        let first = adapters.first().ok_or_else(|| Error::InvalidArg("a diffusion model needs at least one adapter".into()))?;
        let (_, _, mask_token, shift) = info(first)?;
        let mut ranges = adapters.iter().map(|a| info(a).map(|i| (i, a.clone()))).collect::<Result<Vec<_>>>()?;
        ranges.sort_by(|x, y| x.0 .0.total_cmp(&y.0 .0));
        let mut end = 0.0f32;
        for ((t_min, t_max, m, sh), a) in &ranges {
            if (*m, *sh) != (mask_token, shift) {
                return Err(bad(a, "its mask token or shift differs from the other diffusion adapters'".into()));
            }
            if (t_min - end).abs() > 1e-6 {
                return Err(bad(a, format!("its mask ratios [{t_min}, {t_max}) leave a gap or overlap at {end}")));
            }
            end = *t_max;
        }
        if (end - 1.0).abs() > 1e-6 {
            return Err(Error::InvalidArg(format!("the diffusion adapters cover mask ratios up to {end}, not 1")));
        }
        let adapters = ranges.into_iter().map(|(_, a)| a).collect();
        Ok(DiffusionModel { mask_token, shift, adapters, learned: Default::default(), merged: None })
    }

    /// Folds the conversion adapter into a copy of `base`'s projection weights, stored as Q8_0,
    /// so that a step runs no low-rank products (on a GPU they were two thirds of a step's
    /// launches; an H200 decodes twice as fast with the copy). Only for one adapter covering
    /// every mask ratio (TALoRA's several would need a copy each); the copy costs the layers'
    /// size again in Q8_0 (~107 MB for Gemma 3 270M).
    pub fn merge(&mut self, base: &Transformer, threads: usize) -> Result<()> {
        if let [a] = &self.adapters[..] {
            let model = base.merged(a, 1.0, threads)?;
            self.merged = Some((Arc::new(model), Arc::new(a.without_factors())));
        }
        Ok(())
    }

    /// The model a step runs: the merged copy, or `base` with the conversion adapters.
    pub fn model<'a>(&'a self, base: &'a Transformer) -> &'a Transformer {
        self.merged.as_ref().map_or(base, |m| &m.0)
    }

    /// Makes `ranges` the learned adapters (from the next step on; empty: none).
    pub fn set_learned(&self, ranges: Vec<LearnedRange>) {
        *self.learned.write().unwrap_or_else(|e| e.into_inner()) = ranges;
    }

    /// What the forward pass applies at mask ratio `ratio`: the conversion adapter for it, then
    /// the learned adapters of the range holding it.
    /// With a merged model ([`DiffusionModel::merge`]) the conversion adapter is there without
    /// its factors.
    pub fn adapter_set(&self, ratio: f32) -> AdapterSet {
        let conversion = self.merged.as_ref().map_or_else(|| self.adapter_for(ratio), |m| &m.1);
        let mut set = vec![(conversion.clone(), 1.0)];
        let learned = self.learned.read().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = learned.iter().find(|r| ratio >= r.t_min && (ratio < r.t_max || (r.t_max >= 1.0 && ratio >= 1.0))) {
            set.extend(r.adapters.iter().map(|a| (a.clone(), 1.0)));
        }
        AdapterSet::new(set)
    }

    /// The adapter trained for mask ratio `ratio`.
    pub fn adapter_for(&self, ratio: f32) -> &Arc<LoraAdapter> {
        self.adapters
            .iter()
            .find(|a| a.diffusion.as_ref().is_some_and(|d| ratio < d.t_max))
            .unwrap_or_else(|| self.adapters.last().unwrap_or_else(|| unreachable!("never empty")))
    }
}

/// What a diffusion run reports with its completion.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DiffusionStats {
    /// Denoising steps (each one forward pass with logits).
    pub steps: usize,
    /// Blocks produced.
    pub blocks: usize,
    /// All forward passes: steps, the finished blocks' cache refreshes and the prompt.
    pub forward_passes: usize,
    /// Committed answer tokens per denoising step.
    pub tokens_per_step: f64,
}

/// One denoising step, for watchers (`Event::Step`).
#[derive(Debug, Clone, PartialEq)]
pub struct DiffusionStep {
    /// Step number from 0, over the whole answer.
    pub step: usize,
    /// Block number from 0.
    pub block: usize,
    /// Answer offsets committed in this step, with their tokens.
    pub committed: Vec<(usize, u32)>,
    /// The answer so far: committed tokens as text, masked positions as `MASK_GLYPH`.
    pub text: String,
}

/// How a masked position shows in [`DiffusionStep::text`].
pub const MASK_GLYPH: char = '░';

/// The masked-diffusion strategy for one request.
pub struct Diffusion<'m> {
    pub model: &'m DiffusionModel,
    pub params: &'m DiffusionParams,
}

/// A masked position's sampled token and its probability (under the model's distribution at
/// temperature 1, the remasking confidence).
#[derive(Clone, Copy)]
struct Candidate {
    offset: usize,
    token: u32,
    confidence: f32,
}

impl DecodeStrategy for Diffusion<'_> {
    fn decode(&self, ctx: &mut DecodeContext<'_>, req: DecodeRequest<'_>) -> Result<Decoded> {
        self.params.validate()?;
        let (dm, p) = (self.model, self.params);
        let model = dm.model(ctx.model);
        // A backend that picks where the logits are (a GPU) hands back a few per row.
        let on_device = ctx.backend.device_picks().is_some();
        let threshold = p.threshold.or(p.steps.is_none().then_some(DEFAULT_THRESHOLD));
        let ids = req.prompt;
        let tok = ctx.tokenizer;
        let n_prompt = ids.len();
        let len = req.params.max_tokens.min(ctx.context.saturating_sub(n_prompt));
        let mut stats = DiffusionStats::default();
        if len == 0 || n_prompt == 0 {
            return Ok(finish(Vec::new(), String::new(), FinishReason::Length, 0.0, 0, 0.0, 0.0, stats));
        }
        let block = p.block_size.min(len);
        let n_blocks = len.div_ceil(block);
        let total_steps = p.steps.unwrap_or(len).clamp(n_blocks, len);
        let batch = ctx.backend.max_batch();
        if block + 1 > batch {
            return Err(Error::InvalidArg(format!("diffusion.blockSize {} needs a batch of {} (this model runs {batch})", p.block_size, block + 1)));
        }
        let shift = usize::from(dm.shift);
        let mask = AttentionMask::Bidirectional;

        // The prompt, all of it or (with the shift) all but its last token, which every step of
        // the first block evaluates again as the position that predicts the first answer token.
        ctx.cache.tokens.clear();
        ctx.cache.adapters = dm.adapter_set(1.0);
        let t_prefill = Instant::now();
        let prefix = n_prompt - shift;
        for (i, chunk) in ids[..prefix].chunks(batch).enumerate() {
            if req.cancel.load(Ordering::Relaxed) {
                return Ok(Decoded::aborted());
            }
            model.forward_each(chunk, i * batch, mask, ctx.cache, ctx.backend, Outputs::LogitsOf(&[]), &mut |_, _| {})?;
            stats.forward_passes += 1;
        }
        let prefill_s = t_prefill.elapsed().as_secs_f64();

        let mut answer: Vec<u32> = vec![dm.mask_token; len];
        let mut done = vec![false; len];
        // The answer's end: the first committed end-of-generation token, if any.
        let mut end: Option<usize> = None;
        let mut sampler = Sampler::new(req.params.sampling.clone());
        let mut rng = Rng::new(req.params.sampling.seed ^ 0x9e37_79b9_7f4a_7c15);
        let mut decoder = StreamDecoder::new(tok);
        let mut stops = StopMatcher::new(req.params.stop.clone());
        let (mut text, mut emitted, mut ttft) = (String::new(), 0usize, None);
        let mut reason = FinishReason::Length;
        let mut stopped_by_string = false;
        let mut step = 0usize;
        let t_decode = Instant::now();
        let mut input = Vec::with_capacity(2 * block + 1);
        // A finished block's rows still to run, before the next block's first call (they end
        // where that call starts).
        let mut carry: Vec<u32> = Vec::with_capacity(block);
        let carry_fits = p.reuse_rows && 2 * block + shift <= batch;
        let mut rows = Vec::with_capacity(block);
        let mut call_rows = Vec::with_capacity(block);
        let mut cands: Vec<Candidate> = Vec::with_capacity(block);
        // One row's logits with the mask token excluded, for the sampler to modify.
        let mut row_logits = Vec::new();
        // Which rows of the block's call hold keys and values computed from their current token.
        let mut fresh = vec![false; block + shift];
        let n_gram = p.no_repeat_ngram;
        // The call's tokens: (the token before the block,) then the block as it stands.
        let block_input = |input: &mut Vec<u32>, answer: &[u32], s: usize, e: usize| {
            input.clear();
            if shift == 1 {
                input.push(if s == 0 { ids[n_prompt - 1] } else { answer[s - 1] });
            }
            input.extend_from_slice(&answer[s..e]);
        };
        // The first row a pass over the block runs: the first that changed since it ran, or the
        // first whose logits are wanted; the rows before it keep their cached keys and values.
        let first_row = |fresh: &[bool], want: Option<usize>| -> usize {
            let stale = if p.reuse_rows { fresh.iter().position(|f| !f).unwrap_or(fresh.len()) } else { 0 };
            want.map_or(stale, |w| w.min(stale))
        };

        'blocks: for b in 0..n_blocks {
            let (s, e) = (b * block, ((b + 1) * block).min(len));
            if end.is_some_and(|q| q < s) {
                break;
            }
            stats.blocks += 1;
            // The block's share of the steps, in proportion to its length (a short last block
            // gets fewer), so `steps == len` is exactly one token per step.
            let k_steps = (total_steps * e / len - total_steps * s / len).clamp(1, e - s);
            // Position of the call's first token: the one before the block with the shift.
            let call0 = n_prompt + s - shift;
            let fresh = &mut fresh[..e - s + shift];
            fresh.fill(false);
            let mut j = 0usize;
            loop {
                // Row r of the call predicts offset s + r (shift) or holds it (no shift): the
                // same row index either way; the rows of the still-masked offsets.
                rows.clear();
                rows.extend((s..e).filter(|&o| !done[o]).map(|o| o - s));
                let n_open = rows.len();
                if n_open == 0 {
                    break;
                }
                if req.cancel.load(Ordering::Relaxed) {
                    reason = FinishReason::Abort;
                    break 'blocks;
                }
                block_input(&mut input, &answer, s, e);
                // Only the block's first call carries rows (every row of it runs then).
                let ext = carry.len();
                input.splice(0..0, carry.drain(..));
                let ratio = n_open as f32 / (e - s) as f32;
                let set = dm.adapter_set(ratio);
                if !ctx.cache.adapters.same_as(&set) {
                    ctx.cache.adapters = set;
                    // Keys and values computed under another adapter are not this step's.
                    fresh.fill(false);
                }
                let lo = first_row(fresh, rows.first().copied());
                // Rows are carried only into a block's first call, where no row is fresh yet.
                debug_assert!(ext == 0 || lo == 0);
                call_rows.clear();
                call_rows.extend(rows.iter().map(|r| r + ext - lo));
                let pos = call0 + lo - ext;
                cands.clear();
                let mask_id = dm.mask_token as usize;
                let repeat = |offset: usize, token: u32| repeats(ids, &answer, &done, dm.mask_token, offset, token, n_gram);
                if on_device {
                    // The rows stay on the device: only each row's best logits and its
                    // normaliser come back, unless a pick needs the whole row.
                    model.forward_segments(&mut [Segment { tokens: &input[lo..], pos0: pos, cache: ctx.cache }], mask, ctx.backend)?;
                    model.heads_deferred(ctx.backend, &call_rows);
                    let top = ctx.backend.device_picks().and_then(|d| d.top_logits_norm(Some(dm.mask_token)));
                    ctx.backend.status()?;
                    let mut whole = Vec::new();
                    match top {
                        Some((top, norms)) if top.len() == call_rows.len() * TOP_LOGITS && norms.len() == call_rows.len() => {
                            for (i, (list, &norm)) in top.chunks_exact(TOP_LOGITS).zip(&norms).enumerate() {
                                let offset = s + rows[i];
                                match pick_top(&mut sampler, list, norm, |t| repeat(offset, t)) {
                                    Some((token, confidence)) => cands.push(Candidate { offset, token, confidence }),
                                    None => whole.push(i),
                                }
                            }
                        }
                        _ => whole.extend(0..call_rows.len()),
                    }
                    if !whole.is_empty() {
                        let v = model.cfg.vocab_size;
                        let logits = ctx.backend.logits();
                        if logits.len() < call_rows.len() * v {
                            return Err(Error::Internal(format!("the LM head gave {} logits for {} rows", logits.len(), call_rows.len())));
                        }
                        for i in whole {
                            let offset = s + rows[i];
                            let (token, confidence) = pick_row(&mut sampler, &mut row_logits, &logits[i * v..(i + 1) * v], mask_id, |t| repeat(offset, t));
                            cands.push(Candidate { offset, token, confidence });
                        }
                    }
                } else {
                    model.forward_each(&input[lo..], pos, mask, ctx.cache, ctx.backend, Outputs::LogitsOf(&call_rows), &mut |i, logits| {
                        let offset = s + rows[i];
                        let (token, confidence) = pick_row(&mut sampler, &mut row_logits, logits, mask_id, |t| repeat(offset, t));
                        cands.push(Candidate { offset, token, confidence });
                    })?;
                }
                fresh[lo..].fill(true);
                stats.forward_passes += 1;
                // How many to commit now.
                let n_commit = match threshold {
                    Some(tau) => cands.iter().filter(|c| c.confidence > tau).count().max(1),
                    None => {
                        // Positions left masked after step j of k: the schedule's fraction of the
                        // block, in integers where it can be (linear), so no step rounds twice.
                        let (k, len) = (k_steps.max(1), e - s);
                        let target = if j + 1 >= k {
                            0
                        } else {
                            match p.schedule {
                                Schedule::Linear => len * (k - j - 1) / k,
                                Schedule::Cosine => ((len as f64) * (std::f64::consts::FRAC_PI_2 * (j + 1) as f64 / k as f64).cos() + 1e-9).floor() as usize,
                            }
                        };
                        n_open.saturating_sub(target).max(1)
                    }
                }
                .min(n_open);
                match (threshold, p.remasking) {
                    (Some(_), _) | (None, Remasking::Confidence) => {
                        cands.sort_by(|a, b| b.confidence.total_cmp(&a.confidence).then(a.offset.cmp(&b.offset)));
                    }
                    (None, Remasking::Random) => {
                        for i in (1..cands.len()).rev() {
                            let r = (rng.next_u64() % (i as u64 + 1)) as usize;
                            cands.swap(i, r);
                        }
                    }
                }
                let mut committed = Vec::with_capacity(n_commit);
                for c in &cands[..n_commit] {
                    // Another commit of this step may have completed a repeat with this one: it
                    // stays masked (the first commit was checked against the state before them).
                    if !committed.is_empty() && repeats(ids, &answer, &done, dm.mask_token, c.offset, c.token, n_gram) {
                        continue;
                    }
                    answer[c.offset] = c.token;
                    done[c.offset] = true;
                    fresh[c.offset - s + shift] = false;
                    committed.push((c.offset, c.token));
                    if tok.is_end_of_generation(c.token) && end.is_none_or(|q| c.offset < q) {
                        end = Some(c.offset);
                    }
                }
                committed.sort_unstable();
                // Positions after the end are dropped: nothing more to decide there.
                if let Some(q) = end {
                    done[q..e].iter_mut().for_each(|d| *d = true);
                }
                if ttft.is_none() {
                    ttft = Some(req.start.elapsed().as_secs_f64() * 1000.0);
                }
                // Stream what is now decided from the start of the answer, in order.
                let limit = end.unwrap_or(len);
                while emitted < limit && done[emitted] {
                    let id = answer[emitted];
                    emitted += 1;
                    let piece = decoder.push(id)?;
                    let (emit, stop) = match stops.push(&piece) {
                        StopResult::Continue(t) => (t, false),
                        StopResult::Stop(t) => (t, true),
                    };
                    text.push_str(&emit);
                    (req.sink)(Event::Token { id, text: emit, logprob: None });
                    if stop {
                        reason = FinishReason::Stop;
                        stopped_by_string = true;
                        break;
                    }
                }
                (req.sink)(Event::Step(DiffusionStep { step, block: b, committed, text: render(tok, &answer[..limit.min(e)], &done) }));
                step += 1;
                j += 1;
                if stopped_by_string || end.is_some_and(|q| emitted >= q) {
                    reason = FinishReason::Stop;
                    break 'blocks;
                }
            }
            // The block is final: run it once more so the cache holds its final tokens (the
            // positions committed in its last step were masks when it last ran).
            if e < len && end.is_none() {
                block_input(&mut input, &answer, s, e);
                let lo = first_row(fresh, None);
                if carry_fits {
                    // Its last row (with the shift) starts the next block's call anyway.
                    carry.extend_from_slice(&input[lo.min(input.len() - shift)..input.len() - shift]);
                } else if lo < input.len() {
                    model.forward_each(&input[lo..], call0 + lo, mask, ctx.cache, ctx.backend, Outputs::LogitsOf(&[]), &mut |_, _| {})?;
                    stats.forward_passes += 1;
                }
            }
        }
        stats.steps = step;
        let out_len = end.unwrap_or(len).min(emitted);
        let tokens: Vec<u32> = answer[..out_len].to_vec();
        if !stopped_by_string {
            super::flush_held(decoder, &mut stops, &mut text, tokens.last().copied().unwrap_or(0), req.sink);
        }
        if reason == FinishReason::Length && end.is_some() {
            reason = FinishReason::Stop;
        }
        stats.tokens_per_step = if step == 0 { 0.0 } else { tokens.len() as f64 / step as f64 };
        Ok(finish(tokens, text, reason, ttft.unwrap_or(0.0), prefix, prefill_s, t_decode.elapsed().as_secs_f64(), stats))
    }
}

/// A masked position's token and confidence from its row's logits: the mask token left out,
/// the normaliser taken before sampling (which may modify the row), and a token that would
/// repeat a run (`repeat`) giving way to the position's next choice.
fn pick_row(sampler: &mut Sampler, row: &mut Vec<f32>, logits: &[f32], mask_id: usize, repeat: impl Fn(u32) -> bool) -> (u32, f32) {
    row.clear();
    row.extend_from_slice(logits);
    if let Some(v) = row.get_mut(mask_id) {
        *v = f32::NEG_INFINITY;
    }
    let norm = log_softmax_top(row, 0).0;
    let mut token = sampler.sample(row, &[]);
    for _ in 0..MAX_REPEAT_RETRIES {
        if !repeat(token) {
            break;
        }
        row[token as usize] = f32::NEG_INFINITY;
        token = sampler.sample(row, &[]);
    }
    (token, (logits[token as usize] as f64 - norm).exp() as f32)
}

/// [`pick_row`] from the row's best logits (`DevicePicks::top_logits_norm`, the mask token
/// already out) and its normaliser `norm`; `None` where they do not decide the pick as the
/// whole row would ([`Sampler::sample_top`]).
fn pick_top(sampler: &mut Sampler, top: &[(u32, f32)], norm: f64, repeat: impl Fn(u32) -> bool) -> Option<(u32, f32)> {
    let mut list = top.to_vec();
    let mut token = sampler.sample_top(&list, &[])?;
    for _ in 0..MAX_REPEAT_RETRIES {
        if !repeat(token) {
            break;
        }
        list.iter_mut().find(|c| c.0 == token)?.1 = f32::NEG_INFINITY;
        token = sampler.sample_top(&list, &[])?;
    }
    let logit = top.iter().find(|c| c.0 == token)?.1;
    Some((token, (logit as f64 - norm).exp() as f32))
}

#[allow(clippy::too_many_arguments)]
fn finish(
    tokens: Vec<u32>,
    text: String,
    reason: FinishReason,
    ttft_ms: f64,
    prefill_tokens: usize,
    prefill_s: f64,
    decode_s: f64,
    stats: DiffusionStats,
) -> Decoded {
    Decoded { tokens, text, finish_reason: reason, ttft_ms, prefill_tokens, prefill_s, decode_s, diffusion: Some(stats) }
}

/// How many times a position's sampled token gives way to its next choice because it would
/// repeat a run; after that the last choice stands (the commit check may still hold it back).
const MAX_REPEAT_RETRIES: usize = 8;

/// Whether `token` at answer offset `o` completes a run of `n` decided tokens (the prompt, then
/// the committed answer) equal to another run of them; `n == 0`: never.
fn repeats(prompt: &[u32], answer: &[u32], done: &[bool], mask: u32, o: usize, token: u32, n: usize) -> bool {
    let (np, total) = (prompt.len(), prompt.len() + answer.len());
    if n == 0 || n > total {
        return false;
    }
    let at = |p: usize| -> Option<u32> {
        if p < np {
            Some(prompt[p])
        } else if p - np == o {
            Some(token)
        } else {
            // Positions dropped after an end token are done but hold the mask.
            (done[p - np] && answer[p - np] != mask).then(|| answer[p - np])
        }
    };
    let q = np + o;
    let mut run = Vec::with_capacity(n);
    for w in q.saturating_sub(n - 1)..=q.min(total - n) {
        run.clear();
        run.extend((w..w + n).map_while(at));
        if run.len() < n {
            continue;
        }
        if (0..=total - n).any(|u| u != w && (0..n).all(|k| at(u + k) == Some(run[k]))) {
            return true;
        }
    }
    false
}

/// The answer as text: committed runs decoded, each masked position one [`MASK_GLYPH`].
fn render(tok: &crate::tokenizer::Tokenizer, answer: &[u32], done: &[bool]) -> String {
    let mut out = String::new();
    let mut run = Vec::new();
    for (o, &id) in answer.iter().enumerate() {
        if done[o] {
            run.push(id);
        } else {
            if !run.is_empty() {
                out.push_str(&tok.decode(&run, true).unwrap_or_default());
                run.clear();
            }
            out.push(MASK_GLYPH);
        }
    }
    if !run.is_empty() {
        out.push_str(&tok.decode(&run, true).unwrap_or_default());
    }
    out
}

/// How [`elbo`] estimates: `samples` mask ratios, stratified over `(0, 1]`, drawn from `seed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElboParams {
    pub samples: usize,
    pub seed: u64,
}

/// The diffusion model's negative evidence lower bound on `ids` (BOS first), in nats per token
/// after the first: a Monte-Carlo estimate of `E_t[(1/t) Σ_masked -ln p(x_i | x_masked)] / n` (MDLM),
/// an upper bound on the sequence's negative log-likelihood. For each of `samples` ratios `t`
/// (one per stratum of `(0, 1]`) every position after the first is masked with probability `t`
/// (at least one), the whole sequence runs once under the bidirectional mask with the adapter
/// of `t`, and the masked positions' cross-entropies are summed. One forward call: `ids` must
/// fit the backend's batch.
pub fn elbo(ctx: &mut DecodeContext<'_>, dm: &DiffusionModel, ids: &[u32], p: ElboParams, cancel: &std::sync::atomic::AtomicBool) -> Result<f64> {
    let n = ids.len();
    let batch = ctx.backend.max_batch();
    if n < 2 || n > batch {
        return Err(Error::InvalidArg(format!("the ELBO takes 2..={batch} tokens in one pass, got {n}")));
    }
    if p.samples == 0 {
        return Err(Error::InvalidArg("elbo.samples must be at least 1".into()));
    }
    let mut rng = Rng::new(p.seed);
    let shift = usize::from(dm.shift);
    let model = dm.model(ctx.model);
    let mut total = 0.0f64;
    let mut input = ids.to_vec();
    let mut rows = Vec::with_capacity(n);
    let mut targets = Vec::with_capacity(n);
    for k in 0..p.samples {
        if cancel.load(Ordering::Relaxed) {
            return Err(Error::Aborted);
        }
        let t = ((k as f64 + rng.next_f64()) / p.samples as f64).clamp(1e-3, 1.0);
        input.copy_from_slice(ids);
        rows.clear();
        targets.clear();
        for i in 1..n {
            if rng.next_f64() < t {
                input[i] = dm.mask_token;
                rows.push(i - shift);
                targets.push(ids[i]);
            }
        }
        if rows.is_empty() {
            let i = 1 + (rng.next_u64() % (n as u64 - 1)) as usize;
            input[i] = dm.mask_token;
            rows.push(i - shift);
            targets.push(ids[i]);
        }
        ctx.cache.adapters = dm.adapter_set(t as f32);
        let mut ce = 0.0f64;
        model.forward_each(&input, 0, AttentionMask::Bidirectional, ctx.cache, ctx.backend, Outputs::LogitsOf(&rows), &mut |r, logits| {
            ce -= log_softmax_at(logits, targets[r] as usize).0;
        })?;
        total += ce / t;
    }
    ctx.cache.tokens.clear();
    Ok(total / p.samples as f64 / (n - 1) as f64)
}

#[cfg(test)]
mod tests {
    use super::repeats;

    const M: u32 = 9;

    #[test]
    fn a_run_repeats_only_when_all_of_it_is_decided() {
        let prompt = [1, 2, 3, 5];
        let (answer, done) = ([1, 2, M, M, M], [true, true, false, false, false]);
        // 1 2 3 at answer 0..3 is the prompt's 1 2 3.
        assert!(repeats(&prompt, &answer, &done, M, 2, 3, 3));
        assert!(!repeats(&prompt, &answer, &done, M, 2, 4, 3));
        assert!(!repeats(&prompt, &answer, &done, M, 2, 3, 4), "1 2 3 5 is not 5 1 2 3");
        assert!(!repeats(&prompt, &answer, &done, M, 2, 3, 0), "0 turns it off");
        // A run with a masked position in it is not decided.
        assert!(!repeats(&prompt, &answer, &done, M, 4, 3, 3));
        // The token itself may be the run's first: 3 5 after the prompt's 3 5.
        let (answer, done) = ([7, M, 5, M, M], [true, false, true, false, false]);
        assert!(repeats(&prompt, &answer, &done, M, 1, 3, 2));
        // Positions dropped after an end token hold the mask: they match nothing.
        let (answer, done) = ([M, M, M, M, M], [false, true, true, true, true]);
        assert!(!repeats(&[M, M], &answer, &done, M, 0, 4, 2));
        // Runs longer than everything decided never repeat.
        assert!(!repeats(&prompt, &answer, &done, M, 0, 1, 12));
    }
}
