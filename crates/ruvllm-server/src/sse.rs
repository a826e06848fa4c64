//! A streamed completion as a Server-Sent Events body: each engine event becomes `data: {...}`
//! chunks, the stream ends with `data: [DONE]` (or with one `data: {"error": ...}` event when
//! the request failed after the headers went out). The body owns the request's cancel guard and
//! its slot: when hyper drops it (the client went away, or the stream ended) the engine stops
//! the request and the slot frees.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame};
use ruvllm_core::engine::{Event, FinishReason};
use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::OwnedSemaphorePermit;

use crate::error::ApiError;
use crate::openai::ChunkWriter;
use crate::state::CancelOnDrop;

pub struct SseBody {
    events: UnboundedReceiver<Event>,
    writer: ChunkWriter,
    /// Send the text only with the completion (see `GenerationBody::may_call_tools`).
    hold_text: bool,
    pending: VecDeque<Bytes>,
    finished: bool,
    /// Characters of the tokens whose log-probabilities were sent (the legacy endpoint's
    /// `text_offset`, counted as the whole response counts it).
    token_chars: usize,
    _cancel: CancelOnDrop,
    _permit: OwnedSemaphorePermit,
}

fn data(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

impl SseBody {
    /// `first` is the event the handler already took from `events` (to answer an immediate
    /// failure with a plain HTTP error instead of a stream).
    pub fn new(
        events: UnboundedReceiver<Event>,
        first: Event,
        writer: ChunkWriter,
        hold_text: bool,
        cancel: CancelOnDrop,
        permit: OwnedSemaphorePermit,
    ) -> SseBody {
        let mut body = SseBody { events, writer, hold_text, pending: VecDeque::new(), finished: false, token_chars: 0, _cancel: cancel, _permit: permit };
        if let Some(start) = body.writer.start() {
            body.pending.push_back(data(&start));
        }
        body.on_event(first);
        body
    }

    fn on_event(&mut self, e: Event) {
        match e {
            // A token with its log-probability gets a chunk even while its text is held back.
            Event::Token { text, logprob, .. } if !self.hold_text && (!text.is_empty() || logprob.is_some()) => {
                let lp = logprob.map(|l| [l]);
                self.pending.push_back(data(&self.writer.text(&text, lp.as_ref().map(|l| &l[..]), self.token_chars)));
                self.token_chars += lp.map_or(0, |[l]| l.token.text.chars().count());
            }
            Event::Token { .. } | Event::Step(_) => {}
            // The server cancels a request only when its client is gone or the server closes;
            // a client that is still reading is told the request did not finish.
            Event::Done(c) if c.finish_reason == FinishReason::Abort => self.fail(ApiError::closing()),
            Event::Done(c) => {
                if self.hold_text && (!c.text.is_empty() || c.logprobs.as_ref().is_some_and(|l| !l.is_empty())) {
                    self.pending.push_back(data(&self.writer.text(&c.text, c.logprobs.as_deref(), 0)));
                }
                for chunk in self.writer.finish(&c) {
                    self.pending.push_back(data(&chunk));
                }
                self.pending.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                self.finished = true;
            }
            Event::Error(e) => self.fail(ApiError::from(e)),
        }
    }

    fn fail(&mut self, e: ApiError) {
        self.pending.push_back(data(&e.to_json()));
        self.finished = true;
    }
}

impl Body for SseBody {
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
