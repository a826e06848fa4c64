//! `cargo run --release -p ruvllm-eval --example embed_latency [-- "<text>" [iterations]]`
//! Latency of embedding one text on one thread (the target: < 5 ms).
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let text = args.get(1).cloned().unwrap_or_else(|| "Fix the crash when opening the settings screen".into());
    let iters: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(200);
    let emb = match ruvllm_embed::default_embedder() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error [{}]: {e}", e.code());
            std::process::exit(1);
        }
    };
    let mut ts = Vec::with_capacity(iters);
    for _ in 0..iters.max(1) + 5 {
        let t = std::time::Instant::now();
        if let Err(e) = emb.embed(&[&text]) {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
        ts.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mut ts = ts.split_off(5);
    ts.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| ts[((ts.len() - 1) as f64 * p).round() as usize];
    println!("embed one text ({} chars), {} runs: min {:.2} ms, p50 {:.2} ms, p99 {:.2} ms", text.len(), ts.len(), ts[0], q(0.5), q(0.99));
}
