//! Ollama's wire format (`/api/generate`, `/api/chat`, `/api/embed`, `/api/show`, ...): request
//! bodies read into the same engine requests the OpenAI endpoints build — the shared sampling
//! and structured-output readers of [`crate::openai`] do the validating, this file only renames
//! Ollama's keys — and completions written back as Ollama's JSON objects and NDJSON chunks.
//! Pure functions, tested without a socket or a model.
//!
//! What differs from Ollama on purpose:
//! - One model is served: any `model` name reaches it (as on the OpenAI endpoints).
//! - The sampling defaults are this server's (those of the OpenAI endpoints and `llm.generate`),
//!   not Ollama's, so one request gives one answer whatever surface it came through.
//! - `keep_alive` is accepted and has no effect: the model stays loaded for the server's life.
//! - `context` (the deprecated token memory of `/api/generate`) is refused and not returned:
//!   send the conversation as `/api/chat` messages.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use ruvllm_core::chat::ChatMessage;
use ruvllm_core::engine::{Completion, FinishReason, GenerateParams, ModelInfo, Prompt, TokenLogprob, TokenProb};
use ruvllm_core::structured::{Constraint, ToolCall};
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::openai::{self, field, GenerationBody};
use crate::stream::Framing;

/// The Ollama release whose API shapes these endpoints follow, as `/api/version` reports it:
/// clients gate features (tools, structured outputs) on it.
pub const OLLAMA_VERSION: &str = "0.12.0";

/// Which generation endpoint: it decides the response's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Generate,
    Chat,
}

/// A read `/api/generate` or `/api/chat` request.
#[derive(Debug)]
pub struct OllamaRequest {
    pub body: GenerationBody,
    /// `/api/generate` with `raw: true`: the prompt goes to the model as written, without the
    /// chat template or its stop strings.
    pub raw: bool,
    /// No prompt (or no messages): Ollama's way to load a model; answered at once.
    pub load_only: bool,
}

/// Ollama options that set how a model is loaded (context size, threads, GPU layers, batch,
/// memory mapping) or how a context shifts. Ollama applies them only when it (re)loads a
/// model; this server loads its one model at start (`--context-size`, `--threads`, `--gpu`),
/// so they are accepted and have no effect. Clients send them routinely (`num_ctx` above all),
/// and refusing them would break those clients for settings that do not change the text.
/// `penalize_newline` is here too: Ollama itself no longer honours it.
const LOAD_OPTIONS: &[&str] = &[
    "numa",
    "num_ctx",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "low_vram",
    "f16_kv",
    "logits_all",
    "vocab_only",
    "use_mmap",
    "use_mlock",
    "embedding_only",
    "num_thread",
    "num_keep",
    "penalize_newline",
];

