//! Continuous batching: the autoregressive sequences the worker decodes together, and the KV
//! caches they run in.
//!
//! Each step is one forward pass over every active sequence that has work (one token of each
//! decoding sequence, and a chunk of the prompt of each sequence still in prefill), so the
//! weights are read once per step for all of them; the LM head runs once on the rows whose
//! logits are wanted. Requests join between steps (up to `parallel` at once) and leave when they
//! finish; each has its own KV cache, sampler and stop state. Long prompts are cut into chunks so
//! a prefill does not stall the sequences decoding beside it. Cancel, errors and the token
//! budget end one sequence only.
//!
//! Caches outlive their sequences in a [`CachePool`]: a finished sequence's cache is parked
//! with the tokens it holds, and a new request starts from the longest prefix any cache holds
//! (parked or in use): it takes a parked cache over, or copies the prefix rows into its own
//! (shared read-only: a repeated system prompt is evaluated once). Parked caches are evicted
//! least-recently-used beyond a byte budget.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::decode::ArSequence;
use super::{common_prefix, AdapterUse, Completion, Event, FinishReason, GenerateRequest, Worker, MAX_TOP_LOGPROBS, REQUEST_COUNTER};
use crate::backend::{Backend, TOP_LOGITS};
use crate::kv::KvCache;
use crate::models::{Segment, Transformer};
use crate::nn::{AdapterSet, AttentionMask};
use crate::structured::OutputConstraint;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// Prompt tokens a prefilling sequence evaluates per step while others are decoding: bounds
/// the pause a long prompt puts between their tokens.
const PREFILL_CHUNK_SHARED: usize = 128;

/// A request being decoded.
pub(super) struct Seq<'t> {
    pub req: GenerateRequest,
    id: String,
    /// The prompt's token ids.
    ids: Vec<u32>,
    cache: KvCache,
    /// Prompt positions in the cache (those reused included).
    done: usize,
    /// Prompt positions reused from another cache.
    reused: usize,
    ar: ArSequence<'t>,
    admitted: Instant,
    prefill_end: Option<Instant>,
    adapters_used: Option<Vec<AdapterUse>>,
    /// Set once the sequence is finished (reported by [`Worker::retire`]).
    outcome: Option<Result<FinishReason>>,
    /// The pass for the token this sequence will take next was sent before that token was
    /// known (see [`send_ahead`]): its pick is queued on the backend.
    ahead: bool,
}

impl Seq<'_> {
    fn prefilling(&self) -> bool {
        self.done < self.ids.len()
    }

    /// Whether the sequence has ended (for [`Worker::retire`]).
    pub fn finished(&self) -> bool {
        self.outcome.is_some()
    }
}

/// A sequence's share of one step: `len` tokens from prompt offset `from` (prefill) or its
/// last token (decode), and whether its logits are wanted.
struct Work {
    seq: usize,
    len: usize,
    head: bool,
}

/// The caches of finished sequences, kept for the prefixes they hold, and emptied caches kept
/// for the next sequences (their memory already resident: a new request does not fault in
/// fresh pages).
pub(super) struct CachePool {
    parked: Vec<(KvCache, u64)>,
    /// Most bytes of keys and values the parked caches may have touched.
    budget: usize,
    clock: u64,
    /// Emptied caches, at most `keep_free`.
    free: Vec<KvCache>,
    keep_free: usize,
}

impl CachePool {
    /// A pool whose parked caches stay within `budget` bytes and that keeps up to `keep_free`
    /// emptied caches (one batch's worth).
    pub fn new(budget: usize, keep_free: usize) -> Self {
        CachePool { parked: Vec::new(), budget, clock: 0, free: Vec::new(), keep_free }
    }

    /// The least recently parked cache's index.
    fn lru(&self) -> Option<usize> {
        self.parked.iter().enumerate().min_by_key(|(_, (_, t))| *t).map(|(i, _)| i)
    }

    /// Parks a finished sequence's cache, then evicts the least recently used beyond the budget.
    fn park(&mut self, cache: KvCache) {
        self.clock += 1;
        self.parked.push((cache, self.clock));
        let mut total: usize = self.parked.iter().map(|(c, _)| c.touched_bytes()).sum();
        while total > self.budget {
            let Some(lru) = self.lru() else { break };
            let (mut evicted, _) = self.parked.swap_remove(lru);
            total -= evicted.touched_bytes();
            if self.free.len() < self.keep_free {
                evicted.tokens.clear();
                self.free.push(evicted);
            }
        }
    }
}

