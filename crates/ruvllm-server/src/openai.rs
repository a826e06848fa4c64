//! The OpenAI wire format: request bodies read into engine requests (every bad field a 400
//! naming it), completions written back as OpenAI's JSON objects and stream chunks. Pure
//! functions, so they are tested without a socket or a model.

use ruvllm_core::chat::ChatMessage;
use ruvllm_core::engine::{Completion, FinishReason, GenerateParams, Prompt, TokenLogprob, TokenProb, MAX_TOP_LOGPROBS};
use ruvllm_core::sampling::SamplingParams;
use ruvllm_core::structured::{Constraint, Tool, ToolCall, ToolChoice};
use serde_json::{json, Map, Value};

use crate::error::ApiError;

/// The most stop strings a request may give (OpenAI's limit).
const MAX_STOPS: usize = 4;
/// The most texts one embeddings request may carry (OpenAI's limit).
pub const MAX_EMBED_INPUTS: usize = 2048;
/// `max_tokens` of a legacy completion that gives none (OpenAI's default for that endpoint).
const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

/// Which endpoint a generation came through: it decides the response's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

/// A generation request read from a body.
#[derive(Debug)]
pub struct GenerationBody {
    pub prompt: Prompt,
    pub params: GenerateParams,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk carries `usage`.
    pub include_usage: bool,
}

impl GenerationBody {
    /// Whether the model may answer with tool calls, which are only known once the completion
    /// is done: such a stream sends its text at the end instead of token by token, so that the
    /// text of a call never reaches the client as content.
    pub fn may_call_tools(&self) -> bool {
        !self.params.tools.is_empty() && self.params.tool_choice != ToolChoice::None
    }
}

/// The body as a JSON object (400 otherwise).
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::new(400, "invalid_request_error", "ERR_INVALID_JSON", format!("the request body is not valid JSON: {e}")))?;
    match v {
        Value::Object(m) => Ok(m),
        _ => Err(ApiError::new(400, "invalid_request_error", "ERR_INVALID_JSON", "the request body must be a JSON object")),
    }
}

/// A field that is absent or `null` reads as `None`.
pub(crate) fn field<'a>(o: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    o.get(name).filter(|v| !v.is_null())
}

/// `o[name]` as a number in `min..=max`; errors name it `prefix` + `name` (the object's place
/// in the body: `options.` for Ollama's options).
pub(crate) fn number_in(o: &Map<String, Value>, prefix: &str, name: &str, min: f64, max: f64) -> Result<Option<f64>, ApiError> {
    let Some(v) = field(o, name) else { return Ok(None) };
    let p = format!("{prefix}{name}");
    let x = v.as_f64().ok_or_else(|| ApiError::invalid(&p, format!("'{p}' must be a number")))?;
    if !(min..=max).contains(&x) {
        return Err(ApiError::invalid(&p, format!("'{p}' must be between {min} and {max}, got {x}")));
    }
    Ok(Some(x))
}

/// `o[name]` as an integer of at least `min` (errors named as for [`number_in`]).
pub(crate) fn integer_in(o: &Map<String, Value>, prefix: &str, name: &str, min: i64) -> Result<Option<i64>, ApiError> {
    let Some(v) = field(o, name) else { return Ok(None) };
    let p = format!("{prefix}{name}");
    let n = v.as_i64().ok_or_else(|| ApiError::invalid(&p, format!("'{p}' must be an integer")))?;
    if n < min {
        return Err(ApiError::invalid(&p, format!("'{p}' must be at least {min}, got {n}")));
    }
    Ok(Some(n))
}

pub(crate) fn integer(o: &Map<String, Value>, name: &str, min: i64) -> Result<Option<i64>, ApiError> {
    integer_in(o, "", name, min)
}

/// An optional boolean; `None` when absent.
pub(crate) fn flag(o: &Map<String, Value>, name: &str) -> Result<Option<bool>, ApiError> {
    match field(o, name) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::invalid(name, format!("'{name}' must be a boolean"))),
    }
}

pub(crate) fn boolean(o: &Map<String, Value>, name: &str) -> Result<bool, ApiError> {
    Ok(flag(o, name)?.unwrap_or(false))
}

fn string<'a>(v: &'a Value, param: &str) -> Result<&'a str, ApiError> {
    v.as_str().ok_or_else(|| ApiError::invalid(param, format!("'{param}' must be a string")))
}

