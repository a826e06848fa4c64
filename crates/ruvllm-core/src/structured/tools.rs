//! Tool calls in the three formats models are trained on, chosen from the chat template:
//!
//! - [`ToolFormat::Llama3`] (templates with `<|start_header_id|>`): the whole answer is one JSON
//!   object `{"name": "f", "parameters": {…}}`, as Llama 3.1's template describes it.
//! - [`ToolFormat::Hermes`] (templates with `<tool_call>` or `<|im_start|>`, Qwen2/2.5): each call is
//!   `<tool_call>\n{"name": "f", "arguments": {…}}\n</tool_call>`, several separated by newlines.
//! - [`ToolFormat::Fenced`] (everything else, Gemma among them): each call is a fenced block
//!   ```` ```tool_call\n{"name": "f", "arguments": {…}}\n``` ````, several separated by newlines.
//!
//! Templates that read a `tools` variable get the tools as HF templates expect them
//! (`{"type": "function", "function": {name, description, parameters}}`); for the others the
//! tools and the call format are described in a system message ([`tools_system_prompt`]).
//! The call grammar ([`calls_grammar`]) pins the name to one of the offered tools and the
//! arguments to that tool's `parameters` schema, so a parsed call is valid by construction.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Value};

use super::{Tool, ToolCall, ToolChoice};
use crate::chat::ChatMessage;
use crate::{Error, Result};

/// How a model family writes tool calls (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Llama3,
    Hermes,
    Fenced,
}

impl ToolFormat {
    /// The format the chat template's model was trained on; `Fenced` when it shows none.
    pub fn for_template(source: Option<&str>) -> Self {
        match source {
            // Qwen2 templates without tool support still mean a model trained on Hermes calls.
            Some(s) if s.contains("<tool_call>") || s.contains("<|im_start|>") => ToolFormat::Hermes,
            Some(s) if s.contains("<|start_header_id|>") => ToolFormat::Llama3,
            _ => ToolFormat::Fenced,
        }
    }

    /// The text a call starts with: under `toolChoice: 'auto'` the output is free until the
    /// model writes it, then constrained to calls.
    pub fn trigger(self) -> &'static str {
        match self {
            ToolFormat::Llama3 => "{\"",
            ToolFormat::Hermes => "<tool_call>",
            ToolFormat::Fenced => "```tool_call",
        }
    }

    /// The key that holds the arguments.
    fn arguments_key(self) -> &'static str {
        match self {
            ToolFormat::Llama3 => "parameters",
            _ => "arguments",
        }
    }

    /// Text around each call's JSON object.
    fn wrap(self) -> (&'static str, &'static str) {
        match self {
            ToolFormat::Llama3 => ("", ""),
            ToolFormat::Hermes => ("<tool_call>\n", "\n</tool_call>"),
            ToolFormat::Fenced => ("```tool_call\n", "\n```"),
        }
    }
}

/// A tool as HF chat templates read it from their `tools` variable.
pub fn template_tool(tool: &Tool) -> Value {
    let mut function = json!({ "name": tool.name, "parameters": parameters_schema(tool) });
    if let Some(d) = &tool.description {
        function["description"] = json!(d);
    }
    json!({ "type": "function", "function": function })
}

/// The tool's argument schema (`{"type": "object"}` when it gives none).
fn parameters_schema(tool: &Tool) -> Value {
    match &tool.parameters {
        Value::Null => json!({ "type": "object" }),
        Value::Object(o) if o.is_empty() => json!({ "type": "object" }),
        other => other.clone(),
    }
}

/// The system text that offers the tools to a model whose template cannot render them: the
/// tool list as JSON, then the exact call format.
pub fn tools_system_prompt(tools: &[Tool], format: ToolFormat) -> String {
    let list: Vec<Value> = tools.iter().map(template_tool).collect();
    let (open, close) = format.wrap();
    let example = format!("{open}{{\"name\": <function name>, \"{}\": <arguments as a JSON object>}}{close}", format.arguments_key());
    format!(
        "You can call these functions:\n{}\n\nTo call a function, answer with exactly:\n{example}\nand nothing else. Otherwise answer normally.",
        serde_json::to_string_pretty(&list).unwrap_or_default()
    )
}

