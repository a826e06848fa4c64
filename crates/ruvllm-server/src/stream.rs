//! A streamed completion as a response body: each engine event becomes frames in the
//! surface's framing — Server-Sent Events for the OpenAI endpoints (`data: {...}`, ending with
//! `data: [DONE]`), newline-delimited JSON for Ollama's — and a request that fails after the
//! headers went out ends with one error frame. The body owns the request's cancel guard and its
//! slot: when hyper drops it (the client went away, or the stream ended) the engine stops the
//! request and the slot frees.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame};
use ruvllm_core::engine::{Completion, Event, FinishReason, TokenLogprob};
use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::OwnedSemaphorePermit;

use crate::error::ApiError;
use crate::openai::ChunkWriter;
use crate::state::CancelOnDrop;

/// How one surface writes a stream's frames.
pub trait Framing: Send + Sync + Unpin + 'static {
    /// Frames before the first token (OpenAI chat's role chunk).
    fn start(&mut self) -> Option<Bytes> {
        None
    }
    /// A piece of text, with its token's log-probability when asked for.
    fn token(&mut self, text: &str, logprob: Option<&TokenLogprob>) -> Bytes;
    /// The frames that end a finished stream; `held` says the text was held back (tools may be
    /// called) and goes out now.
    fn finish(&mut self, c: &Completion, held: bool) -> Vec<Bytes>;
    /// The one frame of a request that failed after the headers went out.
    fn error(&mut self, e: &ApiError) -> Bytes;
}

pub struct StreamBody<F: Framing> {
    events: UnboundedReceiver<Event>,
    framing: F,
    /// Send the text only with the completion (see `GenerationBody::may_call_tools`).
    hold_text: bool,
    pending: VecDeque<Bytes>,
    finished: bool,
    _cancel: CancelOnDrop,
    _permit: OwnedSemaphorePermit,
}

impl<F: Framing> StreamBody<F> {
    /// `first` is the event the handler already took from `events` (to answer an immediate
    /// failure with a plain HTTP error instead of a stream).
    pub fn new(events: UnboundedReceiver<Event>, first: Event, framing: F, hold_text: bool, cancel: CancelOnDrop, permit: OwnedSemaphorePermit) -> Self {
        let mut body = StreamBody { events, framing, hold_text, pending: VecDeque::new(), finished: false, _cancel: cancel, _permit: permit };
        if let Some(start) = body.framing.start() {
            body.pending.push_back(start);
        }
        body.on_event(first);
        body
    }

    fn on_event(&mut self, e: Event) {
        match e {
            // A token with its log-probability gets a frame even while its text is held back.
            Event::Token { text, logprob, .. } if !self.hold_text && (!text.is_empty() || logprob.is_some()) => {
                self.pending.push_back(self.framing.token(&text, logprob.as_ref()));
            }
            Event::Token { .. } | Event::Step(_) => {}
            // The server cancels a request only when its client is gone or the server closes;
            // a client that is still reading is told the request did not finish.
            Event::Done(c) if c.finish_reason == FinishReason::Abort => self.fail(ApiError::closing()),
            Event::Done(c) => {
                self.pending.extend(self.framing.finish(&c, self.hold_text));
                self.finished = true;
            }
            Event::Error(e) => self.fail(ApiError::from(e)),
        }
    }

    fn fail(&mut self, e: ApiError) {
        self.pending.push_back(self.framing.error(&e));
        self.finished = true;
    }
}

impl<F: Framing> Body for StreamBody<F> {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        loop {
            if let Some(b) = this.pending.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(b))));
            }
            if this.finished {
                return Poll::Ready(None);
            }
            match this.events.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(e)) => this.on_event(e),
                // The engine promises a last `Done` or `Error`; a sink dropped without one is
                // the engine going away.
                Poll::Ready(None) => this.fail(ApiError::closed()),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.finished && self.pending.is_empty()
    }
}

/// The OpenAI endpoints' Server-Sent Events.
pub struct Sse {
    pub writer: ChunkWriter,
    /// Characters of the tokens whose log-probabilities were sent (the legacy endpoint's
    /// `text_offset`, counted as the whole response counts it).
    token_chars: usize,
}

impl Sse {
    pub fn new(writer: ChunkWriter) -> Sse {
        Sse { writer, token_chars: 0 }
    }
}

fn data(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

impl Framing for Sse {
    fn start(&mut self) -> Option<Bytes> {
        self.writer.start().map(|v| data(&v))
    }

    fn token(&mut self, text: &str, logprob: Option<&TokenLogprob>) -> Bytes {
        let frame = data(&self.writer.text(text, logprob.map(std::slice::from_ref), self.token_chars));
        self.token_chars += logprob.map_or(0, |l| l.token.text.chars().count());
        frame
    }

    fn finish(&mut self, c: &Completion, held: bool) -> Vec<Bytes> {
        let mut out = Vec::new();
        if held && (!c.text.is_empty() || c.logprobs.as_ref().is_some_and(|l| !l.is_empty())) {
            out.push(data(&self.writer.text(&c.text, c.logprobs.as_deref(), 0)));
        }
        out.extend(self.writer.finish(c).iter().map(data));
        out.push(Bytes::from_static(b"data: [DONE]\n\n"));
        out
    }

    fn error(&mut self, e: &ApiError) -> Bytes {
        data(&e.to_json())
    }
}