/// `model`, when given, must be a string; any name is served by the one loaded model (as
/// llama.cpp's server does), so a client configured for another server still works.
pub(crate) fn check_model(o: &Map<String, Value>) -> Result<(), ApiError> {
    match field(o, "model") {
        None | Some(Value::String(_)) => Ok(()),
        Some(_) => Err(ApiError::invalid("model", "'model' must be a string")),
    }
}

/// The sampling fields every surface shares, read from `o` under their OpenAI names (Ollama's
/// `options` use the same ones); `prefix` is where `o` sits in the body, for error messages.
pub(crate) fn sampling(o: &Map<String, Value>, prefix: &str, s: &mut SamplingParams) -> Result<(), ApiError> {
    if let Some(t) = number_in(o, prefix, "temperature", 0.0, 2.0)? {
        s.temperature = t as f32;
    }
    if let Some(p) = number_in(o, prefix, "top_p", 0.0, 1.0)? {
        s.top_p = p as f32;
    }
    // Not OpenAI's, but llama.cpp's server takes them and clients send them.
    if let Some(k) = integer_in(o, prefix, "top_k", 0)? {
        s.top_k = usize::try_from(k).unwrap_or(usize::MAX);
    }
    if let Some(p) = number_in(o, prefix, "min_p", 0.0, 1.0)? {
        s.min_p = p as f32;
    }
    if let Some(p) = number_in(o, prefix, "presence_penalty", -2.0, 2.0)? {
        s.presence_penalty = p as f32;
    }
    if let Some(p) = number_in(o, prefix, "frequency_penalty", -2.0, 2.0)? {
        s.frequency_penalty = p as f32;
    }
    if let Some(v) = field(o, "seed") {
        // OpenAI takes any 64-bit integer; a negative one is as good a seed as its bits.
        let p = format!("{prefix}seed");
        s.seed = v.as_i64().map(|n| n as u64).or_else(|| v.as_u64()).ok_or_else(|| ApiError::invalid(&p, format!("'{p}' must be an integer")))?;
    }
    Ok(())
}

/// `stop`: a string or at most `max` strings, none empty.
pub(crate) fn stops(o: &Map<String, Value>, prefix: &str, max: usize) -> Result<Vec<String>, ApiError> {
    let p = format!("{prefix}stop");
    let stop = match field(o, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= max => a.iter().map(|v| string(v, &p).map(str::to_string)).collect::<Result<_, _>>()?,
        Some(Value::Array(_)) => return Err(ApiError::invalid(&p, format!("'{p}' takes at most {max} strings"))),
        Some(_) => return Err(ApiError::invalid(&p, format!("'{p}' must be a string or an array of strings"))),
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid(&p, "a stop string must not be empty"));
    }
    Ok(stop)
}

/// What every generation endpoint shares: sampling, stop strings, token budget, streaming, and
/// the fields this server refuses rather than ignores.
fn common(o: &Map<String, Value>, default_max_tokens: usize) -> Result<(GenerateParams, bool, bool), ApiError> {
    check_model(o)?;
    if let Some(n) = integer(o, "n", 1)? {
        if n != 1 {
            return Err(ApiError::unsupported("n", "only n = 1 is supported (one choice per request)"));
        }
    }
    let mut params = GenerateParams { max_tokens: default_max_tokens, ..GenerateParams::default() };
    // `max_completion_tokens` is the newer name; it wins when both are given.
    for name in ["max_tokens", "max_completion_tokens"] {
        if let Some(n) = integer(o, name, 1)? {
            params.max_tokens = usize::try_from(n).unwrap_or(usize::MAX);
        }
    }
    sampling(o, "", &mut params.sampling)?;
    params.stop = stops(o, "", MAX_STOPS)?;
    let stream = boolean(o, "stream")?;
    let include_usage = match field(o, "stream_options") {
        None => false,
        Some(Value::Object(so)) => {
            boolean(so, "include_usage").map_err(|_| ApiError::invalid("stream_options", "'stream_options.include_usage' must be a boolean"))?
        }
        Some(_) => return Err(ApiError::invalid("stream_options", "'stream_options' must be an object")),
    };
    Ok((params, stream, include_usage))
}

/// The most alternatives a legacy completion's `logprobs` may ask for (OpenAI's limit).
const COMPLETIONS_MAX_LOGPROBS: i64 = 5;