/// `messages` with the tools described in a system message (merged into a leading one), for
/// templates that do not read `tools`. Such templates know no tool calls or `tool` messages
/// (Gemma's rejects any role but user and assistant, alternating), so an assistant's calls are
/// written into its text in the format the model was asked for, and the results of a run of
/// `tool` messages become one user message.
pub fn messages_with_tools_prompt(messages: &[ChatMessage], tools: &[Tool], format: ToolFormat) -> Vec<ChatMessage> {
    let prompt = tools_system_prompt(tools, format);
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    for m in messages {
        if m.role == "tool" {
            let result = format!("Result of {}: {}", m.name.as_deref().unwrap_or("the function"), m.content);
            match out.last_mut() {
                Some(prev) if prev.role == "user" && prev.tool_call_id.is_some() => prev.content = format!("{}\n{result}", prev.content),
                // The id marks the message as tool results, so the next result joins it.
                _ => out.push(ChatMessage { tool_call_id: m.tool_call_id.clone().or(Some(String::new())), ..ChatMessage::new("user", result) }),
            }
        } else if !m.tool_calls.is_empty() {
            let (open, close) = format.wrap();
            let calls = m.tool_calls.iter().map(|c| {
                let args: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!(c.arguments));
                format!("{open}{{\"name\": {}, \"{}\": {args}}}{close}", json!(c.name), format.arguments_key())
            });
            let text = m.content.trim().lines().map(str::to_string).chain(calls).collect::<Vec<_>>().join("\n");
            out.push(ChatMessage::new(m.role.as_str(), text));
        } else {
            out.push(m.clone());
        }
    }
    for m in out.iter_mut().filter(|m| m.role == "user") {
        m.tool_call_id = None;
    }
    match out.first_mut() {
        Some(first) if first.role == "system" => first.content = format!("{}\n\n{prompt}", first.content),
        _ => out.insert(0, ChatMessage::new("system", prompt)),
    }
    out
}

/// Checks the tools and the choice against each other (`Error::InvalidArg`).
pub fn check_tools(tools: &[Tool], choice: &ToolChoice) -> Result<()> {
    for (i, t) in tools.iter().enumerate() {
        if t.name.is_empty() {
            return Err(Error::InvalidArg(format!("tools[{i}].function.name must not be empty")));
        }
        if tools[..i].iter().any(|o| o.name == t.name) {
            return Err(Error::InvalidArg(format!("tools[{i}]: the name '{}' is given twice", t.name)));
        }
        if !matches!(t.parameters, Value::Null | Value::Object(_) | Value::Bool(_)) {
            return Err(Error::Grammar(format!("tools[{i}].function.parameters must be a JSON schema object")));
        }
    }
    match choice {
        ToolChoice::Required if tools.is_empty() => Err(Error::InvalidArg("toolChoice 'required' needs tools".into())),
        ToolChoice::Function(name) if !tools.iter().any(|t| &t.name == name) => {
            Err(Error::InvalidArg(format!("toolChoice names '{name}', which is not among the tools")))
        }
        _ => Ok(()),
    }
}

/// Settings that keep generated JSON on one line with single spaces: a small model given free
/// whitespace can spend its whole budget on newlines. A schema's own `x-guidance` wins.
pub(crate) fn compact_json(mut schema: Value) -> Value {
    if let Value::Object(o) = &mut schema {
        o.entry("x-guidance").or_insert_with(|| json!({ "whitespace_flexible": false, "item_separator": ", ", "key_separator": ": " }));
    }
    schema
}

