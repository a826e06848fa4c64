//! `cargo run --release -p ruvllm-eval --example dump_catalogue > cat.jsonl`
//! `cargo run --release -p ruvllm-eval --example dump_catalogue -- --test > test.jsonl`
//!
//! Writes the catalogue (descriptions and examples) with embeddings as JSON lines
//! `{agent, name, source, text, v}`, for offline cross-validation experiments. With `--test`,
//! writes the held-out split instead, `{agent, name, half, text, v}` with the benchmark's learning
//! halves (`bench::halves`): for diagnostics that must say so (`tools/routing/model_classes.py`), never
//! for choosing a parameter.
fn main() {
    let emb = ruvllm_router::router_default_embedder().unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    let specs = ruvllm_router::catalogue::default_agent_specs().expect("catalogue");
    if std::env::args().any(|a| a == "--test") {
        let tests = ruvllm_router::catalogue::test_split().expect("test split");
        let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
        let half = ruvllm_eval::bench::halves(&tests, &names);
        let vs = emb.embed(&tests.iter().map(|t| t.text.as_str()).collect::<Vec<_>>()).expect("embed");
        for ((t, v), h) in tests.iter().zip(vs).zip(half) {
            let ai = names.iter().position(|n| n == &t.agent).expect("test agent in catalogue");
            println!("{}", serde_json::json!({"agent": ai, "name": t.agent, "half": h, "text": t.text, "v": v}));
        }
        return;
    }
    for (ai, s) in specs.iter().enumerate() {
        let mut texts = vec![(s.description.as_str(), "description")];
        texts.extend(s.examples.iter().map(|e| (e.as_str(), "example")));
        let vs = emb.embed(&texts.iter().map(|t| t.0).collect::<Vec<_>>()).expect("embed");
        for ((t, src), v) in texts.iter().zip(vs) {
            println!("{}", serde_json::json!({"agent": ai, "name": s.name, "source": src, "text": t, "v": v}));
        }
    }
}