/// How many leading positions of `cache` can serve `ids` under `adapters`. At least two prompt
/// tokens are always evaluated (one for its logits): a prefill of two or more tokens runs the
/// tiled attention a fresh prompt runs, whose rows do not depend on the batch, so a cache hit
/// gives the fresh prompt's bits (one token would take decode's kernels, which round
/// differently). Sliding-window rings only serve a prefix when
/// the cached sequence did not run so far past it that the window before it was overwritten.
pub(super) fn usable_prefix(cache: &KvCache, ids: &[u32], adapters: &AdapterSet, window: Option<usize>, context: usize) -> usize {
    if !cache.adapters.same_as(adapters) {
        return 0;
    }
    let old = &cache.tokens;
    let n = common_prefix(old, ids).min(ids.len().saturating_sub(2));
    if let Some(window) = window {
        let ring = cache.layers.iter().map(|l| l.capacity).min().unwrap_or(0);
        if ring < context && old.len() > n + ring.saturating_sub(window) {
            return 0;
        }
    }
    n
}

/// Copies positions `0..n` of `src` into `dst` (as far as each of `dst`'s layers keeps them),
/// with their tokens and adapters; `false` when the rows cannot be copied (device memory).
fn copy_prefix(dst: &mut KvCache, src: &KvCache, n: usize) -> bool {
    let len = src.tokens.len();
    for (d, s) in dst.layers.iter_mut().zip(&src.layers) {
        let from = n.saturating_sub(d.capacity).max(len.saturating_sub(s.capacity));
        if !d.copy_positions(s, from..n, src.row) {
            return false;
        }
    }
    dst.tokens.clear();
    dst.tokens.extend_from_slice(&src.tokens[..n]);
    dst.adapters = src.adapters.clone();
    dst.note_written(n);
    true
}

/// Sends the pass for the token after the one `s` is about to take (its pick queued on the
/// backend, not yet known to the host): the pass takes that pick on the device as its token.
/// `false` (nothing sent) when the sequence may end with the pending token, samples otherwise
/// than greedily, or the backend cannot queue the pass's own pick.
fn send_ahead(model: &Transformer, be: &mut dyn Backend, s: &mut Seq<'_>) -> Result<bool> {
    if !s.ar.plain_greedy() || !s.ar.room_after_next() || s.req.cancel.load(Ordering::Relaxed) {
        return Ok(false);
    }
    let (_, pos) = s.ar.last();
    let Some(q) = be.pick_queue() else { return Ok(false) };
    q.embed_last_pick(true);
    // A placeholder token: the cache's record of it is set once the pick is read.
    let r = model.forward_segments(&mut [Segment { tokens: &[0], pos0: pos + 1, cache: &mut s.cache }], AttentionMask::Causal, be);
    if let Some(q) = be.pick_queue() {
        q.embed_last_pick(false);
    }
    r?;
    model.head_deferred(be, 0);
    if !be.pick_queue().is_some_and(|q| q.queue_pick()) {
        be.status()?;
        return Err(Error::Internal("the backend could not queue a greedy pick".into()));
    }
    Ok(true)
}

/// The oldest queued pick of a backend with a pick queue.
fn next_pick(be: &mut dyn Backend) -> Option<u32> {
    be.pick_queue()?.next_pick()
}

/// Forgets the backend's queued picks (after a failure: none may outlive it).
pub(super) fn drop_picks(be: &mut dyn Backend) {
    if let Some(q) = be.pick_queue() {
        q.drop_picks();
    }
}