/// Chat: `logprobs` (a boolean) and `top_logprobs` (0..=20, only with `logprobs: true`), as
/// how many alternatives each token's log-probability comes with.
pub(crate) fn chat_logprobs(o: &Map<String, Value>) -> Result<Option<usize>, ApiError> {
    let on = boolean(o, "logprobs")?;
    let top = integer(o, "top_logprobs", 0)?;
    match top {
        Some(n) if n > MAX_TOP_LOGPROBS as i64 => Err(ApiError::invalid("top_logprobs", format!("'top_logprobs' must be at most {MAX_TOP_LOGPROBS}, got {n}"))),
        Some(_) if !on => Err(ApiError::invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true")),
        _ => Ok(on.then(|| top.unwrap_or(0) as usize)),
    }
}

/// Legacy completions: `logprobs` is the number of alternatives (0..=5).
fn completion_logprobs(o: &Map<String, Value>) -> Result<Option<usize>, ApiError> {
    match integer(o, "logprobs", 0)? {
        Some(n) if n > COMPLETIONS_MAX_LOGPROBS => {
            Err(ApiError::invalid("logprobs", format!("'logprobs' must be at most {COMPLETIONS_MAX_LOGPROBS}, got {n}")))
        }
        n => Ok(n.map(|n| n as usize)),
    }
}

/// A message's `content`: a string, `null` (an assistant message that only calls tools), or an
/// array of text parts.
fn content_text(v: Option<&Value>, param: &str) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (Some(other), _) if other != "text" => {
                        return Err(ApiError::unsupported(param, format!("content parts of type '{other}' are not supported (text only)")))
                    }
                    _ => return Err(ApiError::invalid(param, "a content part must be { type: 'text', text: string }")),
                }
            }
            Ok(text)
        }
        Some(_) => Err(ApiError::invalid(param, "'content' must be a string, null or an array of text parts")),
    }
}

/// `messages[i]`: its name for errors, the object, and its role.
pub(crate) fn message(i: usize, m: &Value) -> Result<(String, &Map<String, Value>, &'static str), ApiError> {
    let param = format!("messages[{i}]");
    let m = m.as_object().ok_or_else(|| ApiError::invalid(&param, format!("'{param}' must be an object")))?;
    let role = match m.get("role").and_then(Value::as_str) {
        // OpenAI's newer name for the system role; chat templates know `system`.
        Some("developer" | "system") => "system",
        Some("user") => "user",
        Some("assistant") => "assistant",
        Some("tool") => "tool",
        Some(r) => return Err(ApiError::invalid(&format!("{param}.role"), format!("unknown role '{r}'"))),
        None => return Err(ApiError::invalid(&format!("{param}.role"), "'role' is required and must be a string")),
    };
    Ok((param, m, role))
}

fn messages(o: &Map<String, Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let list = match field(o, "messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(ApiError::invalid("messages", "'messages' must not be empty")),
        Some(_) => return Err(ApiError::invalid("messages", "'messages' must be an array")),
        None => return Err(ApiError::invalid("messages", "'messages' is required")),
    };
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let (param, m, role) = message(i, m)?;
            let mut msg = ChatMessage::new(role, content_text(m.get("content"), &format!("{param}.content"))?);
            if let Some(calls) = field(m, "tool_calls") {
                let at = format!("{param}.tool_calls");
                let calls = calls.as_array().ok_or_else(|| ApiError::invalid(&at, "'tool_calls' must be an array"))?;
                msg.tool_calls = calls
                    .iter()
                    .map(|c| {
                        let f = c.get("function");
                        let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
                        let arguments = f.and_then(|f| f.get("arguments")).and_then(Value::as_str);
                        match (name, arguments) {
                            (Some(name), Some(arguments)) => Ok(ToolCall {
                                id: c.get("id").and_then(Value::as_str).unwrap_or_default().to_string(),
                                name: name.to_string(),
                                arguments: arguments.to_string(),
                            }),
                            _ => Err(ApiError::invalid(&at, "a tool call must be { id, type: 'function', function: { name, arguments: string } }")),
                        }
                    })
                    .collect::<Result<_, _>>()?;
            }
            msg.tool_call_id = m.get("tool_call_id").and_then(Value::as_str).map(str::to_string);
            msg.name = m.get("name").and_then(Value::as_str).map(str::to_string);
            Ok(msg)
        })
        .collect()
}

pub(crate) fn response_format(o: &Map<String, Value>) -> Result<Option<Constraint>, ApiError> {
    let Some(rf) = field(o, "response_format") else { return Ok(None) };
    let bad = || ApiError::invalid("response_format", "'response_format' must be { type: 'text' | 'json_object' | 'json_schema', ... }");
    let rf = rf.as_object().ok_or_else(bad)?;
    match rf.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Constraint::JsonObject)),
        Some("json_schema") => {
            let schema = rf
                .get("json_schema")
                .and_then(|js| js.get("schema"))
                .filter(|s| s.is_object() || s.is_boolean())
                .ok_or_else(|| ApiError::invalid("response_format", "'response_format.json_schema.schema' must be a JSON schema (an object)"))?;
            Ok(Some(Constraint::JsonSchema(schema.clone())))
        }
        _ => Err(bad()),
    }
}