/// Sampling options this server does not implement, with the value that leaves them off:
/// with any other value the answer would silently differ from what was asked, so they are
/// refused (400 `ERR_UNSUPPORTED`), as the OpenAI endpoints refuse `n` > 1.
const OFF_OPTIONS: &[(&str, f64)] = &[("mirostat", 0.0), ("tfs_z", 1.0), ("typical_p", 1.0)];
/// Mirostat's settings: inert while `mirostat` is 0 (the only value accepted), so any value passes.
const INERT_OPTIONS: &[&str] = &["mirostat_tau", "mirostat_eta"];
/// Options mapped onto the engine's parameters.
const MAPPED_OPTIONS: &[&str] =
    &["num_predict", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty", "seed", "stop"];
/// Ollama takes any number of stop strings; this bounds the work each token's check does.
const MAX_STOPS: usize = 16;

/// `options` onto `params`. `context` is the model's context length (`num_predict` -1 or -2,
/// and `repeat_last_n` -1, mean "up to the context"). An option Ollama does not define is
/// refused: its options are a closed set, and a misspelt one would otherwise do nothing.
pub fn apply_options(options: Option<&Value>, params: &mut GenerateParams, context: usize) -> Result<(), ApiError> {
    let Some(o) = options else { return Ok(()) };
    let o = o.as_object().ok_or_else(|| ApiError::invalid("options", "'options' must be an object"))?;
    for (key, v) in o {
        let param = format!("options.{key}");
        if let Some((_, off)) = OFF_OPTIONS.iter().find(|(k, _)| k == key) {
            match v.as_f64() {
                Some(x) if x == *off => {}
                Some(_) => return Err(ApiError::unsupported(&param, format!("'{param}' is not supported (only {off}, which leaves it off)"))),
                None if v.is_null() => {}
                None => return Err(ApiError::invalid(&param, format!("'{param}' must be a number"))),
            }
        } else if !LOAD_OPTIONS.contains(&key.as_str()) && !INERT_OPTIONS.contains(&key.as_str()) && !MAPPED_OPTIONS.contains(&key.as_str()) {
            return Err(ApiError::invalid(&param, format!("unknown option '{key}'")));
        }
    }
    openai::sampling(o, "options.", &mut params.sampling)?;
    params.stop = openai::stops(o, "options.", MAX_STOPS)?;
    if let Some(n) = openai::integer_in(o, "options.", "num_predict", -2)? {
        if n == 0 {
            return Err(ApiError::invalid("options.num_predict", "'options.num_predict' must be at least 1, or -1 (until the context is full)"));
        }
        params.max_tokens = if n < 0 { context } else { usize::try_from(n).unwrap_or(usize::MAX) };
    }
    if let Some(p) = openai::number_in(o, "options.", "repeat_penalty", 0.0, 100.0)? {
        params.sampling.repeat_penalty = p as f32;
    }
    if let Some(n) = openai::integer_in(o, "options.", "repeat_last_n", -1)? {
        params.sampling.repeat_last_n = if n < 0 { context } else { usize::try_from(n).unwrap_or(usize::MAX) };
    }
    Ok(())
}

/// A field that must be absent, empty or `false` here, with why.
fn refuse_if_set(o: &Map<String, Value>, name: &str, why: &str) -> Result<(), ApiError> {
    let set = match field(o, name) {
        None | Some(Value::Bool(false)) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    };
    if set {
        return Err(ApiError::unsupported(name, format!("'{name}' is not supported: {why}")));
    }
    Ok(())
}

/// `keep_alive`: a duration string ("5m") or a number of seconds; accepted, no effect.
fn keep_alive(o: &Map<String, Value>) -> Result<(), ApiError> {
    match field(o, "keep_alive") {
        None | Some(Value::String(_)) | Some(Value::Number(_)) => Ok(()),
        Some(_) => Err(ApiError::invalid("keep_alive", "'keep_alive' must be a duration string or a number of seconds")),
    }
}

/// `format`: `"json"` (any JSON value the model writes as an object) or a JSON schema.
fn format(o: &Map<String, Value>) -> Result<Option<Constraint>, ApiError> {
    match field(o, "format") {
        None => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(Constraint::JsonObject)),
        Some(v @ (Value::Object(_) | Value::Bool(_))) => Ok(Some(Constraint::JsonSchema(v.clone()))),
        Some(_) => Err(ApiError::invalid("format", "'format' must be \"json\" or a JSON schema (an object)")),
    }
}

/// What `/api/generate` and `/api/chat` share; `context` is the model's context length, the
/// default token budget (Ollama's `num_predict` defaults to -1: until the context is full).
fn common(o: &Map<String, Value>, context: usize) -> Result<(GenerateParams, bool), ApiError> {
    openai::check_model(o)?;
    keep_alive(o)?;
    refuse_if_set(o, "think", "this model does not think")?;
    let mut params = GenerateParams { max_tokens: context, ..GenerateParams::default() };
    apply_options(field(o, "options"), &mut params, context)?;
    params.constraint = format(o)?;
    params.logprobs = openai::chat_logprobs(o)?;
    // Ollama streams unless told not to.
    let stream = openai::flag(o, "stream")?.unwrap_or(true);
    Ok((params, stream))
}