/// The Lark grammar of one or more calls (one for Llama 3 or a named function) of the tools
/// `choice` allows.
pub fn calls_grammar(tools: &[Tool], choice: &ToolChoice, format: ToolFormat) -> Result<String> {
    let allowed: Vec<&Tool> = match choice {
        ToolChoice::Function(name) => tools.iter().filter(|t| &t.name == name).collect(),
        _ => tools.iter().collect(),
    };
    if allowed.is_empty() {
        return Err(Error::InvalidArg("no tool to call".into()));
    }
    let quote = |s: &str| serde_json::to_string(s).map_err(|e| Error::Grammar(e.to_string()));
    let (open, close) = format.wrap();
    let mut g = String::new();
    // Llama 3 writes one call per answer; a named function is called once, as OpenAI does.
    let single = format == ToolFormat::Llama3 || matches!(choice, ToolChoice::Function(_));
    g.push_str(if single { "start: call\n" } else { "start: call (\"\\n\" call)*\n" });
    let alternatives: Vec<String> = (0..allowed.len()).map(|i| format!("tool_{i}")).collect();
    g.push_str(&format!("call: {} ({}) {}\n", quote(open)?, alternatives.join(" | "), quote(close)?));
    for (i, t) in allowed.iter().enumerate() {
        let head = format!("{{\"name\": {}, \"{}\": ", quote(&t.name)?, format.arguments_key());
        g.push_str(&format!("tool_{i}: {} args_{i} \"}}\"\n", quote(&head)?));
        let schema = serde_json::to_string(&compact_json(parameters_schema(t))).map_err(|e| Error::Grammar(e.to_string()))?;
        g.push_str(&format!("args_{i}: %json {schema}\n"));
    }
    Ok(g)
}

static CALL_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A call id unique within the process (`call_` + 24 hex digits).
fn call_id() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    format!("call_{:016x}{:08x}", nanos ^ (u64::from(std::process::id()) << 32), CALL_COUNTER.fetch_add(1, Ordering::Relaxed) as u32)
}

/// A call's JSON object, if it names one of `tools` and has object arguments.
fn parse_call(json_text: &str, format: ToolFormat, tools: &[Tool]) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(json_text.trim()).ok()?;
    let name = v.get("name")?.as_str()?;
    let args = v.get(format.arguments_key()).or_else(|| v.get("arguments")).or_else(|| v.get("parameters"))?;
    if !args.is_object() || !tools.iter().any(|t| t.name == name) {
        return None;
    }
    Some(ToolCall { id: call_id(), name: name.to_string(), arguments: serde_json::to_string(args).ok()? })
}