pub(crate) fn tools(o: &Map<String, Value>) -> Result<(Vec<Tool>, ToolChoice), ApiError> {
    let tools = match field(o, "tools") {
        None => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let param = format!("tools[{i}]");
                if t.get("type").and_then(Value::as_str) != Some("function") {
                    return Err(ApiError::invalid(&param, "only tools of type 'function' are supported"));
                }
                let f = t.get("function").and_then(Value::as_object).ok_or_else(|| ApiError::invalid(&param, "a tool needs a 'function' object"))?;
                let name =
                    f.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()).ok_or_else(|| ApiError::invalid(&param, "a function needs a 'name'"))?;
                let parameters = field(f, "parameters").cloned().unwrap_or_else(|| json!({ "type": "object", "properties": {} }));
                if !parameters.is_object() {
                    return Err(ApiError::invalid(&param, "'parameters' must be a JSON schema object"));
                }
                let description = f.get("description").and_then(Value::as_str).map(str::to_string);
                Ok(Tool { name: name.to_string(), description, parameters })
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::invalid("tools", "'tools' must be an array")),
    };
    let choice = match field(o, "tool_choice") {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            _ => return Err(ApiError::invalid("tool_choice", "'tool_choice' must be 'auto', 'none', 'required' or { type: 'function', function: { name } }")),
        },
        Some(v) => {
            let name = v
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::invalid("tool_choice", "'tool_choice' must name a function: { type: 'function', function: { name } }"))?;
            if !tools.iter().any(|t| t.name == name) {
                return Err(ApiError::invalid("tool_choice", format!("'tool_choice' names '{name}', which is not among 'tools'")));
            }
            ToolChoice::Function(name.to_string())
        }
    };
    if tools.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Function(_)) {
        return Err(ApiError::invalid("tool_choice", "'tool_choice' asks for a tool call but 'tools' is empty"));
    }
    Ok((tools, choice))
}

/// `POST /v1/chat/completions`. `context` is the model's context length: without a token
/// budget, generation may fill it (the engine stops there).
pub fn chat_request(o: &Map<String, Value>, context: usize) -> Result<GenerationBody, ApiError> {
    let (mut params, stream, include_usage) = common(o, context)?;
    params.logprobs = chat_logprobs(o)?;
    params.constraint = response_format(o)?;
    let (tools, choice) = tools(o)?;
    params.tools = tools;
    params.tool_choice = choice;
    Ok(GenerationBody { prompt: Prompt::Chat(messages(o)?), params, stream, include_usage })
}

/// `POST /v1/completions` (the legacy text endpoint).
pub fn completion_request(o: &Map<String, Value>) -> Result<GenerationBody, ApiError> {
    if boolean(o, "echo")? {
        return Err(ApiError::unsupported("echo", "'echo' is not supported"));
    }
    if field(o, "suffix").is_some() {
        return Err(ApiError::unsupported("suffix", "'suffix' is not supported"));
    }
    if let Some(b) = integer(o, "best_of", 1)? {
        if b != 1 {
            return Err(ApiError::unsupported("best_of", "only best_of = 1 is supported"));
        }
    }
    let (mut params, stream, include_usage) = common(o, COMPLETIONS_DEFAULT_MAX_TOKENS)?;
    params.logprobs = completion_logprobs(o)?;
    let one = |v: &Value| -> Result<Prompt, ApiError> {
        match v {
            Value::String(s) => Ok(Prompt::Text(s.clone())),
            Value::Array(ids) => ids
                .iter()
                .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect::<Option<Vec<u32>>>()
                .map(Prompt::Tokens)
                .ok_or_else(|| ApiError::invalid("prompt", "a token prompt must be an array of token ids")),
            _ => Err(ApiError::invalid("prompt", "'prompt' must be a string, an array of token ids, or an array of one of these")),
        }
    };
    let prompt = match field(o, "prompt") {
        None => return Err(ApiError::invalid("prompt", "'prompt' is required")),
        Some(Value::Array(a)) if a.len() == 1 && (a[0].is_string() || a[0].is_array()) => one(&a[0])?,
        Some(Value::Array(a)) if a.iter().any(|v| v.is_string() || v.is_array()) => {
            return Err(ApiError::unsupported("prompt", "one prompt per request is supported"))
        }
        Some(v) => one(v)?,
    };
    if matches!(&prompt, Prompt::Tokens(t) if t.is_empty()) {
        return Err(ApiError::invalid("prompt", "'prompt' must not be empty"));
    }
    Ok(GenerationBody { prompt, params, stream, include_usage })
}