fn text_field(o: &Map<String, Value>, name: &str) -> Result<Option<String>, ApiError> {
    match field(o, name) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::invalid(name, format!("'{name}' must be a string"))),
    }
}

/// `POST /api/generate`: `prompt` (with `system`) through the chat template as one user turn,
/// or as written with `raw: true`.
pub fn generate_request(o: &Map<String, Value>, context: usize) -> Result<OllamaRequest, ApiError> {
    let (params, stream) = common(o, context)?;
    refuse_if_set(o, "suffix", "fill-in-the-middle is not implemented")?;
    refuse_if_set(o, "images", "this server runs text models only")?;
    refuse_if_set(o, "template", "Ollama's Go templates are not run here; start the server with --chat-template instead")?;
    refuse_if_set(o, "context", "send the conversation as /api/chat messages instead")?;
    let raw = openai::boolean(o, "raw")?;
    let prompt = text_field(o, "prompt")?.unwrap_or_default();
    let system = text_field(o, "system")?;
    if raw && system.is_some() {
        return Err(ApiError::invalid("system", "'system' has no place in a 'raw' prompt: write it into the prompt"));
    }
    let load_only = prompt.is_empty();
    let prompt = if raw {
        Prompt::Text(prompt)
    } else {
        let mut m: Vec<ChatMessage> = system.map(|s| ChatMessage::new("system", s)).into_iter().collect();
        m.push(ChatMessage::new("user", prompt));
        Prompt::Chat(m)
    };
    Ok(OllamaRequest { body: GenerationBody { prompt, params, stream, include_usage: false }, raw, load_only })
}

/// A chat message's `tool_calls`: Ollama's `[{ function: { name, arguments: {...} } }]`.
fn message_tool_calls(v: &Value, at: &str) -> Result<Vec<ToolCall>, ApiError> {
    let calls = v.as_array().ok_or_else(|| ApiError::invalid(at, format!("'{at}' must be an array")))?;
    calls
        .iter()
        .map(|c| {
            let f = c.get("function");
            let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
            match (name, f.and_then(|f| f.get("arguments"))) {
                (Some(name), Some(args @ Value::Object(_))) => Ok(ToolCall {
                    id: c.get("id").and_then(Value::as_str).unwrap_or_default().to_string(),
                    name: name.to_string(),
                    arguments: args.to_string(),
                }),
                _ => Err(ApiError::invalid(at, "a tool call must be { function: { name, arguments: { ... } } }")),
            }
        })
        .collect()
}

fn chat_messages(o: &Map<String, Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let list = match field(o, "messages") {
        None => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::invalid("messages", "'messages' must be an array")),
    };
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let (param, m, role) = openai::message(i, m)?;
            let content = match m.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(_) => return Err(ApiError::invalid(&format!("{param}.content"), "'content' must be a string")),
            };
            refuse_if_set(m, "images", "this server runs text models only").map_err(|e| ApiError { param: Some(format!("{param}.images")), ..e })?;
            let mut msg = ChatMessage::new(role, content);
            if let Some(calls) = field(m, "tool_calls") {
                msg.tool_calls = message_tool_calls(calls, &format!("{param}.tool_calls"))?;
            }
            msg.name = m.get("tool_name").and_then(Value::as_str).map(str::to_string);
            Ok(msg)
        })
        .collect()
}

/// `POST /api/chat`. Tools use OpenAI's shape in Ollama too (`{ type: 'function', function }`);
/// the model picks whether to call one (Ollama has no `tool_choice`; OpenAI's is read if sent).
pub fn chat_request(o: &Map<String, Value>, context: usize) -> Result<OllamaRequest, ApiError> {
    let (mut params, stream) = common(o, context)?;
    let (tools, choice) = openai::tools(o)?;
    params.tools = tools;
    params.tool_choice = choice;
    let messages = chat_messages(o)?;
    let load_only = messages.is_empty();
    Ok(OllamaRequest { body: GenerationBody { prompt: Prompt::Chat(messages), params, stream, include_usage: false }, raw: false, load_only })
}