/// Splits generated text into what the model wrote besides calls and the calls it made
/// (calls of tools not offered, or not valid JSON, stay in the text).
pub fn parse_calls(text: &str, format: ToolFormat, tools: &[Tool]) -> (String, Vec<ToolCall>) {
    if format == ToolFormat::Llama3 {
        // The call is the answer's one JSON object (after any text the model wrote first).
        let start = text.find('{').unwrap_or(text.len());
        return match parse_call(&text[start..], format, tools) {
            Some(call) => (text[..start].trim().to_string(), vec![call]),
            None => (text.to_string(), Vec::new()),
        };
    }
    let (open, close) = format.wrap();
    let (open, close) = (open.trim_end(), close.trim_start());
    let mut rest = String::new();
    let mut calls = Vec::new();
    let mut s = text;
    while let Some(start) = s.find(open) {
        let body = &s[start + open.len()..];
        let Some(end) = body.find(close) else { break };
        match parse_call(&body[..end], format, tools) {
            Some(call) => {
                rest.push_str(&s[..start]);
                calls.push(call);
            }
            None => rest.push_str(&s[..start + open.len() + end + close.len()]),
        }
        s = &body[end + close.len()..];
    }
    rest.push_str(s);
    let rest = if calls.is_empty() { rest } else { rest.trim().to_string() };
    (rest, calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Tool {
        Tool {
            name: "get_weather".into(),
            description: Some("Current weather".into()),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        }
    }

    #[test]
    fn calls_and_results_become_text_for_templates_without_tools() {
        let call = ToolCall { id: "call_1".into(), name: "get_weather".into(), arguments: "{\"city\":\"Oslo\"}".into() };
        let result = |c: &str| ChatMessage { tool_call_id: Some("call_1".into()), name: Some("get_weather".into()), ..ChatMessage::new("tool", c) };
        let msgs = [
            ChatMessage::new("user", "Weather in Oslo?"),
            ChatMessage { tool_calls: vec![call], ..ChatMessage::new("assistant", "") },
            result("3 C"),
            result("windy"),
        ];
        let out = messages_with_tools_prompt(&msgs, &[weather()], ToolFormat::Fenced);
        let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert_eq!(out[2].content, "```tool_call\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo\"}}\n```");
        assert!(out[2].tool_calls.is_empty());
        assert_eq!(out[3].content, "Result of get_weather: 3 C\nResult of get_weather: windy");
        assert!(out.iter().all(|m| m.tool_call_id.is_none()));
    }

    #[test]
    fn formats_follow_the_template() {
        assert_eq!(ToolFormat::for_template(Some("{% if tools %}<tool_call>{% endif %}")), ToolFormat::Hermes);
        assert_eq!(ToolFormat::for_template(Some("<|start_header_id|>")), ToolFormat::Llama3);
        assert_eq!(ToolFormat::for_template(Some("<start_of_turn>")), ToolFormat::Fenced);
        assert_eq!(ToolFormat::for_template(None), ToolFormat::Fenced);
    }

    #[test]
    fn parses_calls_of_each_format() {
        let tools = [weather()];
        let (text, calls) = parse_calls("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", ToolFormat::Llama3, &tools);
        assert_eq!((text.as_str(), calls.len()), ("", 1));
        assert_eq!(calls[0].arguments, "{\"city\":\"Oslo\"}");
        assert!(calls[0].id.starts_with("call_"));

        let out = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";
        let (text, calls) = parse_calls(out, ToolFormat::Hermes, &tools);
        assert_eq!(text, "Let me check.");
        assert_eq!(calls.iter().map(|c| c.arguments.as_str()).collect::<Vec<_>>(), ["{\"city\":\"Oslo\"}", "{\"city\":\"Rome\"}"]);
        assert_ne!(calls[0].id, calls[1].id);

        let (text, calls) = parse_calls("```tool_call\n{\"name\": \"get_weather\", \"arguments\": {}}\n```", ToolFormat::Fenced, &tools);
        assert_eq!((text.as_str(), calls[0].name.as_str()), ("", "get_weather"));
    }

    #[test]
    fn unknown_tools_and_bad_json_stay_text() {
        let tools = [weather()];
        for out in ["```tool_call\n{\"name\": \"other\", \"arguments\": {}}\n```", "```tool_call\n{not json\n```", "plain answer"] {
            let (text, calls) = parse_calls(out, ToolFormat::Fenced, &tools);
            assert!(calls.is_empty(), "{out}");
            assert_eq!(text, out);
        }
        assert!(parse_calls("{\"name\": \"get_weather\"}", ToolFormat::Llama3, &tools).1.is_empty());
    }

    #[test]
    fn checks_tools_and_choice() {
        let tools = [weather()];
        assert!(check_tools(&tools, &ToolChoice::Function("get_weather".into())).is_ok());
        assert!(matches!(check_tools(&tools, &ToolChoice::Function("nope".into())), Err(Error::InvalidArg(_))));
        assert!(matches!(check_tools(&[], &ToolChoice::Required), Err(Error::InvalidArg(_))));
        assert!(matches!(check_tools(&[weather(), weather()], &ToolChoice::Auto), Err(Error::InvalidArg(_))));
        let bad = Tool { parameters: json!("string"), ..weather() };
        assert!(matches!(check_tools(&[bad], &ToolChoice::Auto), Err(Error::Grammar(_))));
    }

    #[test]
    fn system_prompt_describes_tools_and_format() {
        let msgs = messages_with_tools_prompt(&[ChatMessage::new("user", "hi")], &[weather()], ToolFormat::Fenced);
        assert_eq!(msgs[0].role, "system");
        assert!(msgs[0].content.contains("\"name\": \"get_weather\"") && msgs[0].content.contains("```tool_call\n{\"name\""));
        assert_eq!(msgs[1].content, "hi");
    }
}