/// `input`: a string or 1..=[`MAX_EMBED_INPUTS`] strings.
pub(crate) fn embed_inputs(o: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let texts: Vec<String> = match field(o, "input") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if !a.is_empty() && a.len() <= MAX_EMBED_INPUTS => a
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(|| ApiError::invalid("input", "'input' must be a string or an array of strings")))
            .collect::<Result<_, _>>()?,
        Some(Value::Array(a)) if a.is_empty() => return Err(ApiError::invalid("input", "'input' must not be empty")),
        Some(Value::Array(_)) => return Err(ApiError::invalid("input", format!("'input' takes at most {MAX_EMBED_INPUTS} texts"))),
        Some(_) => return Err(ApiError::invalid("input", "'input' must be a string or an array of strings")),
        None => return Err(ApiError::invalid("input", "'input' is required")),
    };
    Ok(texts)
}

/// A read embeddings request.
#[derive(Debug)]
pub struct EmbeddingsBody {
    pub texts: Vec<String>,
    pub base64: bool,
}

/// `POST /v1/embeddings`. `dim` is the model's embedding width: `dimensions` may only repeat it.
pub fn embeddings_request(o: &Map<String, Value>, dim: usize) -> Result<EmbeddingsBody, ApiError> {
    check_model(o)?;
    let texts = embed_inputs(o)?;
    let base64 = match field(o, "encoding_format").map(|v| v.as_str()) {
        None | Some(Some("float")) => false,
        Some(Some("base64")) => true,
        _ => return Err(ApiError::invalid("encoding_format", "'encoding_format' must be 'float' or 'base64'")),
    };
    if let Some(d) = integer(o, "dimensions", 1)? {
        if d as u64 != dim as u64 {
            return Err(ApiError::unsupported("dimensions", format!("this model's embeddings have {dim} dimensions; 'dimensions' cannot change that")));
        }
    }
    Ok(EmbeddingsBody { texts, base64 })
}

/// Seconds since the Unix epoch, for `created`.
pub fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

pub(crate) fn finish_reason(c: &Completion) -> &'static str {
    if !c.tool_calls.is_empty() {
        return "tool_calls";
    }
    match c.finish_reason {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Abort => "stop",
    }
}

fn usage(c: &Completion) -> Value {
    json!({
        "prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens, "total_tokens": c.prompt_tokens + c.completion_tokens,
        "prompt_tokens_details": { "cached_tokens": c.cached_tokens },
    })
}

fn tool_calls_json(calls: &[ToolCall], with_index: bool) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = json!({ "id": c.id, "type": "function", "function": { "name": c.name, "arguments": c.arguments } });
            if with_index {
                v["index"] = json!(i);
            }
            v
        })
        .collect()
}

/// A log-probability as JSON: a token the model rules out (`-inf`) as -9999, as OpenAI does.
pub(crate) fn logprob_value(lp: f64) -> Value {
    json!(if lp.is_finite() { lp } else { -9999.0 })
}

fn token_json(t: &TokenProb) -> Value {
    json!({ "token": t.text, "logprob": logprob_value(t.logprob), "bytes": t.bytes })
}

/// Chat's `logprobs`: `{ content: [{ token, logprob, bytes, top_logprobs }] }`.
pub fn chat_logprobs_json(l: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = l
        .iter()
        .map(|t| {
            let mut v = token_json(&t.token);
            v["top_logprobs"] = t.top.iter().map(token_json).collect();
            v
        })
        .collect();
    json!({ "content": content, "refusal": null })
}

/// The legacy endpoint's `logprobs`: parallel arrays, `text_offset` counted in characters of
/// the output from `offset` (where this part of it starts).
pub fn completion_logprobs_json(l: &[TokenLogprob], mut offset: usize) -> Value {
    let mut text_offset = Vec::with_capacity(l.len());
    for t in l {
        text_offset.push(offset);
        offset += t.token.text.chars().count();
    }
    let top: Vec<Value> =
        l.iter().map(|t| Value::Object(t.top.iter().map(|a| (a.text.clone(), logprob_value(a.logprob))).collect::<Map<String, Value>>())).collect();
    json!({
        "tokens": l.iter().map(|t| t.token.text.as_str()).collect::<Vec<_>>(),
        "token_logprobs": l.iter().map(|t| logprob_value(t.token.logprob)).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": text_offset,
    })
}

