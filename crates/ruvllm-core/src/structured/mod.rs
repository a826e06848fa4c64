//! Structured output: what a request constrains its output to ([`Constraint`]), the tools it
//! offers the model ([`Tool`], [`ToolChoice`]) and the calls the model made ([`ToolCall`]);
//! and the constrained decoding that enforces them, with the `llguidance` engine:
//! [`TokenEnv`] (the vocabulary, built once per engine) and [`OutputConstraint`] (one per
//! request: masks logits, follows tokens, parses tool calls).

mod env;
mod gbnf;
mod output;
mod tools;

pub use env::TokenEnv;
pub use gbnf::gbnf_to_lark;
pub use output::OutputConstraint;
pub use tools::{calls_grammar, messages_with_tools_prompt, parse_calls, template_tool, tools_system_prompt, ToolFormat};

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

use serde_json::Value;

use crate::{Error, Result};

fn invalid(msg: String) -> Error {
    Error::InvalidArg(msg)
}

impl Constraint {
    /// OpenAI's `response_format`: `{ type: 'json_object' }`, or `{ type: 'json_schema', schema }`
    /// (also the Chat Completions spelling `{ type: 'json_schema', json_schema: { schema } }`);
    /// `{ type: 'text' }` is no constraint. `what` names the option in errors.
    pub fn from_response_format(v: &Value, what: &str) -> Result<Option<Constraint>> {
        let ty = v.get("type").and_then(Value::as_str).ok_or_else(|| invalid(format!("{what}.type must be 'text', 'json_object' or 'json_schema'")))?;
        match ty {
            "text" => Ok(None),
            "json_object" => Ok(Some(Constraint::JsonObject)),
            "json_schema" => {
                let schema = v.get("schema").or_else(|| v.get("json_schema").and_then(|j| j.get("schema")));
                match schema {
                    Some(s @ (Value::Object(_) | Value::Bool(_))) => Ok(Some(Constraint::JsonSchema(s.clone()))),
                    Some(_) => Err(Error::Grammar(format!("{what}.schema must be a JSON schema object"))),
                    None => Err(invalid(format!("{what} of type 'json_schema' needs a schema"))),
                }
            }
            other => Err(invalid(format!("{what}.type must be 'text', 'json_object' or 'json_schema', got '{other}'"))),
        }
    }
}

impl Tool {
    /// A tool in OpenAI's format `{ type: 'function', function: { name, description?, parameters? } }`
    /// (or the bare function object). `what` names it in errors.
    pub fn from_openai(v: &Value, what: &str) -> Result<Tool> {
        if let Some(ty) = v.get("type") {
            if ty.as_str() != Some("function") {
                return Err(invalid(format!("{what}.type must be 'function'")));
            }
        }
        let f = v.get("function").unwrap_or(v);
        let name = f.get("name").and_then(Value::as_str).filter(|n| !n.is_empty());
        let name = name.ok_or_else(|| invalid(format!("{what}.function.name must be a non-empty string")))?;
        let description = match f.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(invalid(format!("{what}.function.description must be a string"))),
        };
        let parameters = f.get("parameters").cloned().unwrap_or(Value::Null);
        Ok(Tool { name: name.to_string(), description, parameters })
    }
}

impl ToolChoice {
    /// OpenAI's `tool_choice`: `'auto' | 'none' | 'required'`, or
    /// `{ type: 'function', function: { name } }` (or `{ name }`).
    pub fn from_openai(v: &Value, what: &str) -> Result<ToolChoice> {
        match v {
            Value::String(s) => match s.as_str() {
                "auto" => Ok(ToolChoice::Auto),
                "none" => Ok(ToolChoice::None),
                "required" => Ok(ToolChoice::Required),
                other => Err(invalid(format!("{what} must be 'auto', 'none', 'required' or {{ function: {{ name }} }}, got '{other}'"))),
            },
            Value::Object(_) => {
                let f = v.get("function").unwrap_or(v);
                match f.get("name").and_then(Value::as_str) {
                    Some(n) if !n.is_empty() => Ok(ToolChoice::Function(n.to_string())),
                    _ => Err(invalid(format!("{what}.function.name must be a non-empty string"))),
                }
            }
            _ => Err(invalid(format!("{what} must be 'auto', 'none', 'required' or {{ function: {{ name }} }}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn reads_openai_shapes() {
        assert_eq!(Constraint::from_response_format(&json!({"type": "json_object"}), "rf").unwrap(), Some(Constraint::JsonObject));
        assert_eq!(Constraint::from_response_format(&json!({"type": "text"}), "rf").unwrap(), None);
        let s = json!({"type": "object"});
        assert_eq!(Constraint::from_response_format(&json!({"type": "json_schema", "schema": s}), "rf").unwrap(), Some(Constraint::JsonSchema(s.clone())));
        assert_eq!(
            Constraint::from_response_format(&json!({"type": "json_schema", "json_schema": {"name": "x", "schema": s}}), "rf").unwrap(),
            Some(Constraint::JsonSchema(s))
        );
        assert_eq!(Constraint::from_response_format(&json!({"type": "json_schema", "schema": 3}), "rf").unwrap_err().code(), "ERR_GRAMMAR");
        assert_eq!(Constraint::from_response_format(&json!({"type": "yaml"}), "rf").unwrap_err().code(), "ERR_INVALID_ARG");

        let t = Tool::from_openai(&json!({"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}), "tools[0]")
            .unwrap();
        assert_eq!((t.name.as_str(), t.description.as_deref()), ("f", Some("d")));
        assert_eq!(Tool::from_openai(&json!({"name": "g"}), "tools[0]").unwrap().parameters, Value::Null);
        assert!(Tool::from_openai(&json!({"type": "function", "function": {}}), "tools[0]").is_err());

        assert_eq!(ToolChoice::from_openai(&json!("required"), "tc").unwrap(), ToolChoice::Required);
        assert_eq!(ToolChoice::from_openai(&json!({"type": "function", "function": {"name": "f"}}), "tc").unwrap(), ToolChoice::Function("f".into()));
        assert!(ToolChoice::from_openai(&json!("sometimes"), "tc").is_err());
    }
}
