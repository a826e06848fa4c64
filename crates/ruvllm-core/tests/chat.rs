//! Chat templates: the published Gemma 3, Llama 3, Qwen2 and Qwen2.5 templates rendered with
//! minijinja and compared with what Python's Jinja2 renders under transformers' settings
//! (`ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`, loop controls,
//! `raise_exception`, transformers' `tojson`): the expected strings below were produced that way
//! (jinja2 3.1.6) from the same template text.

use ruvllm_core::chat::{ChatMessage, ChatTemplate};
use ruvllm_core::gguf::writer::GgufWriter;
use ruvllm_core::gguf::{GgufFile, MetadataValue};
use ruvllm_core::tokenizer::{TokenType, Tokenizer, TokenizerSpec};

// Templates as published in the models' tokenizer_config.json (chat_template):
// google/gemma-3-*-it, meta-llama/Meta-Llama-3-8B-Instruct, Qwen/Qwen2-7B-Instruct,
// Qwen/Qwen2.5-7B-Instruct. PYCOMPAT is ours: Python string methods, loop controls, tojson.
const GEMMA3: &str = r##"{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '

' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '

' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '
' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>
' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model
'}}
{%- endif -%}
"##;

const LLAMA3: &str = r##"{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>

'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>

' }}{% endif %}"##;

const QWEN2: &str = r##"{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system
You are a helpful assistant.<|im_end|>
' }}{% endif %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %}"##;

const QWEN25: &str = r##"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"##;

const PYCOMPAT: &str = r##"{% for m in messages %}
  {% if m.role == 'system' %}{% continue %}{% endif %}
  {% if m.content.startswith('/') %}
[cmd {{ m.content[1:].strip().upper() }}]
  {% else %}
[{{ m.role }}] {{ m.content.strip() | replace('  ', ' ') }} {{ m.content.split() | length }} {{ m.content.endswith('?') }}
  {% endif %}
  {% if loop.index >= 3 %}{% break %}{% endif %}
{% endfor %}
{{ {"name": "f", "args": {"x": [1, 2.5, true, none], "s": "é\"<"}} | tojson }}
{{ {"a": [1, {"b": []}]} | tojson(indent=2) }}
"##;

const EXPECTED_GEMMA3: &str = "<bos><start_of_turn>user\nYou are a helpful assistant.\n\nHello<end_of_turn>\n<start_of_turn>model\nHi there!<end_of_turn>\n<start_of_turn>user\nHow are you?<end_of_turn>\n<start_of_turn>model\n";

const EXPECTED_GEMMA3_NOSYS_NOGEN: &str =
    "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi there!<end_of_turn>\n<start_of_turn>user\nHow are you?<end_of_turn>\n";

const EXPECTED_LLAMA3: &str = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there!<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";

const EXPECTED_LLAMA3_NOSYS_NOGEN: &str = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there!<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>";

const EXPECTED_QWEN2: &str = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there!<|im_end|>\n<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n";

const EXPECTED_QWEN2_NOSYS_NOGEN: &str = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there!<|im_end|>\n<|im_start|>user\nHow are you?<|im_end|>\n";

const EXPECTED_QWEN25: &str = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there!<|im_end|>\n<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n";

const EXPECTED_QWEN25_NOSYS_NOGEN: &str = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there!<|im_end|>\n<|im_start|>user\nHow are you?<|im_end|>\n";

const EXPECTED_PYCOMPAT: &str = "[user] Hello 1 False\n[assistant] Hi there! 2 False\n{\"name\": \"f\", \"args\": {\"x\": [1, 2.5, true, null], \"s\": \"é\\\"<\"}}\n{\n  \"a\": [\n    1,\n    {\n      \"b\": []\n    }\n  ]\n}";

const EXPECTED_PYCOMPAT_NOSYS_NOGEN: &str = "[user] Hello 1 False\n[assistant] Hi there! 2 False\n[user] How are you? 3 True\n{\"name\": \"f\", \"args\": {\"x\": [1, 2.5, true, null], \"s\": \"é\\\"<\"}}\n{\n  \"a\": [\n    1,\n    {\n      \"b\": []\n    }\n  ]\n}";

const EXPECTED_PYCOMPAT_CUSTOM: &str = "[user] Hello there world? 3 False\n[cmd RESET NOW]\n{\"name\": \"f\", \"args\": {\"x\": [1, 2.5, true, null], \"s\": \"é\\\"<\"}}\n{\n  \"a\": [\n    1,\n    {\n      \"b\": []\n    }\n  ]\n}";