/// A completion's `logprobs` field for `endpoint` (`null` when not asked for).
fn logprobs_json(endpoint: Endpoint, l: Option<&[TokenLogprob]>, offset: usize) -> Value {
    match (l, endpoint) {
        (None, _) => Value::Null,
        (Some(l), Endpoint::Chat) => chat_logprobs_json(l),
        (Some(l), Endpoint::Completions) => completion_logprobs_json(l, offset),
    }
}

/// The response id: the engine's completion id under OpenAI's prefix for the endpoint.
pub fn response_id(endpoint: Endpoint, engine_id: &str) -> String {
    let engine_id = engine_id.strip_prefix("cmpl-").unwrap_or(engine_id);
    match endpoint {
        Endpoint::Chat => format!("chatcmpl-{engine_id}"),
        Endpoint::Completions => format!("cmpl-{engine_id}"),
    }
}

/// The whole (non-streamed) response.
pub fn completion_json(endpoint: Endpoint, model: &str, c: &Completion) -> Value {
    let id = response_id(endpoint, &c.id);
    match endpoint {
        Endpoint::Chat => {
            let mut message = json!({ "role": "assistant", "content": c.text, "refusal": null });
            if !c.tool_calls.is_empty() {
                message["tool_calls"] = tool_calls_json(&c.tool_calls, false);
                if c.text.is_empty() {
                    message["content"] = Value::Null;
                }
            }
            json!({
                "id": id, "object": "chat.completion", "created": now(), "model": model,
                "choices": [{ "index": 0, "message": message, "logprobs": logprobs_json(endpoint, c.logprobs.as_deref(), 0), "finish_reason": finish_reason(c) }],
                "usage": usage(c),
            })
        }
        Endpoint::Completions => json!({
            "id": id, "object": "text_completion", "created": now(), "model": model,
            "choices": [{ "index": 0, "text": c.text, "logprobs": logprobs_json(endpoint, c.logprobs.as_deref(), 0), "finish_reason": finish_reason(c) }],
            "usage": usage(c),
        }),
    }
}

/// Builds the `data:` payloads of one streamed response.
pub struct ChunkWriter {
    pub endpoint: Endpoint,
    pub id: String,
    pub model: String,
    pub created: u64,
    pub include_usage: bool,
}

impl ChunkWriter {
    fn chunk(&self, choice: Value) -> Value {
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completions => "text_completion",
        };
        let mut v = json!({ "id": self.id, "object": object, "created": self.created, "model": self.model, "choices": [choice] });
        if self.include_usage {
            // OpenAI sends `usage: null` on every chunk but the last when usage is asked for.
            v["usage"] = Value::Null;
        }
        v
    }

    /// The first chunk of a chat stream (the role), `None` for the text endpoint.
    pub fn start(&self) -> Option<Value> {
        (self.endpoint == Endpoint::Chat)
            .then(|| self.chunk(json!({ "index": 0, "delta": { "role": "assistant", "content": "" }, "logprobs": null, "finish_reason": null })))
    }

    /// A piece of generated text, with the log-probabilities of its tokens when asked for
    /// (`offset`: characters of output before them).
    pub fn text(&self, text: &str, logprobs: Option<&[TokenLogprob]>, offset: usize) -> Value {
        let logprobs = logprobs_json(self.endpoint, logprobs, offset);
        match self.endpoint {
            Endpoint::Chat => self.chunk(json!({ "index": 0, "delta": { "content": text }, "logprobs": logprobs, "finish_reason": null })),
            Endpoint::Completions => self.chunk(json!({ "index": 0, "text": text, "logprobs": logprobs, "finish_reason": null })),
        }
    }

    /// The chunks that end the stream: the tool calls (if any), the finish reason, and the
    /// usage when asked for.
    pub fn finish(&self, c: &Completion) -> Vec<Value> {
        let mut out = Vec::new();
        if !c.tool_calls.is_empty() && self.endpoint == Endpoint::Chat {
            out.push(
                self.chunk(json!({ "index": 0, "delta": { "tool_calls": tool_calls_json(&c.tool_calls, true) }, "logprobs": null, "finish_reason": null })),
            );
        }
        out.push(match self.endpoint {
            Endpoint::Chat => self.chunk(json!({ "index": 0, "delta": {}, "logprobs": null, "finish_reason": finish_reason(c) })),
            Endpoint::Completions => self.chunk(json!({ "index": 0, "text": "", "logprobs": null, "finish_reason": finish_reason(c) })),
        });
        if self.include_usage {
            let mut last = self.chunk(Value::Null);
            last["choices"] = json!([]);
            last["usage"] = usage(c);
            out.push(last);
        }
        out
    }
}

