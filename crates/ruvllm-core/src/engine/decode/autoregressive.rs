//! Autoregressive decoding, one sequence's state: after its prompt is evaluated, each step
//! samples one token from the logits of a forward pass over the previous one, under the causal
//! mask; it stops at an end-of-generation token, a stop string, the token budget, the end of
//! the context or a cancel. The engine's scheduler owns the forward passes (many sequences
//! share one) and hands each sequence its logits row; this type decides and streams the tokens.

use std::time::Instant;

use super::{Decoded, Sink};
use crate::engine::{Event, FinishReason, GenerateParams, TokenLogprob, TokenProb};
use crate::sampling::{log_softmax_top, Sampler, StopMatcher, StopResult};
use crate::structured::{OutputConstraint, ToolCall};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use crate::Result;

/// One sequence being decoded autoregressively.
pub struct ArSequence<'t> {
    tok: &'t Tokenizer,
    sampler: Sampler,
    /// Prompt and output tokens (what the penalties look at).
    history: Vec<u32>,
    prompt_len: usize,
    text: String,
    decoder: StreamDecoder<'t>,
    stops: StopMatcher,
    max_new: usize,
    start: Instant,
    ttft_ms: Option<f64>,
    stopped_by_string: bool,
    /// The output constraint (JSON, a grammar, tool calls): each step's logits are masked by
    /// it and each token committed to it.
    constraint: Option<OutputConstraint>,
    /// How many alternatives each token's log-probability comes with; `None`: not reported.
    top_logprobs: Option<usize>,
    /// The raw logits of the last pick (kept only for log-probabilities: the penalties and the
    /// constraint change the row before the token is drawn).
    raw: Vec<f32>,
    /// The last pick's log-probability, until `take` sends it with its token.
    pending: Option<TokenLogprob>,
    logprobs: Vec<TokenLogprob>,
}

impl<'t> ArSequence<'t> {
    /// A sequence for `prompt` (shorter than `context`) under `params` and `constraint`;
    /// `start` is when the request started (for the time to its first token).
    pub fn new(tok: &'t Tokenizer, prompt: &[u32], params: &GenerateParams, constraint: Option<OutputConstraint>, context: usize, start: Instant) -> Self {
        ArSequence {
            tok,
            sampler: Sampler::new(params.sampling.clone()),
            history: prompt.to_vec(),
            prompt_len: prompt.len(),
            text: String::new(),
            decoder: StreamDecoder::new(tok),
            stops: StopMatcher::new(params.stop.clone()),
            max_new: params.max_tokens.min(context.saturating_sub(prompt.len())),
            start,
            ttft_ms: None,
            stopped_by_string: false,
            constraint,
            top_logprobs: params.logprobs,
            raw: Vec::new(),
            pending: None,
            logprobs: Vec::new(),
        }
    }

    /// Whether the budget allows no token at all (the prompt is evaluated, nothing sampled).
    pub fn wants_none(&self) -> bool {
        self.max_new == 0
    }

    /// Whether, after the next token is taken, the length budget still wants another (the
    /// sequence may yet end at the end-of-generation token or a stop string).
    pub fn room_after_next(&self) -> bool {
        self.history.len() + 1 - self.prompt_len < self.max_new
    }

    /// Whether the next token is a plain argmax of the logits (greedy, no penalties, no
    /// constraint), which a backend can find where the logits are.
    pub fn plain_greedy(&self) -> bool {
        self.sampler.is_plain_greedy() && self.constraint.is_none() && self.top_logprobs.is_none()
    }

    /// Picks the next token from the row's best logits (`DevicePicks::top_logits`) where they
    /// decide it as [`pick`](Self::pick) would from the whole row: no constraint, no
    /// log-probabilities, and a sampler that keeps few enough ([`Sampler::sample_top`]).
    /// `None`: nothing was drawn; pick from the whole row.
    pub fn pick_top(&mut self, top: &[(u32, f32)]) -> Option<u32> {
        if self.constraint.is_some() || self.top_logprobs.is_some() {
            return None;
        }
        self.sampler.sample_top(top, &self.history)
    }

