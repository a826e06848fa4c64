//! Routing and the endpoints. Every failure becomes an OpenAI error body with its status; a
//! panic in a handler is caught and answered as a 500 (the connection survives).

use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use ruvllm_core::engine::{EmbedRequest, Event, FinishReason, GenerateRequest};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};

use crate::error::ApiError;
use crate::openai::{self, ChunkWriter, Endpoint};
use crate::sse::SseBody;
use crate::state::{rss_bytes, CancelOnDrop, State};

type Body = BoxBody<Bytes, Infallible>;

fn json_response(status: u16, v: &Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())).boxed());
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn error_response(e: &ApiError) -> Response<Body> {
    json_response(e.status, &e.to_json())
}

/// The service function: never fails, never panics past here.
pub async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let fut = AssertUnwindSafe(route(state, req));
    let resp = match futures_catch(fut).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => error_response(&e),
        Err(msg) => error_response(&ApiError::internal(format!("internal error: {msg}"))),
    };
    Ok(resp)
}

/// Polls `fut`, turning a panic into `Err(message)`.
async fn futures_catch<F: std::future::Future>(fut: AssertUnwindSafe<F>) -> Result<F::Output, String> {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(move |cx| match std::panic::catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
        Ok(std::task::Poll::Ready(v)) => std::task::Poll::Ready(Ok(v)),
        Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
        Err(p) => std::task::Poll::Ready(Err(ruvllm_core::Error::from_panic(p).to_string())),
    })
    .await
}

async fn route(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let path = req.uri().path().trim_end_matches('/').to_string();
    let method = req.method().clone();
    let known = ["/health", "/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/embeddings"];
    if !known.contains(&path.as_str()) {
        return Err(ApiError::not_found(format!("no endpoint {method} {path}")));
    }
    if path != "/health" && !state.authorized(req.headers().get(AUTHORIZATION).map(HeaderValue::as_bytes)) {
        return Err(ApiError::unauthorized());
    }
    match (method, path.as_str()) {
        (Method::GET, "/health") => Ok(health(&state)),
        (Method::GET, "/v1/models") => Ok(models(&state)),
        (Method::POST, "/v1/chat/completions") => generate(state, req, Endpoint::Chat).await,
        (Method::POST, "/v1/completions") => generate(state, req, Endpoint::Completions).await,
        (Method::POST, "/v1/embeddings") => embeddings(state, req).await,
        (m, p) => Err(ApiError::new(405, "invalid_request_error", "ERR_METHOD_NOT_ALLOWED", format!("{p} does not take {m}"))),
    }
}

fn health(state: &State) -> Response<Body> {
    let (running, queued) = state.load();
    json_response(
        200,
        &json!({
            "status": "ok", "model": state.model, "running": running, "queued": queued, "parallel": state.parallel(),
            "rss_bytes": rss_bytes(),
        }),
    )
}

fn models(state: &State) -> Response<Body> {
    let info = state.engine.info();
    json_response(
        200,
        &json!({ "object": "list", "data": [{
            "id": state.model, "object": "model", "created": state.created, "owned_by": "ruvllm",
            "meta": { "architecture": info.architecture, "context_length": info.context_length, "embedding_length": info.embedding_length,
                      "parameter_count": info.parameter_count, "quantization": info.quantization, "backend": info.backend },
        }] }),
    )
}

/// The body, at most `max_body_bytes` (413), within the body timeout (408).
async fn read_body(state: &State, req: Request<Incoming>) -> Result<Bytes, ApiError> {
    let limit = state.max_body_bytes;
    let declared = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    match tokio::time::timeout(crate::BODY_TIMEOUT, Limited::new(req.into_body(), limit).collect()).await {
        Err(_) => Err(ApiError::new(408, "invalid_request_error", "ERR_TIMEOUT", "the request body did not arrive in time")),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(ApiError::too_large(limit)),
        Ok(Err(e)) => Err(ApiError::new(400, "invalid_request_error", "ERR_INVALID_ARG", format!("cannot read the request body: {e}"))),
        Ok(Ok(c)) => Ok(c.to_bytes()),
    }
}

/// Waits for a slot, then makes the request's cancel flag and its guard: from then on, dropping
/// the guard (the client went away) stops the request.
async fn slot(state: &State) -> Result<(OwnedSemaphorePermit, Arc<AtomicBool>, CancelOnDrop), ApiError> {
    let permit = state.admit().await?;
    let cancel = state.cancel_flag();
    let guard = CancelOnDrop(cancel.clone());
    Ok((permit, cancel, guard))
}

async fn generate(state: Arc<State>, req: Request<Incoming>, endpoint: Endpoint) -> Result<Response<Body>, ApiError> {
    let body = read_body(&state, req).await?;
    let o = openai::parse_object(&body)?;
    let mut g = match endpoint {
        Endpoint::Chat => openai::chat_request(&o, state.context)?,
        Endpoint::Completions => openai::completion_request(&o)?,
    };
    if endpoint == Endpoint::Chat {
        g.params.chat_template = state.chat_template.clone();
        g.params.stop.extend(state.chat_stops.iter().cloned());
    }
    let (permit, cancel, guard) = slot(&state).await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (stream, include_usage, hold_text) = (g.stream, g.include_usage, g.may_call_tools());
    state.engine.submit(GenerateRequest {
        prompt: g.prompt,
        params: g.params,
        adapters: None,
        cancel,
        sink: Box::new(move |e| {
            let _ = tx.send(e);
        }),
    })?;
    let closed = ApiError::closed;
    if stream {
        // Wait for the first event, so a request that fails at once (a prompt too long for the
        // context, ...) gets its HTTP status rather than a stream holding one error.
        let first = rx.recv().await.ok_or_else(closed)?;
        if let Event::Error(e) = first {
            return Err(e.into());
        }
        let id = format!("{:016x}", rand_id());
        let writer = ChunkWriter { endpoint, id: openai::response_id(endpoint, &id), model: state.model.clone(), created: openai::now(), include_usage };
        let body = SseBody::new(rx, first, writer, hold_text, guard, permit);
        let mut r = Response::new(body.boxed());
        let h = r.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return Ok(r);
    }
    loop {
        match rx.recv().await.ok_or_else(closed)? {
            Event::Token { .. } | Event::Step(_) => {}
            // Cancelled by `close` (a gone client reads nothing): not an answer.
            Event::Done(c) if c.finish_reason == FinishReason::Abort => return Err(ApiError::closing()),
            Event::Done(c) => {
                drop((guard, permit));
                return Ok(json_response(200, &openai::completion_json(endpoint, &state.model, &c)));
            }
            Event::Error(e) => return Err(e.into()),
        }
    }
}

/// An id for a stream's chunks, which go out before the engine's completion id is known.
fn rand_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    h.finish()
}

async fn embeddings(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let body = read_body(&state, req).await?;
    let o = openai::parse_object(&body)?;
    let e = openai::embeddings_request(&o, state.embedding_length)?;
    let mut prompt_tokens = 0;
    for t in &e.texts {
        prompt_tokens += state.engine.tokenize(t, true)?.len();
    }
    let (permit, cancel, guard) = slot(&state).await?;
    let (tx, rx) = oneshot::channel();
    state.engine.submit_embed(EmbedRequest {
        texts: e.texts,
        adapters: None,
        cancel,
        reply: Box::new(move |r| {
            let _ = tx.send(r);
        }),
    })?;
    let vectors = rx.await.map_err(|_| ApiError::closed())??;
    drop((guard, permit));
    Ok(json_response(200, &openai::embeddings_json(&state.model, &vectors, e.base64, prompt_tokens)))
}