/// A read `/api/embed` request.
#[derive(Debug)]
pub struct EmbedBody {
    pub texts: Vec<String>,
}

/// `POST /api/embed`: `input` a string or strings. `truncate` is accepted, but an input longer
/// than the context is refused (`ERR_CONTEXT_OVERFLOW`) rather than cut: a vector of part of a
/// text would pass for the whole one.
pub fn embed_request(o: &Map<String, Value>, dim: usize) -> Result<EmbedBody, ApiError> {
    openai::check_model(o)?;
    keep_alive(o)?;
    openai::flag(o, "truncate")?;
    if let Some(opts) = field(o, "options") {
        apply_options(Some(opts), &mut GenerateParams::default(), 1)?;
    }
    if let Some(d) = openai::integer(o, "dimensions", 1)? {
        if d as u64 != dim as u64 {
            return Err(ApiError::unsupported("dimensions", format!("this model's embeddings have {dim} dimensions; 'dimensions' cannot change that")));
        }
    }
    Ok(EmbedBody { texts: openai::embed_inputs(o)? })
}

/// `POST /api/embeddings` (Ollama's older endpoint): one `prompt`.
pub fn embeddings_request(o: &Map<String, Value>) -> Result<String, ApiError> {
    openai::check_model(o)?;
    keep_alive(o)?;
    text_field(o, "prompt")?.ok_or_else(|| ApiError::invalid("prompt", "'prompt' is required"))
}

/// Nanoseconds, as Ollama reports durations.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `t` as RFC 3339 in UTC with nanoseconds (`2024-05-01T12:00:00.123456789Z`), as Ollama writes
/// `created_at` and `modified_at`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let (year, month, day) = ruvllm_core::chat::civil_from_days(days);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z", rem / 3600, rem / 60 % 60, rem % 60, d.subsec_nanos())
}

/// A generation's clock: when the request arrived and when its first token came.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    pub start: Instant,
    pub first_token: Option<Instant>,
}

impl Clock {
    pub fn new(start: Instant) -> Clock {
        Clock { start, first_token: None }
    }

    pub fn token(&mut self) {
        self.first_token.get_or_insert_with(Instant::now);
    }
}

