//! `cargo run --release -p ruvllm-router --example dump_catalogue > cat.jsonl`
//!
//! Writes the catalogue (descriptions and examples, never the held-out split) with embeddings as
//! JSON lines `{agent, source, text, v}`, for offline cross-validation experiments.
fn main() {
    let emb = ruvllm_router::router_default_embedder().unwrap_or_else(|e| panic!("{e}"));
    let specs = ruvllm_router::catalogue::default_agent_specs().expect("catalogue");
    for (ai, s) in specs.iter().enumerate() {
        let mut texts = vec![(s.description.as_str(), "description")];
        texts.extend(s.examples.iter().map(|e| (e.as_str(), "example")));
        let vs = emb.embed(&texts.iter().map(|t| t.0).collect::<Vec<_>>()).expect("embed");
        for ((t, src), v) in texts.iter().zip(vs) {
            println!("{}", serde_json::json!({"agent": ai, "name": s.name, "source": src, "text": t, "v": v}));
        }
    }
}
