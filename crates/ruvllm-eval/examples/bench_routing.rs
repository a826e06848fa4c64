//! `cargo run --release -p ruvllm-eval --example bench_routing [-- --json] [--sizes 5000,50000] [--halvings N]`
//! The same benchmark as `npx ruvllm bench routing`, without Node.
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let json = args.iter().any(|a| a == "--json");
    let mut opts = ruvllm_eval::bench::BenchOptions::default();
    if let Some(i) = args.iter().position(|a| a == "--sizes") {
        if let Some(v) = args.get(i + 1) {
            opts.scale_sizes = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
        }
    }
    if let Some(i) = args.iter().position(|a| a == "--halvings") {
        opts.halvings = args.get(i + 1).and_then(|x| x.parse().ok()).unwrap_or_else(|| {
            eprintln!("error [ERR_INVALID_ARG]: --halvings takes a whole number (0 skips the random halvings)");
            std::process::exit(1);
        });
    }
    let emb = match ruvllm_router::router_default_embedder() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error [{}]: {e}", e.code());
            std::process::exit(1);
        }
    };
    match ruvllm_eval::bench::run(emb, &opts, &mut |m| eprintln!("… {m}")) {
        Ok(r) if json => println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default()),
        Ok(r) => println!("{}", r.to_markdown()),
        Err(e) => {
            eprintln!("error [{}]: {e}", e.code());
            std::process::exit(1);
        }
    }
}