/// The statistics of a finished generation: counts, and durations in nanoseconds. The prompt's
/// evaluation is the engine's time to the first token; generation is the time from the first
/// token to the end. Nothing is loaded per request, so `load_duration` is 0.
fn stats(c: &Completion, clock: &Clock) -> Map<String, Value> {
    let end = Instant::now();
    let eval = clock.first_token.map_or(Duration::ZERO, |t| end.saturating_duration_since(t));
    let v = json!({
        "total_duration": nanos(end.saturating_duration_since(clock.start)),
        "load_duration": 0,
        "prompt_eval_count": c.prompt_tokens,
        "prompt_eval_duration": nanos(Duration::from_secs_f64(c.ttft_ms.max(0.0) / 1000.0)),
        "eval_count": c.completion_tokens,
        "eval_duration": nanos(eval),
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn done_reason(c: &Completion) -> &'static str {
    match c.finish_reason {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Abort => "stop",
    }
}

/// Tool calls as Ollama gives them: the arguments an object, not JSON text.
fn tool_calls_json(calls: &[ToolCall]) -> Value {
    calls
        .iter()
        .map(|c| {
            let arguments = serde_json::from_str::<Value>(&c.arguments).unwrap_or_else(|_| Value::String(c.arguments.clone()));
            json!({ "function": { "name": c.name, "arguments": arguments } })
        })
        .collect()
}

fn prob_json(t: &TokenProb) -> Value {
    json!({ "token": t.text, "logprob": openai::logprob_value(t.logprob), "bytes": t.bytes })
}

/// `logprobs`: `[{ token, logprob, bytes, top_logprobs: [{ token, logprob, bytes }] }]`.
fn logprobs_json(l: &[TokenLogprob]) -> Value {
    l.iter()
        .map(|t| {
            let mut v = prob_json(&t.token);
            v["top_logprobs"] = t.top.iter().map(prob_json).collect();
            v
        })
        .collect()
}

/// The assistant message of `/api/chat`.
fn message(text: &str, calls: &[ToolCall]) -> Value {
    let mut m = json!({ "role": "assistant", "content": text });
    if !calls.is_empty() {
        m["tool_calls"] = tool_calls_json(calls);
    }
    m
}

/// Writes one response's objects (the whole answer, or its NDJSON chunks).
pub struct OllamaWriter {
    pub api: Api,
    pub model: String,
    pub clock: Clock,
}

impl OllamaWriter {
    fn head(&self, text: &str, calls: &[ToolCall], done: bool) -> Value {
        let mut v = json!({ "model": self.model, "created_at": rfc3339(SystemTime::now()) });
        match self.api {
            Api::Generate => v["response"] = json!(text),
            Api::Chat => v["message"] = message(text, calls),
        }
        v["done"] = json!(done);
        v
    }

    /// A piece of text (`done: false`), with its tokens' log-probabilities when asked for.
    pub fn chunk(&self, text: &str, calls: &[ToolCall], logprobs: Option<&[TokenLogprob]>) -> Value {
        let mut v = self.head(text, calls, false);
        if let Some(l) = logprobs {
            v["logprobs"] = logprobs_json(l);
        }
        v
    }

    /// The last object: `done: true`, why, and the statistics; `text` is all of it for a
    /// whole answer, empty for a stream's last chunk.
    pub fn done(&self, c: &Completion, text: &str, calls: &[ToolCall], logprobs: Option<&[TokenLogprob]>) -> Value {
        let mut v = self.head(text, calls, true);
        v["done_reason"] = json!(done_reason(c));
        if let (Value::Object(m), stats) = (&mut v, stats(c, &self.clock)) {
            m.extend(stats);
        }
        if let Some(l) = logprobs {
            v["logprobs"] = logprobs_json(l);
        }
        v
    }

    /// The whole (non-streamed) answer.
    pub fn whole(&self, c: &Completion) -> Value {
        self.done(c, &c.text, &c.tool_calls, c.logprobs.as_deref())
    }

    /// The answer to a request without a prompt: Ollama's "the model is loaded".
    pub fn loaded(&self) -> Value {
        let mut v = self.head("", &[], true);
        v["done_reason"] = json!("load");
        v
    }
}

fn line(v: &Value) -> Bytes {
    Bytes::from(format!("{v}\n"))
}

/// Ollama's streams: one JSON object per line.
pub struct Ndjson(pub OllamaWriter);

impl Framing for Ndjson {
    fn token(&mut self, text: &str, logprob: Option<&TokenLogprob>) -> Bytes {
        self.0.clock.token();
        line(&self.0.chunk(text, &[], logprob.map(std::slice::from_ref)))
    }

    fn finish(&mut self, c: &Completion, held: bool) -> Vec<Bytes> {
        let mut out = Vec::new();
        if held && (!c.text.is_empty() || !c.tool_calls.is_empty()) {
            out.push(line(&self.0.chunk(&c.text, &c.tool_calls, c.logprobs.as_deref())));
        }
        out.push(line(&self.0.done(c, "", &[], None)));
        out
    }

    fn error(&mut self, e: &ApiError) -> Bytes {
        line(&e.to_ollama_json())
    }
}

/// `details` of `/api/tags` and `/api/show`.
pub fn details(info: &ModelInfo) -> Value {
    json!({
        "parent_model": "", "format": "gguf", "family": info.architecture, "families": [info.architecture],
        "parameter_size": parameter_size(info.parameter_count), "quantization_level": info.quantization,
    })
}

/// A parameter count as Ollama shows it: `268.10M`, `7.2B`.
fn parameter_size(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.1}B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.2}M", n / 1e6)
    } else {
        format!("{:.2}K", n / 1e3)
    }
}

