//! Errors as an OpenAI-compatible client expects them: an HTTP status and a body
//! `{"error":{"message","type","param","code"}}` (Ollama's endpoints: `{"error","code"}`). `code` is one of the project's stable codes
//! (`ERR_INVALID_ARG`, `ERR_CONTEXT_OVERFLOW`, ...), the same a JS caller of the library sees.

use serde_json::{json, Value};

/// An error on its way to an HTTP client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    /// OpenAI's error `type`: `invalid_request_error`, `authentication_error`, ...
    pub kind: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    pub code: &'static str,
}

impl ApiError {
    pub fn new(status: u16, kind: &'static str, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), kind, param: None, code }
    }

    /// A bad value in the request (400, `ERR_INVALID_ARG`), naming the field.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError { param: Some(param.to_string()), ..Self::new(400, "invalid_request_error", "ERR_INVALID_ARG", message) }
    }

    /// A field this server understands but does not implement (400, `ERR_UNSUPPORTED`): the
    /// client learns it was not honoured instead of getting an answer that ignores it.
    pub fn unsupported(param: &str, message: impl Into<String>) -> Self {
        ApiError { param: Some(param.to_string()), ..Self::new(400, "invalid_request_error", "ERR_UNSUPPORTED", message) }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, "invalid_request_error", "ERR_NOT_FOUND", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "authentication_error", "ERR_UNAUTHORIZED", "a valid API key is required (header 'Authorization: Bearer <key>')")
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(413, "invalid_request_error", "ERR_BODY_TOO_LARGE", format!("the request body exceeds {limit} bytes"))
    }

    pub fn busy(limit: usize) -> Self {
        Self::new(429, "rate_limit_error", "ERR_BUSY", format!("the server is at capacity ({limit} requests running or queued); retry later"))
    }

    /// The model was closed under the server, or the server is closing.
    pub fn closed() -> Self {
        Self::new(503, "server_error", "ERR_CLOSED", "the model was closed")
    }

    /// A request cut short because the server is closing.
    pub fn closing() -> Self {
        Self::new(503, "server_error", "ERR_CLOSED", "the server is closing")
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "server_error", "ERR_INTERNAL", message)
    }

    /// The body sent to the client.
    pub fn to_json(&self) -> Value {
        json!({ "error": { "message": self.message, "type": self.kind, "param": self.param, "code": self.code } })
    }

    /// The body an Ollama client reads: `{"error": "<message>"}` (the string Ollama's clients
    /// throw), with the stable `code` and the field at fault beside it.
    pub fn to_ollama_json(&self) -> Value {
        let mut v = json!({ "error": self.message, "code": self.code });
        if let Some(p) = &self.param {
            v["param"] = json!(p);
        }
        v
    }
}

impl From<ruvllm_core::Error> for ApiError {
    fn from(e: ruvllm_core::Error) -> Self {
        let code = e.code();
        let (status, kind) = match code {
            "ERR_INVALID_ARG" | "ERR_CONTEXT_OVERFLOW" | "ERR_CHAT_TEMPLATE" | "ERR_TOKENIZER" | "ERR_GRAMMAR" => (400, "invalid_request_error"),
            // The model was closed under the server (or the server is closing): not the
            // client's fault, and another instance may serve it.
            "ERR_CLOSED" | "ABORT_ERR" | "ERR_GPU_OOM" => (503, "server_error"),
            _ => (500, "server_error"),
        };
        ApiError::new(status, kind, code, e.to_string())
    }
}
