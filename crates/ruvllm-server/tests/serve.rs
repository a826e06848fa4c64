//! The server over the real Gemma 3 270M, through plain HTTP/1.1 on loopback: what a client sees
//! (status, error codes, SSE framing) and what it does to the engine (a client that hangs up
//! cancels its request, `close` ends everything). The OpenAI client's view is tested in JS.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ruvllm_core::engine::{Engine, LoadOptions};
use ruvllm_server::{Server, ServerOptions};
use serde_json::{json, Value};

fn engine() -> Arc<Engine> {
    let path = ruvllm_models::real_test_model().unwrap_or_else(|e| panic!("{e}"));
    Arc::new(Engine::load(&path, LoadOptions { context_size: Some(1024), threads: Some(2), ..Default::default() }).expect("load real model"))
}

/// A plain transcript: the test model is a base model and ships no chat template.
const PLAIN: &str =
    "{{ bos_token }}{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";

fn start(engine: &Arc<Engine>, o: ServerOptions) -> Server {
    let o = ServerOptions { port: 0, model_id: "gemma".into(), chat_template: Some(PLAIN.into()), chat_stops: vec!["\nuser:".into()], ..o };
    Server::start(engine.clone(), o).expect("server starts")
}

/// Sends one request (`Connection: close`) and returns status and body.
fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).expect("timeout");
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).expect("write");
    let _ = s.write_all(body);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

fn post(addr: SocketAddr, path: &str, v: &Value) -> (u16, Value) {
    let (status, body) = request(addr, "POST", path, &[("Content-Type", "application/json")], v.to_string().as_bytes());
    (status, serde_json::from_str(&body).unwrap_or(Value::String(body)))
}

fn health(addr: SocketAddr) -> Value {
    let (_, body) = request(addr, "GET", "/health", &[], b"");
    serde_json::from_str(&body).expect("health is JSON")
}

#[test]
fn endpoints_errors_and_cancellation() {
    let engine = engine();
    let mut server = start(&engine, ServerOptions { max_body_bytes: 64 << 10, parallel: 1, ..Default::default() });
    let addr = server.local_addr();

    let chat = json!({ "model": "x", "messages": [{ "role": "user", "content": "Say hi" }], "max_tokens": 4, "temperature": 0 });
    let (status, v) = post(addr, "/v1/chat/completions", &chat);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    let n = v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    assert!((1..=4).contains(&n), "{v}");
    assert!(v["choices"][0]["finish_reason"] == "length" || v["choices"][0]["finish_reason"] == "stop", "{v}");

    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({ "include_usage": true });
    let (status, body) = request(addr, "POST", "/v1/chat/completions", &[], streamed.to_string().as_bytes());
    assert_eq!(status, 200);
    let events: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{body}");
    let text: String = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, v["choices"][0]["message"]["content"].as_str().unwrap_or_default(), "greedy stream = greedy answer");
    let usage: Value = serde_json::from_str(events[events.len() - 2]).expect("usage chunk");
    assert_eq!(usage["usage"]["completion_tokens"], n);

    let (status, v) = post(addr, "/v1/completions", &json!({ "prompt": "The sky is", "max_tokens": 3, "temperature": 0 }));
    assert_eq!((status, v["object"].as_str()), (200, Some("text_completion")), "{v}");

    let (status, v) = post(addr, "/v1/embeddings", &json!({ "input": ["a", "b c"] }));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["data"].as_array().map(Vec::len), Some(2));
    assert_eq!(v["data"][0]["embedding"].as_array().map(Vec::len), Some(engine.info().embedding_length));

    // Errors: malformed JSON, a wrong type, an unknown path, a body over the limit, a prompt
    // over the context.
    let (status, body) = request(addr, "POST", "/v1/chat/completions", &[], b"{nope");
    assert_eq!(status, 400);
    assert_eq!(serde_json::from_str::<Value>(&body).expect("error JSON")["error"]["code"], "ERR_INVALID_JSON");
    let (status, v) = post(addr, "/v1/chat/completions", &json!({ "messages": "hi" }));
    assert_eq!((status, &v["error"]["param"]), (400, &json!("messages")));
    assert_eq!(request(addr, "GET", "/v2/nothing", &[], b"").0, 404);
    assert_eq!(request(addr, "GET", "/v1/chat/completions", &[], b"").0, 405);
    let (status, _) = request(addr, "POST", "/v1/completions", &[], &vec![b' '; 100 << 10]);
    assert_eq!(status, 413);
    let (status, v) = post(addr, "/v1/completions", &json!({ "prompt": "word ".repeat(2000), "max_tokens": 1 }));
    assert_eq!((status, &v["error"]["code"]), (400, &json!("ERR_CONTEXT_OVERFLOW")));

    // A streaming client that hangs up: the engine stops and the slot frees.
    for stream in [true, false] {
        let long = json!({ "messages": [{ "role": "user", "content": "Write a long story" }], "max_tokens": 900, "stream": stream });
        let mut s = TcpStream::connect(addr).expect("connect");
        let body = long.to_string();
        write!(s, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}", body.len()).expect("write");
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(health(addr)["running"], 1);
        drop(s);
        let t = Instant::now();
        while health(addr)["running"] != 0 {
            assert!(t.elapsed() < Duration::from_secs(5), "the request was not cancelled (stream: {stream})");
            std::thread::sleep(Duration::from_millis(20));
        }
        // The engine is free again: a short request answers at once.
        let t = Instant::now();
        assert_eq!(post(addr, "/v1/chat/completions", &chat).0, 200);
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    server.close();
    assert!(TcpStream::connect(addr).is_err() || request(addr, "GET", "/health", &[], b"").0 == 0);
}

#[test]
fn api_key_and_queue_limit() {
    let engine = engine();
    let server = start(&engine, ServerOptions { api_key: Some("sekret".into()), parallel: 1, max_queue: 1, ..Default::default() });
    let addr = server.local_addr();
    assert_eq!(request(addr, "GET", "/v1/models", &[], b"").0, 401);
    assert_eq!(request(addr, "GET", "/v1/models", &[("Authorization", "Bearer nope")], b"").0, 401);
    assert_eq!(request(addr, "GET", "/v1/models", &[("Authorization", "Bearer sekret")], b"").0, 200);
    assert_eq!(request(addr, "GET", "/health", &[], b"").0, 200);

    // One running, one queued: the third gets 429.
    let long = json!({ "prompt": "Once upon a time", "max_tokens": 200 }).to_string();
    let auth = [("Authorization", "Bearer sekret")];
    let spawn = |body: String| std::thread::spawn(move || request(addr, "POST", "/v1/completions", &auth, body.as_bytes()).0);
    let a = spawn(long.clone());
    std::thread::sleep(Duration::from_millis(200));
    let b = spawn(long.clone());
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(request(addr, "POST", "/v1/completions", &auth, long.as_bytes()).0, 429);
    assert_eq!((a.join().ok(), b.join().ok()), (Some(200), Some(200)));
}