/// The GGUF metadata as `/api/show`'s `model_info`; without `verbose`, arrays longer than
/// `max_array` (a vocabulary's tokens, scores and merges) are given as `[]`, as Ollama does.
pub fn model_info(mut metadata: Value, verbose: bool, max_array: usize) -> Value {
    if let (false, Value::Object(m)) = (verbose, &mut metadata) {
        for v in m.values_mut() {
            if v.as_array().is_some_and(|a| a.len() > max_array) {
                *v = json!([]);
            }
        }
    }
    metadata
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::tests::obj;

    #[test]
    fn options_map_to_params() {
        let r = chat_request(
            &obj(json!({
                "model": "gemma3", "messages": [{ "role": "user", "content": "hi" }], "keep_alive": "5m", "format": "json",
                "options": {
                    "num_predict": 9, "temperature": 0, "top_k": 3, "top_p": 0.5, "min_p": 0.1, "repeat_penalty": 1.2, "repeat_last_n": -1,
                    "presence_penalty": 0.5, "frequency_penalty": -0.5, "seed": 42, "stop": ["a", "b"],
                    "num_ctx": 8192, "num_thread": 4, "mirostat": 0, "tfs_z": 1.0, "mirostat_eta": 0.3,
                },
            })),
            1024,
        )
        .expect("valid request");
        let p = &r.body.params;
        assert_eq!(p.max_tokens, 9);
        let s = &p.sampling;
        assert_eq!((s.temperature, s.top_k, s.top_p, s.min_p), (0.0, 3, 0.5, 0.1));
        assert_eq!((s.repeat_penalty, s.repeat_last_n, s.presence_penalty, s.frequency_penalty, s.seed), (1.2, 1024, 0.5, -0.5, 42));
        assert_eq!(p.stop, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(p.constraint, Some(Constraint::JsonObject));
        assert!(r.body.stream, "Ollama streams by default");
        assert!(!r.load_only);

        // No options: the whole context is the budget; `stream: false` is honoured.
        let r = generate_request(&obj(json!({ "prompt": "x", "stream": false, "options": { "num_predict": -2 } })), 512).expect("valid");
        assert_eq!((r.body.params.max_tokens, r.body.stream), (512, false));
        let schema = json!({ "type": "object", "properties": { "a": { "type": "integer" } } });
        let r = generate_request(&obj(json!({ "prompt": "x", "format": schema })), 512).expect("valid");
        assert_eq!(r.body.params.constraint, Some(Constraint::JsonSchema(schema)));
    }

    #[test]
    fn bad_and_unsupported_fields_name_the_param() {
        let cases = [
            (json!({ "prompt": "x", "options": { "temperature": "hot" } }), "options.temperature", "ERR_INVALID_ARG"),
            (json!({ "prompt": "x", "options": { "top_p": 3 } }), "options.top_p", "ERR_INVALID_ARG"),
            (json!({ "prompt": "x", "options": { "num_predict": 0 } }), "options.num_predict", "ERR_INVALID_ARG"),
            (json!({ "prompt": "x", "options": { "stop": [""] } }), "options.stop", "ERR_INVALID_ARG"),
            (json!({ "prompt": "x", "options": { "temprature": 1 } }), "options.temprature", "ERR_INVALID_ARG"),
            (json!({ "prompt": "x", "options": { "mirostat": 2 } }), "options.mirostat", "ERR_UNSUPPORTED"),
            (json!({ "prompt": "x", "options": { "typical_p": 0.5 } }), "options.typical_p", "ERR_UNSUPPORTED"),
            (json!({ "prompt": "x", "options": [] }), "options", "ERR_INVALID_ARG"),
            (json!({ "prompt": 5 }), "prompt", "ERR_INVALID_ARG"),
            (json!({ "prompt": "x", "format": "yaml" }), "format", "ERR_INVALID_ARG"),
            (json!({ "prompt": "x", "stream": "yes" }), "stream", "ERR_INVALID_ARG"),
            (json!({ "prompt": "x", "keep_alive": [] }), "keep_alive", "ERR_INVALID_ARG"),
            (json!({ "prompt": "x", "model": 3 }), "model", "ERR_INVALID_ARG"),
            (json!({ "prompt": "x", "think": true }), "think", "ERR_UNSUPPORTED"),
            (json!({ "prompt": "x", "images": ["aGk="] }), "images", "ERR_UNSUPPORTED"),
            (json!({ "prompt": "x", "context": [1, 2] }), "context", "ERR_UNSUPPORTED"),
            (json!({ "prompt": "x", "suffix": "y" }), "suffix", "ERR_UNSUPPORTED"),
            (json!({ "prompt": "x", "raw": true, "system": "s" }), "system", "ERR_INVALID_ARG"),
        ];
        for (body, param, code) in cases {
            let e = generate_request(&obj(body.clone()), 512).expect_err("invalid request");
            assert_eq!((e.status, e.param.as_deref(), e.code), (400, Some(param), code), "{body}");
            assert_eq!(e.to_ollama_json()["code"], code);
            assert!(e.to_ollama_json()["error"].as_str().is_some_and(|m| !m.is_empty()));
        }
        let chat_cases = [
            (json!({ "messages": "hi" }), "messages"),
            (json!({ "messages": [{ "role": "wizard", "content": "x" }] }), "messages[0].role"),
            (json!({ "messages": [{ "role": "user", "content": 1 }] }), "messages[0].content"),
            (json!({ "messages": [{ "role": "user", "content": "x", "images": ["aGk="] }] }), "messages[0].images"),
            (json!({ "messages": [{ "role": "assistant", "tool_calls": [{ "function": { "name": "f", "arguments": "{}" } }] }] }), "messages[0].tool_calls"),
            (json!({ "messages": [{ "role": "user", "content": "x" }], "tools": [{ "type": "function" }] }), "tools[0]"),
        ];
        for (body, param) in chat_cases {
            let e = chat_request(&obj(body.clone()), 512).expect_err("invalid request");
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{body}");
        }
    }

    #[test]
    fn prompts_system_raw_and_tool_history() {
        let r = generate_request(&obj(json!({ "prompt": "hello", "system": "be brief" })), 512).expect("valid");
        match r.body.prompt {
            Prompt::Chat(m) => assert_eq!(m, vec![ChatMessage::new("system", "be brief"), ChatMessage::new("user", "hello")]),
            other => panic!("not a chat prompt: {other:?}"),
        }
        let r = generate_request(&obj(json!({ "prompt": "hello", "raw": true })), 512).expect("valid");
        assert!(r.raw && matches!(r.body.prompt, Prompt::Text(ref t) if t == "hello"));
        assert!(generate_request(&obj(json!({ "model": "m" })), 512).expect("valid").load_only);
        assert!(chat_request(&obj(json!({ "model": "m", "messages": [] })), 512).expect("valid").load_only);

        let r = chat_request(
            &obj(json!({ "messages": [
                { "role": "user", "content": "weather?" },
                { "role": "assistant", "content": "", "tool_calls": [{ "function": { "name": "w", "arguments": { "city": "Paris" } } }] },
                { "role": "tool", "tool_name": "w", "content": "sunny" },
            ], "tools": [{ "type": "function", "function": { "name": "w", "parameters": { "type": "object" } } }] })),
            512,
        )
        .expect("valid");
        assert!(r.body.may_call_tools());
        let Prompt::Chat(m) = r.body.prompt else { panic!("not a chat prompt") };
        assert_eq!(m[1].tool_calls, vec![ToolCall { id: String::new(), name: "w".into(), arguments: r#"{"city":"Paris"}"#.into() }]);
        assert_eq!((m[2].role.as_str(), m[2].name.as_deref(), m[2].content.as_str()), ("tool", Some("w"), "sunny"));
    }

    #[test]
    fn embed_inputs() {
        assert_eq!(embed_request(&obj(json!({ "model": "m", "input": "a" })), 8).expect("valid").texts, vec!["a".to_string()]);
        assert_eq!(embed_request(&obj(json!({ "input": ["a", "b"], "truncate": true })), 8).expect("valid").texts.len(), 2);
        assert_eq!(embed_request(&obj(json!({ "input": [] })), 8).map(|_| ()).map_err(|e| e.param), Err(Some("input".into())));
        assert_eq!(embed_request(&obj(json!({ "input": "a", "dimensions": 4 })), 8).map(|_| ()).map_err(|e| e.code), Err("ERR_UNSUPPORTED"));
        assert_eq!(embeddings_request(&obj(json!({ "prompt": "a" }))).ok(), Some("a".to_string()));
    }

    fn completion(text: &str, calls: Vec<ToolCall>, reason: FinishReason) -> Completion {
        Completion {
            id: "cmpl-1".into(),
            text: text.into(),
            tokens: vec![1, 2],
            prompt_ids: vec![5, 6, 7],
            finish_reason: reason,
            prompt_tokens: 3,
            cached_tokens: 0,
            completion_tokens: 2,
            ttft_ms: 12.5,
            prefill_tokens_per_second: 0.0,
            decode_tokens_per_second: 0.0,
            diffusion: None,
            adapters_used: None,
            tool_calls: calls,
            logprobs: None,
        }
    }

    #[test]
    fn response_shapes() {
        let mut clock = Clock::new(Instant::now());
        clock.token();
        let w = OllamaWriter { api: Api::Generate, model: "gemma".into(), clock };
        let v = w.whole(&completion("Paris", vec![], FinishReason::Length));
        assert_eq!(
            (v["model"].as_str(), v["response"].as_str(), v["done"].as_bool(), v["done_reason"].as_str()),
            (Some("gemma"), Some("Paris"), Some(true), Some("length"))
        );
        assert_eq!((v["prompt_eval_count"].as_u64(), v["eval_count"].as_u64(), v["load_duration"].as_u64()), (Some(3), Some(2), Some(0)));
        assert_eq!(v["prompt_eval_duration"].as_u64(), Some(12_500_000));
        assert!(v["total_duration"].as_u64() >= v["eval_duration"].as_u64());
        assert!(v["created_at"].as_str().is_some_and(|t| t.len() == 30 && t.ends_with('Z')), "{v}");

        let w = OllamaWriter { api: Api::Chat, model: "gemma".into(), clock };
        let call = ToolCall { id: "call_1".into(), name: "w".into(), arguments: r#"{"city":"Paris"}"#.into() };
        let v = w.whole(&completion("", vec![call], FinishReason::Stop));
        assert_eq!(
            v["message"],
            json!({ "role": "assistant", "content": "", "tool_calls": [{ "function": { "name": "w", "arguments": { "city": "Paris" } } }] })
        );
        assert_eq!(v["done_reason"], "stop");
        let mut chunk = w.chunk("Hi", &[], None);
        assert!(chunk.as_object_mut().and_then(|m| m.remove("created_at")).is_some());
        assert_eq!(chunk, json!({ "model": "gemma", "message": { "role": "assistant", "content": "Hi" }, "done": false }));
        assert_eq!(w.loaded()["done_reason"], "load");
    }

    #[test]
    fn dates_and_sizes() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::new(951_827_696, 5)), "2000-02-29T12:34:56.000000005Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(4_107_542_400)), "2100-03-01T00:00:00.000000000Z");
        assert_eq!(parameter_size(268_098_176), "268.10M");
        assert_eq!(parameter_size(7_241_732_096), "7.2B");
        let m = model_info(json!({ "general.architecture": "gemma3", "tokenizer.ggml.tokens": ["a", "b", "c"], "x.small": [1] }), false, 2);
        assert_eq!(m, json!({ "general.architecture": "gemma3", "tokenizer.ggml.tokens": [], "x.small": [1] }));
    }
}
