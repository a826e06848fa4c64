//! Routing and the endpoints. Every failure becomes an error body in the surface's format
//! (OpenAI's, or Ollama's under `/api/`) with its status; a panic in a handler is caught and
//! answered as a 500 (the connection survives). Every answer is counted for `/metrics` and,
//! with CORS on, carries the `Access-Control-Allow-*` headers.

use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, CACHE_CONTROL, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, ORIGIN, TRANSFER_ENCODING};
use hyper::{Method, Request, Response, StatusCode};
use ruvllm_core::engine::{Completion, EmbedRequest, Event, FinishReason, GenerateRequest};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};

use crate::error::ApiError;
use crate::metrics::{self, Metrics};
use crate::ollama::{self, Api, Clock, Ndjson, OllamaWriter};
use crate::openai::{self, ChunkWriter, Endpoint, GenerationBody};
use crate::state::{rss_bytes, CancelOnDrop, State};
use crate::stream::{Framing, Sse, StreamBody};

type Body = BoxBody<Bytes, Infallible>;

fn response(status: u16, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).boxed());
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn json_response(status: u16, v: &Value) -> Response<Body> {
    response(status, "application/json", v.to_string())
}

/// An error in the format of the surface the request came through.
fn error_response(e: &ApiError, ollama: bool) -> Response<Body> {
    json_response(e.status, &if ollama { e.to_ollama_json() } else { e.to_json() })
}

/// The path without a trailing slash (`/` stays `/`).
fn route_path(path: &str) -> &str {
    match path.trim_end_matches('/') {
        "" => "/",
        p => p,
    }
}

/// The service function: never fails, never panics past here.
pub async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let path = route_path(req.uri().path()).to_string();
    let ollama = path.starts_with("/api/");
    let origin = req.headers().get(ORIGIN).cloned();
    let has_body = req.headers().contains_key(TRANSFER_ENCODING) || req.headers().get(CONTENT_LENGTH).is_some_and(|v| v.as_bytes() != b"0");
    let fut = AssertUnwindSafe(route(state.clone(), req, &path));
    let mut resp = match futures_catch(fut).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            let mut r = error_response(&e, ollama);
            // These answers come before the body is read (or while it is being read): the
            // connection cannot carry another request, and saying so keeps a client that pools
            // connections (Bun's fetch does) from sending its next request into a closed socket.
            if has_body && matches!(e.status, 401 | 404 | 405 | 408 | 413) {
                r.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
            }
            r
        }
        Err(msg) => error_response(&ApiError::internal(format!("internal error: {msg}")), ollama),
    };
    state.metrics.count_request(metrics::endpoint_index(&path), resp.status().as_u16());
    if let Some(cors) = &state.cors {
        cors.allow(resp.headers_mut(), origin.as_ref());
    }
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

/// Paths answered without the API key: liveness probes (`/health`, and `/` and `/api/version`,
/// which Ollama clients probe to find a server). They carry no data beyond "up" and a version.
/// `/metrics` is not among them: it reveals traffic and token volumes, and Prometheus sends a
/// bearer token when configured with one.
const PUBLIC: &[&str] = &["/", "/health", "/api/version"];

