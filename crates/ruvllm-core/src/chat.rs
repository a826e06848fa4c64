//! Chat templates from `tokenizer.chat_template`, rendered with minijinja (with the Python-ish
//! string methods HF templates use: pycompat), as transformers does: `trim_blocks` and
//! `lstrip_blocks` on, `raise_exception(msg)`, `strftime_now(fmt)`, a Python-compatible `tojson`,
//! and the variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token`.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, ErrorKind, Value};

use crate::structured::{template_tool, Tool, ToolCall};
use crate::{Error, Result};

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` (or whatever roles the template knows).
    pub role: String,
    /// The message text.
    pub content: String,
    /// An assistant message's tool calls (as a completion returned them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// A `tool` message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A `tool` message: the function's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { role: role.into(), content: content.into(), tool_calls: Vec::new(), tool_call_id: None, name: None }
    }

    /// The message as HF templates read it: tool calls as
    /// `{id, type: "function", function: {name, arguments}}` with the arguments as an object
    /// (templates `tojson` them).
    fn template_value(&self) -> serde_json::Value {
        let mut v = serde_json::json!({ "role": self.role, "content": self.content });
        if !self.tool_calls.is_empty() {
            let calls: Vec<serde_json::Value> = self
                .tool_calls
                .iter()
                .map(|c| {
                    let args = serde_json::from_str::<serde_json::Value>(&c.arguments).unwrap_or_else(|_| serde_json::Value::String(c.arguments.clone()));
                    serde_json::json!({ "id": c.id, "type": "function", "function": { "name": c.name, "arguments": args } })
                })
                .collect();
            v["tool_calls"] = serde_json::Value::Array(calls);
        }
        if let Some(id) = &self.tool_call_id {
            v["tool_call_id"] = serde_json::json!(id);
        }
        if let Some(name) = &self.name {
            v["name"] = serde_json::json!(name);
        }
        v
    }
}

const TEMPLATE_NAME: &str = "chat_template";

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The template text (what it supports, e.g. tools, is read from it).
    source: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("bos_token", &self.bos_token).field("eos_token", &self.eos_token).finish_non_exhaustive()
    }
}

/// Marks errors raised by the template itself through `raise_exception`.
#[derive(Debug)]
struct RaisedByTemplate;

impl std::fmt::Display for RaisedByTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("raised by the template")
    }
}

impl std::error::Error for RaisedByTemplate {}

fn raise_exception(msg: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg).with_source(RaisedByTemplate))
}

impl ChatTemplate {
    /// Compiles a template; `Error::ChatTemplate` on syntax errors.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        // As transformers' ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.set_formatter(python_formatter);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| Error::ChatTemplate(format!("the chat template does not compile: {}", describe(&e))))?;
        Ok(ChatTemplate { env, source: source.to_string(), bos_token: bos_token.to_string(), eos_token: eos_token.to_string() })
    }

    /// From the GGUF (`tokenizer.chat_template`); `Ok(None)` when the model ships none.
    /// `bos_token` / `eos_token` are the texts of the tokenizer's BOS and EOS tokens.
    pub fn from_gguf(file: &crate::gguf::GgufFile, tok: &crate::tokenizer::Tokenizer) -> Result<Option<Self>> {
        let Some(value) = file.get("tokenizer.chat_template") else { return Ok(None) };
        let source = value.as_str().ok_or_else(|| Error::gguf(file.path.clone(), "tokenizer.chat_template is not a string"))?;
        let text = |id: Option<u32>| id.and_then(|id| tok.token_text(id)).unwrap_or("").to_string();
        Self::new(source, &text(tok.bos_id()), &text(tok.eos_id())).map(Some)
    }

    /// The template's source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the template renders a `tools` variable (HF tool-use templates do).
    pub fn reads_tools(&self) -> bool {
        self.source.contains("tools")
    }

    /// Renders messages (`add_generation_prompt` = start the assistant's turn).
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, &[], add_generation_prompt)
    }

    /// Renders messages with `tools` in the template's `tools` variable (left undefined when
    /// there are none, as templates test `if tools`).
    pub fn render_with_tools(&self, messages: &[ChatMessage], tools: &[Tool], add_generation_prompt: bool) -> Result<String> {
        let template = self.env.get_template(TEMPLATE_NAME).map_err(|e| Error::ChatTemplate(describe(&e)))?;
        let messages: Vec<serde_json::Value> = messages.iter().map(ChatMessage::template_value).collect();
        let tools: Option<Vec<serde_json::Value>> = (!tools.is_empty()).then(|| tools.iter().map(template_tool).collect());
        let ctx = minijinja::context! {
            messages => messages,
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        template.render(ctx).map_err(|e| {
            if is_raised(&e) {
                Error::ChatTemplate(e.detail().unwrap_or("the template raised an exception").to_string())
            } else {
                Error::ChatTemplate(format!("rendering the chat template failed: {}", describe(&e)))
            }
        })
    }
}

/// Prints values as Jinja2 does under Python: `True`/`False`/`None`; everything else as minijinja.
fn python_formatter(out: &mut minijinja::Output, state: &minijinja::State, value: &Value) -> std::result::Result<(), minijinja::Error> {
    match value.kind() {
        ValueKind::Bool => out.write_str(if value.is_true() { "True" } else { "False" }).map_err(minijinja::Error::from),
        ValueKind::None => out.write_str("None").map_err(minijinja::Error::from),
        _ => minijinja::escape_formatter(out, state, value),
    }
}

fn is_raised(e: &minijinja::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.is::<RaisedByTemplate>() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// One line: what went wrong and where.
fn describe(e: &minijinja::Error) -> String {
    let mut out = e.kind().to_string();
    if let Some(detail) = e.detail() {
        let _ = write!(out, ": {detail}");
    }
    if let Some(line) = e.line() {
        let _ = write!(out, " (line {line})");
    }
    out
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent, separators=separators)`,
/// as transformers' `tojson` (no HTML escaping, key order kept).
fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    let _: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => {
            if let Some(n) = v.as_i64() {
                Some(" ".repeat(n.clamp(0, 64) as usize))
            } else if let Some(s) = v.as_str() {
                Some(s.to_string())
            } else {
                return Err(minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: indent must be a number or a string"));
            }
        }
    };
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() => {
            let a = v.get_item(&Value::from(0))?;
            let b = v.get_item(&Value::from(1))?;
            match (a.as_str(), b.as_str()) {
                (Some(a), Some(b)) => (a.to_string(), b.to_string()),
                _ => return Err(minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings")),
            }
        }
        _ => (if indent.is_some() { "," } else { ", " }.to_string(), ": ".to_string()),
    };
    let mut out = String::new();
    write_json(&mut out, value, indent.as_deref(), &item_sep, &key_sep, 0)?;
    Ok(Value::from(out))
}