const EXPECTED_GEMMA_ERR: &str = "Conversation roles must alternate user/assistant/user/assistant/...";

fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "You are a helpful assistant."),
        ChatMessage::new("user", "Hello"),
        ChatMessage::new("assistant", "Hi there!"),
        ChatMessage::new("user", "How are you?"),
    ]
}

fn check(source: &str, bos: &str, eos: &str, with_system: &str, without_system_no_prompt: &str) {
    let t = ChatTemplate::new(source, bos, eos).unwrap();
    let conv = conversation();
    assert_eq!(t.render(&conv, true).unwrap(), with_system);
    assert_eq!(t.render(&conv[1..], false).unwrap(), without_system_no_prompt);
}

#[test]
fn gemma3_template() {
    check(GEMMA3, "<bos>", "<eos>", EXPECTED_GEMMA3, EXPECTED_GEMMA3_NOSYS_NOGEN);
    // The system message is folded into the first user turn.
    assert!(EXPECTED_GEMMA3.starts_with("<bos><start_of_turn>user\nYou are a helpful assistant.\n\nHello<end_of_turn>\n"));
    assert!(EXPECTED_GEMMA3.ends_with("<start_of_turn>model\n"));
}

#[test]
fn llama3_template() {
    check(LLAMA3, "<|begin_of_text|>", "<|eot_id|>", EXPECTED_LLAMA3, EXPECTED_LLAMA3_NOSYS_NOGEN);
}

#[test]
fn qwen2_template() {
    check(QWEN2, "", "<|im_end|>", EXPECTED_QWEN2, EXPECTED_QWEN2_NOSYS_NOGEN);
    // Without a system message the template inserts its default one.
    assert!(EXPECTED_QWEN2_NOSYS_NOGEN.starts_with("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"));
}

#[test]
fn qwen25_template() {
    check(QWEN25, "", "<|im_end|>", EXPECTED_QWEN25, EXPECTED_QWEN25_NOSYS_NOGEN);
}

#[test]
fn python_compatibility() {
    check(PYCOMPAT, "<s>", "</s>", EXPECTED_PYCOMPAT, EXPECTED_PYCOMPAT_NOSYS_NOGEN);
    let t = ChatTemplate::new(PYCOMPAT, "<s>", "</s>").unwrap();
    let msgs = vec![
        ChatMessage::new("system", "sys"),
        ChatMessage::new("user", "  Hello  there  world?  "),
        ChatMessage::new("user", "/reset now "),
        ChatMessage::new("assistant", "ok."),
        ChatMessage::new("user", "never shown"),
    ];
    assert_eq!(t.render(&msgs, false).unwrap(), EXPECTED_PYCOMPAT_CUSTOM);
    // Booleans and none print as Python does.
    let t = ChatTemplate::new("{{ add_generation_prompt }} {{ none }} {{ 1 == 1 }} {{ messages | length }}", "", "").unwrap();
    assert_eq!(t.render(&[], false).unwrap(), "False None True 0");
}

#[test]
fn raise_exception_is_a_chat_template_error_with_the_message() {
    let t = ChatTemplate::new(GEMMA3, "<bos>", "<eos>").unwrap();
    let err = t.render(&[ChatMessage::new("user", "a"), ChatMessage::new("user", "b")], true).unwrap_err();
    assert_eq!(err.code(), "ERR_CHAT_TEMPLATE");
    assert!(err.to_string().contains(EXPECTED_GEMMA_ERR), "{err}");
    assert_eq!(EXPECTED_GEMMA_ERR, "Conversation roles must alternate user/assistant/user/assistant/...");
}

#[test]
fn syntax_and_runtime_errors() {
    for bad in ["{% for m in messages %}{{ m.content }}", "{{ messages[0] ", "{% if %}x{% endif %}", "{% endfor %}"] {
        let err = ChatTemplate::new(bad, "", "").unwrap_err();
        assert_eq!(err.code(), "ERR_CHAT_TEMPLATE", "{bad}");
        assert!(err.to_string().contains("does not compile"), "{err}");
    }
    // Errors while rendering (calling an undefined function, indexing past the end...).
    let t = ChatTemplate::new("{{ no_such_function() }}", "", "").unwrap();
    assert_eq!(t.render(&conversation(), true).unwrap_err().code(), "ERR_CHAT_TEMPLATE");
    let t = ChatTemplate::new("{{ messages[0]['content'].nope() }}", "", "").unwrap();
    assert_eq!(t.render(&conversation(), true).unwrap_err().code(), "ERR_CHAT_TEMPLATE");
}