async fn route(state: Arc<State>, req: Request<Incoming>, path: &str) -> Result<Response<Body>, ApiError> {
    let method = req.method().clone();
    if metrics::endpoint_index(path) == metrics::ENDPOINTS.len() - 1 {
        return Err(ApiError::not_found(format!("no endpoint {method} {path}")));
    }
    // A CORS preflight carries no credentials: it is answered before the key is checked.
    if method == Method::OPTIONS {
        if let Some(cors) = &state.cors {
            return Ok(cors.preflight(req.headers()));
        }
    }
    if !PUBLIC.contains(&path) && !state.authorized(req.headers().get(AUTHORIZATION).map(HeaderValue::as_bytes)) {
        return Err(ApiError::unauthorized());
    }
    let start = Instant::now();
    match (method, path) {
        (Method::GET | Method::HEAD, "/") => Ok(response(200, "text/plain; charset=utf-8", "Ollama is running")),
        (Method::GET, "/health") => Ok(health(&state)),
        (Method::GET, "/metrics") => {
            let (running, queued) = state.load();
            Ok(response(200, "text/plain; version=0.0.4; charset=utf-8", state.metrics.render(running, queued)))
        }
        (Method::POST, "/tokenize") => tokenize(&state, req).await,
        (Method::POST, "/detokenize") => detokenize(&state, req).await,
        (Method::GET, "/v1/models") => Ok(models(&state)),
        (Method::POST, "/v1/chat/completions") => generate(state, req, Endpoint::Chat, start).await,
        (Method::POST, "/v1/completions") => generate(state, req, Endpoint::Completions, start).await,
        (Method::POST, "/v1/embeddings") => embeddings(state, req).await,
        (Method::GET, "/api/version") => Ok(json_response(200, &json!({ "version": ollama::OLLAMA_VERSION }))),
        (Method::GET, "/api/tags") => Ok(json_response(200, &json!({ "models": [tag(&state)] }))),
        (Method::POST, "/api/show") => show(state, req).await,
        (Method::POST, "/api/generate") => ollama_generate(state, req, Api::Generate, start).await,
        (Method::POST, "/api/chat") => ollama_generate(state, req, Api::Chat, start).await,
        (Method::POST, "/api/embed") => ollama_embed(state, req, start).await,
        (Method::POST, "/api/embeddings") => ollama_embeddings(state, req).await,
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

/// The body read as a JSON object.
async fn read_object(state: &State, req: Request<Incoming>) -> Result<Map<String, Value>, ApiError> {
    openai::parse_object(&read_body(state, req).await?)
}

/// Waits for a slot, then makes the request's cancel flag and its guard: from then on, dropping
/// the guard (the client went away) stops the request.
async fn slot(state: &State) -> Result<(OwnedSemaphorePermit, Arc<AtomicBool>, CancelOnDrop), ApiError> {
    let permit = state.admit().await?;
    let cancel = state.cancel_flag();
    let guard = CancelOnDrop(cancel.clone());
    Ok((permit, cancel, guard))
}

/// A generation handed to the engine: its events, its slot and its cancel guard.
struct Running {
    events: UnboundedReceiver<Event>,
    permit: OwnedSemaphorePermit,
    guard: CancelOnDrop,
    /// Send the text only with the completion (see `GenerationBody::may_call_tools`).
    hold_text: bool,
}

/// Submits `g` once a slot is free; `chat` adds the server's chat template and its stops. The
/// sink times the first token and counts the finished request's tokens for `/metrics`, from
/// `start` (the request's arrival, so queueing counts).
async fn submit(state: &State, g: GenerationBody, chat: bool, start: Instant) -> Result<Running, ApiError> {
    let hold_text = g.may_call_tools();
    let mut params = g.params;
    if chat {
        params.chat_template = state.chat_template.clone();
        params.stop.extend(state.chat_stops.iter().cloned());
    }
    let (permit, cancel, guard) = slot(state).await?;
    let (tx, events) = mpsc::unbounded_channel();
    let metrics: Arc<Metrics> = state.metrics.clone();
    let mut first = true;
    state.engine.submit(GenerateRequest {
        prompt: g.prompt,
        params,
        adapters: None,
        cancel,
        sink: Box::new(move |e| {
            match &e {
                Event::Token { .. } if first => {
                    first = false;
                    metrics.ttft.observe(start.elapsed());
                }
                Event::Done(c) => {
                    metrics.count_tokens(c.prompt_tokens, c.completion_tokens);
                    metrics.latency.observe(start.elapsed());
                }
                _ => {}
            }
            let _ = tx.send(e);
        }),
    })?;
    Ok(Running { events, permit, guard, hold_text })
}

impl Running {
    /// A streamed answer in `framing`. Waits for the first event, so a request that fails at
    /// once (a prompt too long for the context, ...) gets its HTTP status rather than a stream
    /// holding one error.
    async fn stream<F: Framing>(mut self, framing: F, content_type: &'static str) -> Result<Response<Body>, ApiError> {
        let first = self.events.recv().await.ok_or_else(ApiError::closed)?;
        if let Event::Error(e) = first {
            return Err(e.into());
        }
        let body = StreamBody::new(self.events, first, framing, self.hold_text, self.guard, self.permit);
        let mut r = Response::new(body.boxed());
        let h = r.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        Ok(r)
    }

    /// The finished completion; `on_token` sees each token arrive.
    async fn finish(mut self, mut on_token: impl FnMut()) -> Result<Completion, ApiError> {
        loop {
            match self.events.recv().await.ok_or_else(ApiError::closed)? {
                Event::Token { .. } => on_token(),
                Event::Step(_) => {}
                // Cancelled by `close` (a gone client reads nothing): not an answer.
                Event::Done(c) if c.finish_reason == FinishReason::Abort => return Err(ApiError::closing()),
                Event::Done(c) => return Ok(c),
                Event::Error(e) => return Err(e.into()),
            }
        }
    }
}

async fn generate(state: Arc<State>, req: Request<Incoming>, endpoint: Endpoint, start: Instant) -> Result<Response<Body>, ApiError> {
    let o = read_object(&state, req).await?;
    let g = match endpoint {
        Endpoint::Chat => openai::chat_request(&o, state.context)?,
        Endpoint::Completions => openai::completion_request(&o)?,
    };
    let (stream, include_usage) = (g.stream, g.include_usage);
    let running = submit(&state, g, endpoint == Endpoint::Chat, start).await?;
    if stream {
        let id = format!("{:016x}", rand_id());
        let writer = ChunkWriter { endpoint, id: openai::response_id(endpoint, &id), model: state.model.clone(), created: openai::now(), include_usage };
        return running.stream(Sse::new(writer), "text/event-stream").await;
    }
    let c = running.finish(|| {}).await?;
    Ok(json_response(200, &openai::completion_json(endpoint, &state.model, &c)))
}

/// `/api/generate` and `/api/chat`.
async fn ollama_generate(state: Arc<State>, req: Request<Incoming>, api: Api, start: Instant) -> Result<Response<Body>, ApiError> {
    let o = read_object(&state, req).await?;
    let r = match api {
        Api::Generate => ollama::generate_request(&o, state.context)?,
        Api::Chat => ollama::chat_request(&o, state.context)?,
    };
    let mut writer = OllamaWriter { api, model: state.model.clone(), clock: Clock::new(start) };
    if r.load_only {
        return Ok(json_response(200, &writer.loaded()));
    }
    let stream = r.body.stream;
    let running = submit(&state, r.body, !r.raw, start).await?;
    if stream {
        return running.stream(Ndjson(writer), "application/x-ndjson").await;
    }
    let c = running.finish(|| writer.clock.token()).await?;
    Ok(json_response(200, &writer.whole(&c)))
}

/// An id for a stream's chunks, which go out before the engine's completion id is known.
fn rand_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    h.finish()
}

/// Embeds `texts` once a slot is free; the vectors and the prompt tokens they took.
async fn embed(state: &State, texts: Vec<String>) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let mut prompt_tokens = 0;
    for t in &texts {
        prompt_tokens += state.engine.tokenize(t, true)?.len();
    }
    let (permit, cancel, guard) = slot(state).await?;
    let (tx, rx) = oneshot::channel();
    state.engine.submit_embed(EmbedRequest {
        texts,
        adapters: None,
        cancel,
        reply: Box::new(move |r| {
            let _ = tx.send(r);
        }),
    })?;
    let vectors = rx.await.map_err(|_| ApiError::closed())??;
    drop((guard, permit));
    Ok((vectors, prompt_tokens))
}

