//! `cargo run --release -p ruvllm-eval --example memory_latency [-- outcomes rounds]`
//!
//! Route latency (no embedding) with the outcome memory holding `outcomes` stored outcomes
//! (default 1000: catalogue example vectors with noise, alternating successes and failures),
//! memory on vs off, alternating rounds in one process; prints medians over rounds of the per
//! round p50.
use ruvllm_router::index::IndexConfig;
use ruvllm_router::{catalogue, Params, Router};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let rounds: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(7);
    let emb = ruvllm_router::router_default_embedder().unwrap_or_else(|e| panic!("{e}"));
    let specs = catalogue::default_agent_specs().expect("catalogue");
    let tests = catalogue::test_split().expect("test split");
    let mut r = Router::with_config(specs, emb.clone(), Params::default(), IndexConfig { background: false, ..Default::default() }).expect("router");
    let on = r.params().clone();
    // Feed the outcomes without retraining the head (the memory's content does not depend on it).
    let mut quiet = on.clone();
    quiet.outcomes_in_head = false;
    r.set_params(quiet);
    let base: Vec<(String, usize, Vec<f32>)> = r.patterns().iter().enumerate().map(|(i, p)| (p.text.clone(), p.agent, r.index().vector(i).to_vec())).collect();
    let mut seed = 0x2545F4914F6CDD1Du64;
    let mut noise = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f32 / (1u64 << 53) as f32 - 0.5
    };
    for i in 0..n {
        let (text, agent, v) = &base[i % base.len()];
        let v: Vec<f32> = ruvllm_embed::l2_normalized(v.iter().map(|x| x + 0.2 * noise()).collect());
        r.feedback_vector(text, &v, *agent, i % 2 == 0).expect("feedback");
    }
    r.set_params(on.clone());
    let vecs = emb.embed(&tests.iter().map(|t| t.text.as_str()).collect::<Vec<_>>()).expect("embed");
    let mut off = on.clone();
    off.memory_gain = 0.0;
    let mut p50 = [Vec::new(), Vec::new()];
    for _ in 0..rounds {
        for (k, p) in [&on, &off].into_iter().enumerate() {
            r.set_params(p.clone());
            let mut ts = Vec::new();
            for _ in 0..5 {
                for (t, v) in tests.iter().zip(&vecs) {
                    let s = std::time::Instant::now();
                    std::hint::black_box(r.route_vector(&t.text, v).expect("route"));
                    ts.push(s.elapsed().as_secs_f64() * 1e6);
                }
            }
            ts.sort_by(|a, b| a.total_cmp(b));
            p50[k].push(ts[ts.len() / 2]);
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (a, b) = (med(&mut p50[0]), med(&mut p50[1]));
    println!(
        "{} stored outcomes, {} patterns; route p50 (median of {rounds} alternating rounds): memory on {a:.1} µs, off {b:.1} µs, ratio {:.2}",
        n,
        r.patterns().len(),
        a / b
    );
}