fn write_json(out: &mut String, value: &Value, indent: Option<&str>, item_sep: &str, key_sep: &str, depth: usize) -> std::result::Result<(), minijinja::Error> {
    if depth > 128 {
        return Err(minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: value nested too deeply"));
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(ind) = indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    };
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Some(i) = value.as_i64().filter(|_| value.is_integer()) {
                let _ = write!(out, "{i}");
            } else {
                let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
                if f.is_nan() {
                    out.push_str("NaN");
                } else if f.is_infinite() {
                    out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
                } else {
                    out.push_str(&serde_json::to_string(&f).unwrap_or_else(|_| f.to_string()));
                }
            }
        }
        ValueKind::String => {
            out.push_str(&serde_json::to_string(value.as_str().unwrap_or("")).unwrap_or_default());
        }
        ValueKind::Map => {
            let keys: Vec<Value> = value.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                let key_text = match key.as_str() {
                    Some(s) => s.to_string(),
                    None => key.to_string(),
                };
                out.push_str(&serde_json::to_string(&key_text).unwrap_or_default());
                out.push_str(key_sep);
                write_json(out, &value.get_item(key)?, indent, item_sep, key_sep, depth + 1)?;
            }
            newline(out, depth);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json(out, item, indent, item_sep, key_sep, depth + 1)?;
            }
            newline(out, depth);
            out.push(']');
        }
        _ => out.push_str(&serde_json::to_string(&value.to_string()).unwrap_or_default()),
    }
    Ok(())
}

/// `strftime_now(format)`: the current UTC time formatted with the common `strftime` codes
/// (`%Y %y %m %d %e %H %I %M %S %p %b %B %a %A %j %%`), as Llama 3.1 templates use it.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    format_time(secs, &format)
}

/// The (year, month, day) of a count of days since 1970-01-01 in the proleptic Gregorian
/// calendar (Howard Hinnant's `civil_from_days`).
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// Formats seconds since the Unix epoch (UTC).
fn format_time(secs: i64, format: &str) -> String {
    const MONTHS: [&str; 12] = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (hour, minute, second) = (rem / 3600, rem / 60 % 60, rem % 60);
    let (year, month, day) = civil_from_days(days);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    const CUM: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = CUM[(month - 1) as usize] + day + i64::from(leap && month > 2);

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let m = (month - 1) as usize;
        match chars.next() {
            Some('Y') => {
                let _ = write!(out, "{year}");
            }
            Some('y') => {
                let _ = write!(out, "{:02}", year.rem_euclid(100));
            }
            Some('m') => {
                let _ = write!(out, "{month:02}");
            }
            Some('d') => {
                let _ = write!(out, "{day:02}");
            }
            Some('e') => {
                let _ = write!(out, "{day:2}");
            }
            Some('H') => {
                let _ = write!(out, "{hour:02}");
            }
            Some('I') => {
                let _ = write!(out, "{:02}", if hour % 12 == 0 { 12 } else { hour % 12 });
            }
            Some('M') => {
                let _ = write!(out, "{minute:02}");
            }
            Some('S') => {
                let _ = write!(out, "{second:02}");
            }
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('b') => out.push_str(&MONTHS[m][..3]),
            Some('B') => out.push_str(MONTHS[m]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('j') => {
                let _ = write!(out, "{yday:03}");
            }
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::format_time;

    #[test]
    fn formats_dates() {
        assert_eq!(format_time(0, "%d %b %Y %H:%M:%S %A"), "01 Jan 1970 00:00:00 Thursday");
        // 2024-07-23 14:05:09 UTC (a Tuesday), day 205 of a leap year.
        assert_eq!(format_time(1_721_743_509, "%Y-%m-%d %I:%M %p %a %j %B %%"), "2024-07-23 02:05 PM Tue 205 July %");
        assert_eq!(format_time(951_782_400, "%d %b %Y"), "29 Feb 2000");
    }
}