async fn embeddings(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let o = read_object(&state, req).await?;
    let e = openai::embeddings_request(&o, state.embedding_length)?;
    let (vectors, prompt_tokens) = embed(&state, e.texts).await?;
    Ok(json_response(200, &openai::embeddings_json(&state.model, &vectors, e.base64, prompt_tokens)))
}

async fn ollama_embed(state: Arc<State>, req: Request<Incoming>, start: Instant) -> Result<Response<Body>, ApiError> {
    let o = read_object(&state, req).await?;
    let e = ollama::embed_request(&o, state.embedding_length)?;
    let (vectors, prompt_tokens) = embed(&state, e.texts).await?;
    let total = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
    Ok(json_response(
        200,
        &json!({ "model": state.model, "embeddings": vectors, "total_duration": total, "load_duration": 0, "prompt_eval_count": prompt_tokens }),
    ))
}

async fn ollama_embeddings(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let o = read_object(&state, req).await?;
    let text = ollama::embeddings_request(&o)?;
    let (mut vectors, _) = embed(&state, vec![text]).await?;
    Ok(json_response(200, &json!({ "embedding": vectors.pop().unwrap_or_default() })))
}

/// The served model as `/api/tags` lists it.
fn tag(state: &State) -> Value {
    let f = &state.file;
    json!({
        "name": state.model, "model": state.model, "modified_at": ollama::rfc3339(f.modified), "size": f.size, "digest": f.digest,
        "details": ollama::details(state.engine.info()),
    })
}