/// The embeddings response; vectors as numbers, or as base64 of little-endian `f32`s.
pub fn embeddings_json(model: &str, vectors: &[Vec<f32>], base64: bool, prompt_tokens: usize) -> Value {
    use base64::Engine as _;
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({ "object": "embedding", "index": i, "embedding": embedding })
        })
        .collect();
    json!({ "object": "list", "data": data, "model": model, "usage": { "prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens } })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A test body as the object `parse_object` would give.
    pub(crate) fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!("test bodies are objects"),
        }
    }

    #[test]
    fn chat_fields_map_to_params() {
        let b = chat_request(
            &obj(json!({
                "model": "x", "messages": [{ "role": "developer", "content": [{ "type": "text", "text": "be brief" }] }, { "role": "user", "content": "hi" }],
                "max_tokens": 5, "max_completion_tokens": 7, "temperature": 0, "top_p": 0.5, "seed": -1, "stop": ["\n"],
                "stream": true, "stream_options": { "include_usage": true },
                "response_format": { "type": "json_schema", "json_schema": { "name": "p", "schema": { "type": "object" } } },
                "tools": [{ "type": "function", "function": { "name": "f", "parameters": { "type": "object" } } }], "tool_choice": "required",
            })),
            4096,
        )
        .expect("valid request");
        assert_eq!(b.params.max_tokens, 7);
        assert_eq!(b.params.sampling.temperature, 0.0);
        assert_eq!(b.params.sampling.top_p, 0.5);
        assert_eq!(b.params.sampling.seed, u64::MAX);
        assert_eq!(b.params.stop, vec!["\n".to_string()]);
        assert!(b.stream && b.include_usage && b.may_call_tools());
        assert_eq!(b.params.constraint, Some(Constraint::JsonSchema(json!({ "type": "object" }))));
        assert_eq!(b.params.tool_choice, ToolChoice::Required);
        match b.prompt {
            Prompt::Chat(m) => assert_eq!(m, vec![ChatMessage::new("system", "be brief"), ChatMessage::new("user", "hi")]),
            other => panic!("not a chat prompt: {other:?}"),
        }
    }

    #[test]
    fn bad_fields_name_the_param() {
        let cases = [
            (json!({ "messages": [] }), "messages"),
            (json!({ "messages": [{ "role": "user", "content": "x" }], "temperature": "hot" }), "temperature"),
            (json!({ "messages": [{ "role": "user", "content": "x" }], "temperature": 3 }), "temperature"),
            (json!({ "messages": [{ "role": "user", "content": "x" }], "max_tokens": 0 }), "max_tokens"),
            (json!({ "messages": [{ "role": "wizard", "content": "x" }] }), "messages[0].role"),
            (json!({ "messages": [{ "role": "user", "content": "x" }], "stop": ["a", "b", "c", "d", "e"] }), "stop"),
            (json!({ "messages": [{ "role": "user", "content": "x" }], "logprobs": 1 }), "logprobs"),
            (json!({ "messages": [{ "role": "user", "content": "x" }], "top_logprobs": 2 }), "top_logprobs"),
            (json!({ "messages": [{ "role": "user", "content": "x" }], "logprobs": true, "top_logprobs": 21 }), "top_logprobs"),
            (json!({ "messages": [{ "role": "user", "content": "x" }], "n": 2 }), "n"),
            (json!({ "messages": [{ "role": "user", "content": "x" }], "tool_choice": "required" }), "tool_choice"),
            (json!({ "messages": [{ "role": "user", "content": "x" }], "response_format": { "type": "yaml" } }), "response_format"),
        ];
        for (body, param) in cases {
            let e = chat_request(&obj(body.clone()), 4096).expect_err("invalid request");
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{body}");
        }
    }

    #[test]
    fn tool_history_maps_to_messages() {
        let b = chat_request(
            &obj(json!({ "messages": [
                { "role": "user", "content": "weather?" },
                { "role": "assistant", "content": null, "tool_calls": [{ "id": "call_1", "type": "function", "function": { "name": "w", "arguments": "{}" } }] },
                { "role": "tool", "tool_call_id": "call_1", "name": "w", "content": "sunny" },
            ] })),
            4096,
        )
        .expect("valid request");
        let Prompt::Chat(m) = b.prompt else { panic!("not a chat prompt") };
        assert_eq!(m[1].tool_calls, vec![ToolCall { id: "call_1".into(), name: "w".into(), arguments: "{}".into() }]);
        assert_eq!((m[2].tool_call_id.as_deref(), m[2].name.as_deref(), m[2].content.as_str()), (Some("call_1"), Some("w"), "sunny"));
        let bad = json!({ "messages": [{ "role": "assistant", "tool_calls": [{ "function": { "name": "w", "arguments": {} } }] }] });
        assert_eq!(chat_request(&obj(bad), 4096).map(|_| ()).map_err(|e| e.param), Err(Some("messages[0].tool_calls".into())));
    }

    #[test]
    fn completion_prompts() {
        let b = completion_request(&obj(json!({ "prompt": ["hello"] }))).expect("one prompt");
        assert!(matches!(b.prompt, Prompt::Text(ref s) if s == "hello"));
        assert_eq!(b.params.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS);
        let b = completion_request(&obj(json!({ "prompt": [1, 2, 3] }))).expect("token prompt");
        assert!(matches!(b.prompt, Prompt::Tokens(ref t) if t == &[1, 2, 3]));
        assert_eq!(completion_request(&obj(json!({ "prompt": ["a", "b"] }))).map(|_| ()).map_err(|e| e.code), Err("ERR_UNSUPPORTED"));
        assert_eq!(completion_request(&obj(json!({ "prompt": "a", "logprobs": 2 }))).map(|b| b.params.logprobs).ok(), Some(Some(2)));
        assert_eq!(completion_request(&obj(json!({ "prompt": "a", "logprobs": 6 }))).map(|_| ()).map_err(|e| e.param), Err(Some("logprobs".into())));
        assert_eq!(completion_request(&obj(json!({ "prompt": "a", "logprobs": true }))).map(|_| ()).map_err(|e| e.param), Err(Some("logprobs".into())));
    }

    #[test]
    fn logprobs_shapes() {
        let b = chat_request(&obj(json!({ "messages": [{ "role": "user", "content": "x" }], "logprobs": true, "top_logprobs": 3 })), 4096).expect("valid");
        assert_eq!(b.params.logprobs, Some(3));
        let b = chat_request(&obj(json!({ "messages": [{ "role": "user", "content": "x" }], "logprobs": false })), 4096).expect("valid");
        assert_eq!(b.params.logprobs, None);
        let p = |id, text: &str, logprob| TokenProb { id, text: text.into(), bytes: text.as_bytes().to_vec(), logprob };
        let l = vec![
            TokenLogprob { token: p(5, "Hé", -0.5), top: vec![p(5, "Hé", -0.5), p(6, "a", -1.5)] },
            TokenLogprob { token: p(7, "!", f64::NEG_INFINITY), top: vec![] },
        ];
        let chat = chat_logprobs_json(&l);
        assert_eq!(chat["content"][0]["token"], "Hé");
        assert_eq!(chat["content"][0]["bytes"], json!([72, 195, 169]));
        assert_eq!(chat["content"][0]["top_logprobs"][1], json!({ "token": "a", "logprob": -1.5, "bytes": [97] }));
        assert_eq!(chat["content"][1]["logprob"], -9999.0);
        let text = completion_logprobs_json(&l, 10);
        assert_eq!(text["tokens"], json!(["Hé", "!"]));
        assert_eq!(text["token_logprobs"], json!([-0.5, -9999.0]));
        assert_eq!(text["top_logprobs"][0], json!({ "Hé": -0.5, "a": -1.5 }));
        assert_eq!(text["text_offset"], json!([10, 12]));
    }

    #[test]
    fn malformed_bodies() {
        assert_eq!(parse_object(b"{").map_err(|e| (e.status, e.code)), Err((400, "ERR_INVALID_JSON")));
        assert_eq!(parse_object(b"[1]").map_err(|e| (e.status, e.code)), Err((400, "ERR_INVALID_JSON")));
    }

    #[test]
    fn embeddings_base64_is_little_endian_f32() {
        let v = embeddings_json("m", &[vec![1.0, -2.5]], true, 3);
        let s = v["data"][0]["embedding"].as_str().expect("base64 text");
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD.decode(s).expect("valid base64");
        assert_eq!(bytes, [1.0f32.to_le_bytes(), (-2.5f32).to_le_bytes()].concat());
        assert_eq!(v["usage"]["prompt_tokens"], 3);
        assert!(embeddings_request(&obj(json!({ "input": "x", "dimensions": 7 })), 640).is_err());
    }
}