/// Ends the sequences of a failed pass with its error (their caches may be half-written: they
/// are forgotten).
fn fail(active: &mut [Seq<'_>], plan: &[Work], e: &Error) {
    for w in plan {
        let s = &mut active[w.seq];
        s.cache.tokens.clear();
        if s.outcome.is_none() {
            s.outcome = Some(Err(match e {
                Error::Gpu { code, msg } => Error::Gpu { code, msg: msg.clone() },
                Error::ContextOverflow { tokens, context } => Error::ContextOverflow { tokens: *tokens, context: *context },
                Error::InvalidArg(m) => Error::InvalidArg(m.clone()),
                other => Error::Internal(other.to_string()),
            }));
        }
    }
}

impl Worker {
    /// A cache for `ids` under `adapters` with as long a prefix already in it as any cache holds
    /// (parked, or one of `active`'s), and that prefix's length.
    fn acquire_cache(&mut self, ids: &[u32], adapters: &AdapterSet, active: &[Seq<'_>]) -> (KvCache, usize) {
        let (window, context) = (self.model.cfg.sliding_window, self.context);
        let usable = |c: &KvCache| usable_prefix(c, ids, adapters, window, context);
        let parked = self.pool.parked.iter().enumerate().map(|(i, (c, _))| (i, usable(c))).max_by_key(|&(_, n)| n);
        let running = active.iter().enumerate().map(|(i, s)| (i, usable(&s.cache))).max_by_key(|&(_, n)| n);
        let (p_n, a_n) = (parked.map_or(0, |p| p.1), running.map_or(0, |a| a.1));
        if p_n > 0 && p_n >= a_n {
            let (mut cache, _) = self.pool.parked.swap_remove(parked.map_or(0, |p| p.0));
            cache.tokens.truncate(p_n);
            return (cache, p_n);
        }
        // A fresh cache: an emptied one, or the least recently used parked one once as many
        // caches as two full batches exist (their memory is already resident), else a new one.
        let mut cache = if let Some(c) = self.pool.free.pop() {
            c
        } else if !self.pool.parked.is_empty() && self.pool.parked.len() + active.len() >= 2 * self.parallel {
            let (mut c, _) = self.pool.parked.swap_remove(self.pool.lru().unwrap_or(0));
            c.tokens.clear();
            c
        } else {
            self.model.new_cache_typed(self.backend.as_ref(), self.context, self.backend.max_batch(), self.kv_type)
        };
        if let Some((i, n)) = running.filter(|&(_, n)| n > 0) {
            if copy_prefix(&mut cache, &active[i].cache, n) {
                return (cache, n);
            }
            cache.tokens.clear();
        }
        (cache, 0)
    }

    /// Starts decoding `req` (received at `start`): its prompt, adapters and a cache; `None`
    /// when the request failed (its sink has the error).
    pub(super) fn admit<'t>(&mut self, mut req: GenerateRequest, start: Instant, tok: &'t Tokenizer, active: &[Seq<'t>]) -> Option<Seq<'t>> {
        let prepared = catch_unwind(AssertUnwindSafe(|| -> Result<_> {
            // Compiled before the prompt is evaluated, so a bad schema or grammar fails at once.
            let constraint = match OutputConstraint::needed(&req.params) {
                true => Some(OutputConstraint::new(&self.shared.token_env()?, &req.params, self.shared.tool_format(req.params.chat_template.as_deref()))?),
                false => None,
            };
            let ids = self.prompt_ids(&req.prompt, req.params.chat_template.as_deref(), &req.params.tools)?;
            if ids.len() >= self.context {
                return Err(Error::ContextOverflow { tokens: ids.len(), context: self.context });
            }
            if req.params.logprobs.is_some_and(|k| k > MAX_TOP_LOGPROBS) {
                return Err(Error::InvalidArg(format!("logprobs asks for at most {MAX_TOP_LOGPROBS} alternatives per token")));
            }
            if req.params.diffusion.is_some() {
                return Err(Error::InvalidArg(
                    "diffusion options need a diffusion model: load 'gemma-3-270m-diffusion', or a GGUF with { diffusion: { adapter } }".into(),
                ));
            }
            // The adapters ('auto' resolved on the worker's own cache, as score does).
            self.use_adapters(req.adapters.take());
            self.resolve_auto(&ids, &req.cancel)?;
            let adapters = self.cache.adapters.clone();
            Ok((ids, adapters, self.auto_used.take(), constraint))
        }));
        let prepared = prepared.unwrap_or_else(|panic| {
            self.cache.tokens.clear();
            Err(Error::from_panic(panic))
        });
        let (ids, adapters, adapters_used, constraint) = match prepared {
            Ok(p) => p,
            Err(e) => {
                let _ = catch_unwind(AssertUnwindSafe(|| (req.sink)(Event::Error(e))));
                return None;
            }
        };
        let acquired = catch_unwind(AssertUnwindSafe(|| self.acquire_cache(&ids, &adapters, active)));
        let (mut cache, reused) = match acquired {
            Ok(c) => c,
            Err(panic) => {
                let e = Error::from_panic(panic);
                let _ = catch_unwind(AssertUnwindSafe(|| (req.sink)(Event::Error(e))));
                return None;
            }
        };
        cache.adapters = adapters;
        let id = format!("cmpl-{}-{}", std::process::id(), REQUEST_COUNTER.fetch_add(1, Ordering::Relaxed));
        let ar = ArSequence::new(tok, &ids, &req.params, constraint, self.context, start);
        Some(Seq { req, id, ids, cache, done: reused, reused, ar, admitted: Instant::now(), prefill_end: None, adapters_used, outcome: None, ahead: false })
    }

    /// One forward pass over the active sequences' next tokens, then their sampling. Finished
    /// sequences are marked (`outcome`), not removed.
    pub(super) fn step(&mut self, active: &mut [Seq<'_>]) {
        for s in active.iter_mut().filter(|s| s.outcome.is_none()) {
            if s.req.cancel.load(Ordering::Relaxed) {
                s.outcome = Some(Ok(FinishReason::Abort));
            } else if !s.prefilling() && s.ar.wants_none() {
                s.outcome = Some(Ok(FinishReason::Length));
            }
        }
        // A pass sent ahead is this step's work: its pick is taken (and, while the sequence
        // decodes alone, the pass after it sent first).
        let (plan, r) = match active.iter().position(|s| s.ahead) {
            Some(i) => (vec![Work { seq: i, len: 1, head: true }], catch_unwind(AssertUnwindSafe(|| self.step_ahead(active, i)))),
            None => {
                let plan = self.plan(active);
                if plan.is_empty() {
                    return;
                }
                let r = catch_unwind(AssertUnwindSafe(|| self.run_plan(active, &plan)));
                (plan, r)
            }
        };
        if !matches!(r, Ok(Ok(()))) {
            // A pick may have been queued before the failure (whether or not a pass was sent
            // ahead): none may outlive it.
            drop_picks(&mut *self.backend);
            active.iter_mut().for_each(|s| s.ahead = false);
        }
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => fail(active, &plan, &e),
            Err(panic) => fail(active, &plan, &Error::from_panic(panic)),
        }
    }

    /// Takes the pick of sequence `i`'s pass that was sent ahead; while the sequence still
    /// decodes alone, the pass for the token after it is sent first (the device then always
    /// has the next pass queued while the host handles a token).
    fn step_ahead(&mut self, active: &mut [Seq<'_>], i: usize) -> Result<()> {
        let alone = active.iter().filter(|s| s.outcome.is_none()).count() == 1;
        let s = &mut active[i];
        let be: &mut dyn Backend = &mut *self.backend;
        if s.outcome.is_some() {
            // Finished (or cancelled) meanwhile: the pick is not wanted.
            s.ahead = false;
            next_pick(be);
            return be.status();
        }
        let sent = alone && send_ahead(&self.model, be, s)?;
        self.take_pick(s, sent)
    }

    /// Hands `s` the oldest queued pick; `sent`: the pass for the token after it was sent
    /// ahead (the cache's record of that pass's token is the pick).
    fn take_pick(&mut self, s: &mut Seq<'_>, sent: bool) -> Result<()> {
        let picked = next_pick(&mut *self.backend);
        self.backend.status()?;
        let id = picked.ok_or_else(|| Error::Internal("no greedy pick was queued".into()))?;
        s.ahead = sent;
        if sent {
            let (_, pos) = s.ar.last();
            s.cache.tokens[pos + 1] = id;
        }
        self.take(s, id)
    }

    /// Which sequences this step carries, and how many tokens of each: every decoding sequence
    /// (one token), then prefill chunks within the backend's batch. Sequences run under the same
    /// adapters in one pass; a step takes the adapter group of the first sequence in turn (the
    /// turn rotates, so no group waits long). A backend that runs one sequence per pass gets
    /// them in turn.
    fn plan(&mut self, active: &[Seq<'_>]) -> Vec<Work> {
        let live: Vec<usize> = (0..active.len()).filter(|&i| active[i].outcome.is_none()).collect();
        if live.is_empty() {
            return Vec::new();
        }
        self.turn = self.turn.wrapping_add(1);
        let first = live[self.turn % live.len()];
        let group = &active[first].cache.adapters;
        let order: Vec<usize> =
            live.iter().cycle().skip(self.turn % live.len()).take(live.len()).copied().filter(|&i| active[i].cache.adapters.same_as(group)).collect();
        let mut budget = self.backend.max_batch();
        let segments = self.backend.runs_segments();
        let mut plan = Vec::new();
        for &i in order.iter().filter(|&&i| !active[i].prefilling()) {
            if budget == 0 || (!segments && !plan.is_empty()) {
                break;
            }
            plan.push(Work { seq: i, len: 1, head: true });
            budget -= 1;
        }
        let decoding = !plan.is_empty();
        for &i in order.iter().filter(|&&i| active[i].prefilling()) {
            if budget == 0 || (!segments && !plan.is_empty()) {
                break;
            }
            let s = &active[i];
            let cap = if decoding { PREFILL_CHUNK_SHARED.min(budget) } else { budget };
            let len = (s.ids.len() - s.done).min(cap);
            plan.push(Work { seq: i, len, head: s.done + len == s.ids.len() });
            budget -= len;
        }
        plan
    }

    /// Runs `plan`: the forward pass, the LM head on the rows whose logits are wanted, and each
    /// of those sequences' next token.
    fn run_plan(&mut self, active: &mut [Seq<'_>], plan: &[Work]) -> Result<()> {
        let model: &Transformer = &self.model;
        let be: &mut dyn Backend = &mut *self.backend;
        // The tokens each sequence evaluates: a prompt chunk, or its last token.
        let tokens: Vec<(Vec<u32>, usize)> = plan
            .iter()
            .map(|w| {
                let s = &active[w.seq];
                if s.prefilling() {
                    (s.ids[s.done..s.done + w.len].to_vec(), s.done)
                } else {
                    let (t, pos) = s.ar.last();
                    (vec![t], pos)
                }
            })
            .collect();
        {
            let mut picked: Vec<Option<&mut Seq<'_>>> = active.iter_mut().map(Some).collect();
            let mut segments = Vec::with_capacity(plan.len());
            for (w, (t, pos0)) in plan.iter().zip(&tokens) {
                let Some(s) = picked[w.seq].take() else { return Err(Error::Internal("a sequence planned twice".into())) };
                segments.push(Segment { tokens: t, pos0: *pos0, cache: &mut s.cache });
            }
            model.forward_segments(&mut segments, AttentionMask::Causal, be)?;
        }
        // The rows whose logits are wanted (the last row of each such sequence's share).
        let mut rows = Vec::new();
        let mut at = 0;
        for w in plan {
            at += w.len;
            let s = &mut active[w.seq];
            if s.prefilling() {
                s.done += w.len;
            }
            if w.head && !(s.ar.wants_none()) {
                rows.push((w.seq, at - 1));
            }
        }
        if rows.is_empty() {
            return Ok(());
        }
        let v = model.cfg.vocab_size;
        // One greedy sequence: the backend's argmax (a GPU then hands back one id, not the
        // logits); where the backend has none, the logits the same LM head left.
        if let [(i, row)] = rows[..] {
            if active[i].ar.plain_greedy() {
                // Found from a few exactly scored rows of the LM head where the backend can.
                if let Some(id) = model.head_argmax(be, row) {
                    be.status()?;
                    return self.take(&mut active[i], id);
                }
                model.head_deferred(be, row);
                // Decoding alone: the pick stays on the device as the next pass's token, and
                // that pass is sent before the host reads the pick.
                let alone = active.iter().filter(|s| s.outcome.is_none()).count() == 1;
                if alone && be.pick_queue().is_some_and(|q| q.queue_pick()) {
                    let sent = send_ahead(model, be, &mut active[i])?;
                    return self.take_pick(&mut active[i], sent);
                }
                let id = match be.device_picks().and_then(|p| p.argmax()) {
                    Some(id) => id,
                    None => {
                        be.status()?;
                        let logits = be.logits();
                        if logits.len() < v {
                            return Err(Error::Internal(format!("the LM head gave {} logits", logits.len())));
                        }
                        active[i].ar.pick(&mut logits[..v])?
                    }
                };
                be.status()?;
                return self.take(&mut active[i], id);
            }
        }
        let head_rows: Vec<usize> = rows.iter().map(|r| r.1).collect();
        model.heads_deferred(be, &head_rows);
        // Where the backend finds each row's pick itself (a GPU then hands back one id, or a
        // few candidates, per row instead of the logits): every sequence greedy, or each
        // deciding from its row's best logits; the others then pick from the logits.
        let mut picks: Vec<(usize, u32)> = Vec::with_capacity(rows.len());
        let mut rest: Vec<usize> = (0..rows.len()).collect();
        if rows.iter().all(|&(i, _)| active[i].ar.plain_greedy()) {
            if let Some(ids) = be.device_picks().and_then(|p| p.argmax_rows()) {
                be.status()?;
                if ids.len() != rows.len() {
                    return Err(Error::Internal(format!("{} greedy picks for {} rows", ids.len(), rows.len())));
                }
                picks.extend(rows.iter().map(|r| r.0).zip(ids));
                rest.clear();
            }
        } else if let Some(top) = be.device_picks().and_then(|p| p.top_logits()) {
            be.status()?;
            if top.len() != rows.len() * TOP_LOGITS {
                return Err(Error::Internal(format!("{} top logits for {} rows", top.len(), rows.len())));
            }
            rest.retain(|&k| {
                let i = rows[k].0;
                match active[i].ar.pick_top(&top[k * TOP_LOGITS..(k + 1) * TOP_LOGITS]) {
                    Some(id) => {
                        picks.push((i, id));
                        false
                    }
                    None => true,
                }
            });
        }
        if !rest.is_empty() {
            // The logits the LM head left.
            be.status()?;
            let logits = be.logits();
            if logits.len() < rows.len() * v {
                return Err(Error::Internal(format!("the LM head gave {} logits for {} rows", logits.len(), rows.len())));
            }
            for k in rest {
                let i = rows[k].0;
                // A constraint's failure is the sequence's own.
                match active[i].ar.pick(&mut logits[k * v..(k + 1) * v]) {
                    Ok(id) => picks.push((i, id)),
                    Err(e) => active[i].outcome = Some(Err(e)),
                }
            }
        }
        for (i, id) in picks {
            self.take(&mut active[i], id)?;
        }
        Ok(())
    }

    /// Hands sequence `s` its next token; an error is the sequence's own.
    fn take(&mut self, s: &mut Seq<'_>, id: u32) -> Result<()> {
        // Prefill ends when its first token is known: a GPU pass has finished by then (it is
        // only recorded when the forward call returns).
        s.prefill_end.get_or_insert_with(Instant::now);
        match s.ar.take(id, &mut s.req.sink) {
            Ok(Some(reason)) => s.outcome = Some(Ok(reason)),
            Ok(None) => {}
            Err(e) => s.outcome = Some(Err(e)),
        }
        Ok(())
    }

    /// Reports a finished sequence (its completion, or its error) and parks its cache.
    pub(super) fn retire(&mut self, mut s: Seq<'_>) {
        if s.ahead {
            // The pass sent ahead evaluated a token the sequence took: its cache row is valid,
            // its pick is not wanted.
            s.ahead = false;
            next_pick(&mut *self.backend);
        }
        let outcome = s.outcome.take().unwrap_or(Ok(FinishReason::Abort));
        let now = Instant::now();
        let prefill_end = s.prefill_end.unwrap_or(now);
        let prefill_s = (prefill_end - s.admitted).as_secs_f64();
        let decode_s = (now - prefill_end).as_secs_f64();
        let mut sink = s.req.sink;
        let event = match outcome {
            Ok(FinishReason::Abort) if self.closing.load(Ordering::SeqCst) => Event::Error(Error::Closed),
            Ok(reason) => {
                let (d, tool_calls, logprobs) = s.ar.finish(reason, &mut sink, s.ids.len() - s.reused, prefill_s, decode_s);
                let decoded = d.tokens.len().saturating_sub(1);
                let c = Completion {
                    id: s.id,
                    completion_tokens: d.tokens.len(),
                    text: d.text,
                    tokens: d.tokens,
                    prompt_tokens: s.ids.len(),
                    cached_tokens: s.reused,
                    prompt_ids: s.ids,
                    finish_reason: d.finish_reason,
                    ttft_ms: d.ttft_ms,
                    prefill_tokens_per_second: if d.prefill_s > 0.0 { d.prefill_tokens as f64 / d.prefill_s } else { 0.0 },
                    decode_tokens_per_second: if d.decode_s > 0.0 && decoded > 0 { decoded as f64 / d.decode_s } else { 0.0 },
                    diffusion: None,
                    adapters_used: s.adapters_used,
                    tool_calls,
                    logprobs,
                };
                let observer = super::lock(&self.hooks).observer.clone();
                if let Some(f) = observer {
                    let _ = catch_unwind(AssertUnwindSafe(|| f(&c)));
                }
                Event::Done(c)
            }
            Err(e) => Event::Error(e),
        };
        let _ = catch_unwind(AssertUnwindSafe(|| sink(event)));
        self.pool.park(s.cache);
    }
}
