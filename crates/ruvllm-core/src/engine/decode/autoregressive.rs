//! Autoregressive decoding: evaluate the prompt (reusing the cached prefix), then sample one
//! token at a time, each from the logits of a forward pass over the previous one, under the
//! causal mask; stop at an end-of-generation token, a stop string, the token budget, the end of
//! the context or a cancel.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{DecodeContext, DecodeRequest, DecodeStrategy, Decoded};
use crate::engine::{Event, FinishReason};
use crate::sampling::{Sampler, StopMatcher, StopResult};
use crate::tokenizer::StreamDecoder;
use crate::Result;

/// The decoder-LM strategy.
pub struct Autoregressive;

impl DecodeStrategy for Autoregressive {
    fn decode(&self, ctx: &mut DecodeContext<'_>, req: DecodeRequest<'_>) -> Result<Decoded> {
        let ids = req.prompt;
        let tok = ctx.tokenizer;
        let max_new = req.params.max_tokens.min(ctx.context - ids.len());

        // Prefill.
        let t_prefill = Instant::now();
        let n_past = req.reusable;
        let batch = ctx.backend.max_batch();
        for (i, chunk) in ids[n_past..].chunks(batch).enumerate() {
            if req.cancel.load(Ordering::Relaxed) {
                ctx.cache.tokens.truncate(n_past + i * batch);
                return Ok(Decoded::aborted());
            }
            ctx.model.forward(chunk, n_past + i * batch, ctx.cache, ctx.backend)?;
        }
        ctx.backend.finish();
        let prefill_s = t_prefill.elapsed().as_secs_f64();
        let prefill_tokens = ids.len() - n_past;

        // Decode.
        let mut sampler = Sampler::new(req.params.sampling.clone());
        let mut history = ids.to_vec();
        let mut generated = Vec::new();
        let mut text = String::new();
        let mut decoder = StreamDecoder::new(tok);
        let mut stops = StopMatcher::new(req.params.stop.clone());
        let mut ttft = None;
        let t_decode = Instant::now();
        let mut reason = FinishReason::Length;
        let mut stopped_by_string = false;
        let mut constraint = req.constraint;
        while generated.len() < max_new {
            if req.cancel.load(Ordering::Relaxed) {
                reason = FinishReason::Abort;
                break;
            }
            // Greedy without penalties: the backend's argmax (a GPU then hands back one id, not
            // the logits). A constraint masks the logits first, so it always samples on the host.
            let device_pick = if sampler.is_plain_greedy() && constraint.is_none() { ctx.backend.argmax() } else { None };
            let next = match (device_pick, constraint.as_deref_mut()) {
                (Some(id), _) => id,
                (None, Some(m)) => {
                    let logits = ctx.backend.logits();
                    m.mask(logits)?;
                    sampler.sample(logits, &history)
                }
                (None, None) => sampler.sample(ctx.backend.logits(), &history),
            };
            ctx.backend.status()?;
            if ttft.is_none() {
                ttft = Some(req.start.elapsed().as_secs_f64() * 1000.0);
            }
            if tok.is_end_of_generation(next) {
                reason = FinishReason::Stop;
                break;
            }
            if let Some(m) = constraint.as_deref_mut() {
                m.commit(next)?;
            }
            generated.push(next);
            history.push(next);
            let piece = decoder.push(next)?;
            let (emit, stopped) = match stops.push(&piece) {
                StopResult::Continue(t) => (t, false),
                StopResult::Stop(t) => (t, true),
            };
            text.push_str(&emit);
            (req.sink)(Event::Token { id: next, text: emit });
            if stopped {
                reason = FinishReason::Stop;
                stopped_by_string = true;
                break;
            }
            // A complete output can only end: skip the forward pass that would pick the end.
            let done = constraint.as_ref().is_some_and(|m| m.is_done());
            if done {
                reason = FinishReason::Stop;
            }
            if done || generated.len() == max_new {
                break;
            }
            let pos = history.len() - 1;
            ctx.model.forward(&[next], pos, ctx.cache, ctx.backend)?;
        }
        if !stopped_by_string {
            super::flush_held(decoder, &mut stops, &mut text, generated.last().copied().unwrap_or(0), req.sink);
        }
        Ok(Decoded {
            tokens: generated,
            text,
            finish_reason: reason,
            ttft_ms: ttft.unwrap_or(0.0),
            prefill_tokens,
            prefill_s,
            decode_s: t_decode.elapsed().as_secs_f64(),
            diffusion: None,
        })
    }
}
