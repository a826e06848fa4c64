//! Decode strategies: how a completion's tokens are produced from a prompt. The worker hands a
//! strategy the model with its KV cache and buffers and the request; the strategy evaluates,
//! samples and streams tokens through the request's sink. Autoregressive decoding (prefill,
//! then one token per forward pass under the causal mask) is a per-sequence state
//! ([`ArSequence`]) that the engine's scheduler steps, many sequences sharing a forward pass;
//! the masked-diffusion decoder (many positions per pass under a bidirectional or block-causal
//! mask) is a [`DecodeStrategy`] that runs a request alone.

mod autoregressive;
mod diffusion;

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use super::{Event, FinishReason, GenerateParams, Sink};
use crate::backend::Backend;
use crate::kv::KvCache;
use crate::models::Transformer;
use crate::sampling::{StopMatcher, StopResult};
use crate::tokenizer::StreamDecoder;
use crate::tokenizer::Tokenizer;
use crate::Result;

pub use autoregressive::ArSequence;
pub use diffusion::{
    elbo, Diffusion, DiffusionModel, DiffusionParams, DiffusionStats, DiffusionStep, ElboParams, LearnedRange, Remasking, Schedule, DEFAULT_THRESHOLD,
    MASK_GLYPH,
};

/// What a strategy works with: the worker's model, cache and backend.
pub struct DecodeContext<'a> {
    pub model: &'a Transformer,
    /// The worker's own cache (the strategy evaluates from position 0) and the adapter set the
    /// request runs with.
    pub cache: &'a mut KvCache,
    /// Runs the forward pass; holds the logits of the last one.
    pub backend: &'a mut dyn Backend,
    pub tokenizer: &'a Tokenizer,
    /// Positions the cache holds.
    pub context: usize,
}

/// One request as a strategy sees it.
pub struct DecodeRequest<'a> {
    /// The prompt's token ids (BOS included where the model wants one); shorter than the context.
    pub prompt: &'a [u32],
    pub params: &'a GenerateParams,
    /// Checked before each forward pass; when set, the strategy stops with `FinishReason::Abort`.
    pub cancel: &'a AtomicBool,
    /// Receives each `Event::Token` as it is decided (text that may still turn into a stop
    /// string is held back).
    pub sink: &'a mut Sink,
    /// When the request started (for the time to first token).
    pub start: Instant,
}

/// What a strategy produced, with its timings.
pub struct Decoded {
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    /// Milliseconds from the request's start to the first token.
    pub ttft_ms: f64,
    /// Prompt positions evaluated (not reused from the cache) and the seconds that took.
    pub prefill_tokens: usize,
    pub prefill_s: f64,
    /// Seconds spent producing the tokens after the prompt.
    pub decode_s: f64,
    /// A diffusion decoder's counts.
    pub diffusion: Option<DiffusionStats>,
}

impl Decoded {
    /// A request stopped before producing anything.
    pub fn aborted() -> Self {
        Decoded {
            tokens: Vec::new(),
            text: String::new(),
            finish_reason: FinishReason::Abort,
            ttft_ms: 0.0,
            prefill_tokens: 0,
            prefill_s: 0.0,
            decode_s: 0.0,
            diffusion: None,
        }
    }
}

/// Sends the text a stream decoder and stop matcher still hold back (an incomplete character,
/// or a suffix that could have begun a stop string) once the output is complete, as one more
/// `Event::Token` of token `last`, and appends it to `text`.
fn flush_held(mut decoder: StreamDecoder, stops: &mut StopMatcher, text: &mut String, last: u32, sink: &mut Sink) {
    let tail = decoder.finish();
    let tail = match stops.push(&tail) {
        StopResult::Continue(t) => t + &stops.flush(),
        StopResult::Stop(t) => t,
    };
    if !tail.is_empty() {
        text.push_str(&tail);
        sink(Event::Token { id: last, text: tail, logprob: None });
    }
}

/// How a completion's tokens are produced.
pub trait DecodeStrategy {
    fn decode(&self, ctx: &mut DecodeContext<'_>, req: DecodeRequest<'_>) -> Result<Decoded>;
}