/// `POST /api/show`: the model's details, its GGUF metadata as `model_info`, the chat template
/// (Jinja: what this server renders with, not a Go template) and the stops it adds.
async fn show(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let o = read_object(&state, req).await?;
    openai::check_model(&o)?;
    let verbose = openai::boolean(&o, "verbose")?;
    // The metadata is read again from the file (the loaded model keeps no vocabulary arrays):
    // off the HTTP threads.
    let engine = state.engine.clone();
    let metadata = tokio::task::spawn_blocking(move || engine.metadata_json()).await.map_err(|e| ApiError::internal(e.to_string()))??;
    let info = state.engine.info();
    let template =
        state.chat_template.clone().or_else(|| metadata.get("tokenizer.chat_template").and_then(Value::as_str).map(str::to_string)).unwrap_or_default();
    let license = metadata.get("general.license").and_then(Value::as_str).unwrap_or_default().to_string();
    let parameters: Vec<String> = state.chat_stops.iter().map(|s| format!("stop {}", json!(s))).collect();
    let mut model_info = ollama::model_info(metadata, verbose, 64);
    model_info["general.parameter_count"] = json!(info.parameter_count);
    let modelfile = format!("# Served by ruvllm\nFROM {}\n{}", info.path, parameters.iter().map(|p| format!("PARAMETER {p}\n")).collect::<String>());
    Ok(json_response(
        200,
        &json!({
            "license": license, "modelfile": modelfile, "parameters": parameters.join("\n"), "template": template, "system": "",
            "details": ollama::details(info), "model_info": model_info, "capabilities": ["completion", "tools"],
            "modified_at": ollama::rfc3339(state.file.modified),
        }),
    ))
}

/// `POST /tokenize` (llama-server's): `{ content, add_special?, with_pieces? }` → `{ tokens }`,
/// the ids, or `[{ id, piece }]` with `with_pieces`. Special-token text in `content` is read
/// as those tokens, as llama-server does.
async fn tokenize(state: &State, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let o = read_object(state, req).await?;
    let content = match openai::field(&o, "content") {
        Some(Value::String(s)) => s,
        Some(_) => return Err(ApiError::invalid("content", "'content' must be a string")),
        None => return Err(ApiError::invalid("content", "'content' is required")),
    };
    let ids = state.engine.tokenize(content, openai::boolean(&o, "add_special")?)?;
    let tokens: Value = if openai::boolean(&o, "with_pieces")? {
        ids.iter().map(|&id| Ok(json!({ "id": id, "piece": state.engine.detokenize(&[id])? }))).collect::<Result<_, ApiError>>()?
    } else {
        json!(ids)
    };
    Ok(json_response(200, &json!({ "tokens": tokens })))
}

/// `POST /detokenize`: `{ tokens }` → `{ content }`.
async fn detokenize(state: &State, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let o = read_object(state, req).await?;
    let bad = || ApiError::invalid("tokens", "'tokens' must be an array of token ids");
    let ids = match openai::field(&o, "tokens") {
        Some(Value::Array(a)) => a.iter().map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()).ok_or_else(bad)).collect::<Result<Vec<u32>, _>>()?,
        Some(_) => return Err(bad()),
        None => return Err(ApiError::invalid("tokens", "'tokens' is required")),
    };
    Ok(json_response(200, &json!({ "content": state.engine.detokenize(&ids)? })))
}

/// Opt-in CORS: which origins may read the answers.
pub struct Cors {
    /// `*`, or the origins allowed.
    origins: Vec<String>,
}