#[test]
fn strftime_now_is_available() {
    let t = ChatTemplate::new("{{ strftime_now('%Y') }}", "", "").unwrap();
    let year: i32 = t.render(&[], false).unwrap().parse().unwrap();
    assert!(year >= 2024);
}

/// A synthetic GGUF with a tiny SentencePiece vocabulary and a chat template.
fn gguf_with(template: Option<MetadataValue>) -> GgufFile {
    let tokens = ["<unk>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "a", "▁"];
    let types = [2, 3, 3, 3, 3, 1, 1];
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", MetadataValue::String("gemma3".into()));
    w.add_metadata("tokenizer.ggml.model", MetadataValue::String("llama".into()));
    w.add_metadata("tokenizer.ggml.tokens", MetadataValue::Array(tokens.iter().map(|t| MetadataValue::String(t.to_string())).collect()));
    w.add_metadata("tokenizer.ggml.scores", MetadataValue::Array(tokens.iter().map(|_| MetadataValue::F32(0.0)).collect()));
    w.add_metadata("tokenizer.ggml.token_type", MetadataValue::Array(types.iter().map(|&t| MetadataValue::I32(t)).collect()));
    w.add_metadata("tokenizer.ggml.bos_token_id", MetadataValue::U32(1));
    w.add_metadata("tokenizer.ggml.eos_token_id", MetadataValue::U32(2));
    if let Some(t) = template {
        w.add_metadata("tokenizer.chat_template", t);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chat.gguf");
    w.write(&path).unwrap();
    let file = GgufFile::open(&path).unwrap();
    drop(dir);
    file
}

#[test]
fn from_gguf_loads_the_template() {
    let file = gguf_with(Some(MetadataValue::String(GEMMA3.to_string())));
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let t = ChatTemplate::from_gguf(&file, &tok).unwrap().expect("template present");
    // bos_token comes from the tokenizer ("<bos>").
    assert_eq!(t.render(&conversation(), true).unwrap(), EXPECTED_GEMMA3);
    let prompt = t.render(&conversation(), true).unwrap();
    let ids = tok.encode(&prompt, false, true).unwrap();
    assert_eq!(ids[0], 1, "the rendered <bos> parses as the BOS token");
    assert_eq!(ids.iter().filter(|&&i| i == 3).count(), 4);

    // No template: None, so the caller can give a clear error.
    let file = gguf_with(None);
    let tok = Tokenizer::from_gguf(&file).unwrap();
    assert!(ChatTemplate::from_gguf(&file, &tok).unwrap().is_none());

    // A template that is not a string, or does not compile.
    let file = gguf_with(Some(MetadataValue::U32(7)));
    let tok = Tokenizer::from_gguf(&file).unwrap();
    assert_eq!(ChatTemplate::from_gguf(&file, &tok).unwrap_err().code(), "ERR_GGUF_INVALID");
    let file = gguf_with(Some(MetadataValue::String("{% for %}".into())));
    let tok = Tokenizer::from_gguf(&file).unwrap();
    assert_eq!(ChatTemplate::from_gguf(&file, &tok).unwrap_err().code(), "ERR_CHAT_TEMPLATE");
}

#[test]
fn works_with_a_spec_built_tokenizer_too() {
    // The template only needs the BOS/EOS texts; a tokenizer built from a spec provides them.
    let spec = TokenizerSpec::sentencepiece(
        vec!["<unk>".into(), "<s>".into(), "</s>".into(), "a".into()],
        vec![0.0; 4],
        vec![TokenType::Unknown, TokenType::Control, TokenType::Control, TokenType::Normal],
    );
    let tok = Tokenizer::from_spec(spec).unwrap();
    let bos = tok.token_text(tok.bos_id().unwrap()).unwrap();
    let t = ChatTemplate::new(LLAMA3, bos, "</s>").unwrap();
    assert!(t.render(&conversation(), true).unwrap().starts_with("<s><|start_header_id|>system"));
}

/// Constructs from recent templates (Qwen3-style reasoning split, reversed slices, namespace,
/// Python string methods); expected output rendered by Jinja2 3.1.6 with transformers' settings.
const RECENT_CONSTRUCTS: &str = r##"{%- set ns = namespace(last_user=-1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.last_user == -1 and message.role == "user" %}
        {%- set ns.last_user = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content %}
    {%- if '</think>' in content %}
        {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
        {%- set content = content.split('</think>')[-1].lstrip('\n') %}
{{ loop.index0 }}|{{ message.role }}|{{ reasoning }}|{{ content }}|{{ loop.index0 > ns.last_user }}
    {%- else %}
{{ loop.index0 }}|{{ message.role }}|{{ content.replace('o', '0').capitalize() }}|{{ content.count('o') }}|{{ content.find('w') }}
    {%- endif %}
{%- endfor %}
"##;

#[test]
fn recent_template_constructs() {
    let t = ChatTemplate::new(RECENT_CONSTRUCTS, "", "").unwrap();
    let msgs =
        vec![ChatMessage::new("user", "hello world"), ChatMessage::new("assistant", "<think>\nhmm\n</think>\n\nanswer"), ChatMessage::new("user", "now what?")];
    assert_eq!(t.render(&msgs, false).unwrap(), "0|user|Hell0 w0rld|2|61|assistant|hmm|answer|False2|user|N0w what?|1|2");
}

fn weather_tool() -> ruvllm_core::structured::Tool {
    ruvllm_core::structured::Tool {
        name: "get_weather".into(),
        description: Some("Current weather in a city".into()),
        parameters: serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    }
}

/// A conversation with a call and its answer.
fn tool_conversation() -> Vec<ChatMessage> {
    let mut call = ChatMessage::new("assistant", "");
    call.tool_calls = vec![ruvllm_core::structured::ToolCall { id: "call_1".into(), name: "get_weather".into(), arguments: "{\"city\":\"Oslo\"}".into() }];
    let mut answer = ChatMessage::new("tool", "{\"temp\": 3}");
    answer.tool_call_id = Some("call_1".into());
    answer.name = Some("get_weather".into());
    vec![ChatMessage::new("user", "Weather in Oslo?"), call, answer]
}

#[test]
fn tools_render_through_a_template_that_reads_them() {
    use ruvllm_core::structured::ToolFormat;
    // Qwen2.5's template from a synthetic GGUF: the tools in its <tools> block, the earlier
    // call as a <tool_call> with the arguments as an object, the answer as a tool response.
    let file = gguf_with(Some(MetadataValue::String(QWEN25.into())));
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let t = ChatTemplate::from_gguf(&file, &tok).unwrap().unwrap();
    assert!(t.reads_tools());
    assert_eq!(ToolFormat::for_template(Some(t.source())), ToolFormat::Hermes);
    let out = t.render_with_tools(&tool_conversation(), &[weather_tool()], true).unwrap();
    assert!(out.contains("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {"), "{out}");
    assert!(out.contains("\"description\": \"Current weather in a city\""), "{out}");
    assert!(out.contains("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"), "{out}");
    assert!(out.contains("<tool_response>\n{\"temp\": 3}\n</tool_response>"), "{out}");
    assert!(out.ends_with("<|im_start|>assistant\n"));
    // Without tools the output is what it always was.
    assert_eq!(t.render_with_tools(&conversation(), &[], true).unwrap(), EXPECTED_QWEN25);
}

#[test]
fn tools_are_described_in_a_system_message_for_templates_without_tool_support() {
    use ruvllm_core::structured::{messages_with_tools_prompt, ToolFormat};
    for (src, bos, format, call_start) in [
        (GEMMA3, "<bos>", ToolFormat::Fenced, "```tool_call\n{\"name\": <function name>, \"arguments\""),
        (LLAMA3, "<bos>", ToolFormat::Llama3, "\n{\"name\": <function name>, \"parameters\""),
        (QWEN2, "", ToolFormat::Hermes, "<tool_call>\n{\"name\": <function name>, \"arguments\""),
    ] {
        let file = gguf_with(Some(MetadataValue::String(src.into())));
        let tok = Tokenizer::from_gguf(&file).unwrap();
        let t = ChatTemplate::from_gguf(&file, &tok).unwrap().unwrap();
        assert!(!t.reads_tools());
        assert_eq!(ToolFormat::for_template(Some(t.source())), format);
        let msgs = messages_with_tools_prompt(&[ChatMessage::new("user", "Weather in Oslo?")], &[weather_tool()], format);
        let out = t.render(&msgs, true).unwrap();
        assert!(out.starts_with(bos), "{out}");
        assert!(out.contains("You can call these functions:") && out.contains("\"name\": \"get_weather\""), "{out}");
        assert!(out.contains(call_start), "{format:?}: {out}");
        assert!(out.contains("Weather in Oslo?"));
    }
}

#[test]
fn messages_without_tool_fields_still_deserialize() {
    let m: ChatMessage = serde_json::from_str("{\"role\": \"user\", \"content\": \"hi\"}").unwrap();
    assert_eq!(m, ChatMessage::new("user", "hi"));
    assert_eq!(serde_json::to_string(&m).unwrap(), "{\"role\":\"user\",\"content\":\"hi\"}");
}