    /// Picks the next token from its logits (which may be modified), within the constraint.
    pub fn pick(&mut self, logits: &mut [f32]) -> Result<u32> {
        if self.top_logprobs.is_some() {
            self.raw.clear();
            self.raw.extend_from_slice(logits);
        }
        if let Some(m) = self.constraint.as_mut() {
            m.mask(logits)?;
        }
        let next = self.sampler.sample(logits, &self.history);
        if let Some(k) = self.top_logprobs {
            let (norm, top) = log_softmax_top(&self.raw, k);
            let prob = |id: u32, logprob: f64| {
                let bytes = self.tok.token_piece(id);
                TokenProb { id, text: String::from_utf8_lossy(&bytes).into_owned(), bytes, logprob }
            };
            let chosen = self.raw.get(next as usize).map_or(f64::NEG_INFINITY, |&l| l as f64 - norm);
            self.pending = Some(TokenLogprob { token: prob(next, chosen), top: top.into_iter().map(|(id, lp)| prob(id, lp)).collect() });
        }
        Ok(next)
    }

    /// The token to evaluate next and its position: the last one taken.
    pub fn last(&self) -> (u32, usize) {
        (self.history[self.history.len() - 1], self.history.len() - 1)
    }

    /// Takes the chosen token `next`: streams its text (held back while it may still begin a
    /// stop string) and says whether the sequence is finished, and why.
    pub fn take(&mut self, next: u32, sink: &mut Sink) -> Result<Option<FinishReason>> {
        if self.ttft_ms.is_none() {
            self.ttft_ms = Some(self.start.elapsed().as_secs_f64() * 1000.0);
        }
        // The end-of-generation token is not part of the output, nor is its probability.
        let logprob = self.pending.take();
        if self.tok.is_end_of_generation(next) {
            return Ok(Some(FinishReason::Stop));
        }
        if let Some(m) = self.constraint.as_mut() {
            m.commit(next)?;
        }
        self.history.push(next);
        let piece = self.decoder.push(next)?;
        let (emit, stopped) = match self.stops.push(&piece) {
            StopResult::Continue(t) => (t, false),
            StopResult::Stop(t) => (t, true),
        };
        self.text.push_str(&emit);
        if let Some(lp) = &logprob {
            self.logprobs.push(lp.clone());
        }
        sink(Event::Token { id: next, text: emit, logprob });
        if stopped {
            self.stopped_by_string = true;
            return Ok(Some(FinishReason::Stop));
        }
        // A complete constrained output can only end: no forward pass to pick the end.
        if self.constraint.as_ref().is_some_and(|m| m.is_done()) {
            return Ok(Some(FinishReason::Stop));
        }
        Ok((self.history.len() - self.prompt_len >= self.max_new).then_some(FinishReason::Length))
    }

    /// Ends the sequence for `reason`: sends what the decoder and stop matcher still hold back
    /// and returns the output with its timings (`prefill_s` / `decode_s` measured by the
    /// scheduler), the tool calls it made (the text then holds what was written besides) and
    /// the tokens' log-probabilities (when asked for).
    pub fn finish(
        mut self,
        reason: FinishReason,
        sink: &mut Sink,
        prefill_tokens: usize,
        prefill_s: f64,
        decode_s: f64,
    ) -> (Decoded, Vec<ToolCall>, Option<Vec<TokenLogprob>>) {
        let tokens = self.history.split_off(self.prompt_len);
        if !self.stopped_by_string {
            super::flush_held(self.decoder, &mut self.stops, &mut self.text, tokens.last().copied().unwrap_or(0), sink);
        }
        let (text, calls) = match &self.constraint {
            Some(m) => m.finish(self.text),
            None => (self.text, Vec::new()),
        };
        let d = Decoded { tokens, text, finish_reason: reason, ttft_ms: self.ttft_ms.unwrap_or(0.0), prefill_tokens, prefill_s, decode_s, diffusion: None };
        (d, calls, self.top_logprobs.map(|_| self.logprobs))
    }
}