impl Cors {
    /// `spec`: `*` or comma-separated origins (`https://app.example`); `Err` says what is wrong.
    pub fn parse(spec: &str) -> Result<Cors, String> {
        let origins: Vec<String> = spec.split(',').map(|s| s.trim().trim_end_matches('/').to_string()).filter(|s| !s.is_empty()).collect();
        if origins.is_empty() {
            return Err("cors must be '*' or one or more origins such as https://app.example".into());
        }
        for o in &origins {
            let host = o.strip_prefix("http://").or_else(|| o.strip_prefix("https://"));
            let ok = o == "*" || host.is_some_and(|h| !h.is_empty() && !h.contains('/')) && HeaderValue::from_str(o).is_ok();
            if !ok {
                return Err(format!("cors: '{o}' is not an origin (scheme://host[:port]) or '*'"));
            }
        }
        Ok(Cors { origins })
    }

    /// The `Access-Control-Allow-Origin` value for a request from `origin` (`None`: not allowed).
    fn allowed(&self, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
        if self.origins.iter().any(|o| o == "*") {
            return Some(HeaderValue::from_static("*"));
        }
        let origin = origin?;
        self.origins.iter().any(|o| o.as_bytes() == origin.as_bytes()).then(|| origin.clone())
    }

    /// Adds the CORS headers to an answer.
    fn allow(&self, h: &mut HeaderMap, origin: Option<&HeaderValue>) {
        if let Some(v) = self.allowed(origin) {
            if v != "*" {
                // The answer differs by origin: caches must key on it.
                h.append("vary", HeaderValue::from_static("Origin"));
            }
            h.insert("access-control-allow-origin", v);
        }
    }

    /// The answer to a preflight (`OPTIONS`): the methods, and the headers the browser asked
    /// for (it asks for `authorization` and `content-type`).
    fn preflight(&self, req: &HeaderMap) -> Response<Body> {
        let mut r = response(204, "text/plain", Bytes::new());
        let h = r.headers_mut();
        h.insert("access-control-allow-methods", HeaderValue::from_static("GET, POST, HEAD, OPTIONS"));
        let asked = req.get("access-control-request-headers").cloned().unwrap_or_else(|| HeaderValue::from_static("authorization, content-type"));
        h.insert("access-control-allow-headers", asked);
        h.insert("access-control-max-age", HeaderValue::from_static("600"));
        r
    }
}

/// Size, modification time and an identity of the served file, for `/api/tags`.
pub struct ModelFile {
    pub size: u64,
    pub modified: SystemTime,
    /// SHA-256 of the path, size and modification time: names this version of the file without
    /// reading it (hashing a multi-gigabyte model would stall the start).
    pub digest: String,
}

impl ModelFile {
    pub fn stat(path: &str) -> ModelFile {
        use sha2::{Digest, Sha256};
        let meta = std::fs::metadata(path).ok();
        let size = meta.as_ref().map_or(0, |m| m.len());
        let modified = meta.and_then(|m| m.modified().ok()).unwrap_or(SystemTime::UNIX_EPOCH);
        let stamp = modified.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let digest = Sha256::digest(format!("{path}\n{size}\n{stamp}").as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        ModelFile { size, modified, digest }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cors_origins() {
        assert!(Cors::parse("").is_err());
        assert!(Cors::parse("example.com").is_err());
        assert!(Cors::parse("https://a.example/path").is_err());
        assert!(Cors::parse("http://").is_err());
        let any = Cors::parse("*").expect("valid");
        assert_eq!(any.allowed(None), Some(HeaderValue::from_static("*")));
        let some = Cors::parse("https://a.example, http://localhost:3000/").expect("valid");
        let local = HeaderValue::from_static("http://localhost:3000");
        assert_eq!(some.allowed(Some(&local)), Some(local.clone()));
        assert_eq!(some.allowed(Some(&HeaderValue::from_static("https://evil.example"))), None);
        let mut h = HeaderMap::new();
        some.allow(&mut h, Some(&local));
        assert_eq!((h.get("access-control-allow-origin"), h.get("vary")), (Some(&local), Some(&HeaderValue::from_static("Origin"))));
    }

    #[test]
    fn paths() {
        assert_eq!((route_path("/"), route_path(""), route_path("/api/chat/")), ("/", "/", "/api/chat"));
    }
}
