//! Structured output: what a request constrains its output to ([`Constraint`]), the tools it
//! offers the model ([`Tool`], [`ToolChoice`]) and the calls the model made ([`ToolCall`]).

/// What sampling is constrained to: every token the sampler may pick keeps the output a
/// prefix of something that parses (and validates, for a schema).
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// Any JSON object (OpenAI's `response_format: { type: 'json_object' }`).
    JsonObject,
    /// JSON that validates against this JSON schema (`{ type: 'json_schema', schema }`).
    JsonSchema(serde_json::Value),
    /// A grammar in Lark syntax (as llguidance reads it).
    Lark(String),
    /// A grammar in GBNF (llama.cpp's syntax).
    Gbnf(String),
}

/// A function the model may call (OpenAI's function-tool format).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Tool {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON schema of the call's arguments (an object schema).
    #[serde(default)]
    pub parameters: serde_json::Value,
}

/// Whether and which tool the model must call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model answers in text or calls tools, as it decides.
    #[default]
    Auto,
    /// No tool call (the tools are still shown to the model).
    None,
    /// At least one tool call.
    Required,
    /// A call of this function.
    Function(String),
}

/// A call the model made.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ToolCall {
    /// Unique within the completion (`call_…`), for the `tool` message that answers it.
    pub id: String,
    pub name: String,
    /// The arguments as JSON text (valid against the tool's `parameters`).
    pub arguments: String,
}
