//! `cargo run --release -p ruvllm-router --example catalogue_cv [-- --leak]`
//!
//! Tuning aid that never touches the held-out test split for scoring: k-fold cross-validation
//! over the catalogue's own examples (descriptions always kept), for the default scoring
//! parameters as fitted on each training fold. With `--leak`, lists catalogue examples whose
//! cosine to some held-out test task exceeds 0.9, so near-duplicates can be removed from the
//! catalogue (the test split must stay held out).
use std::sync::Arc;

use ruvllm_router::embed::cosine;
use ruvllm_router::index::IndexConfig;
use ruvllm_router::{catalogue, AgentSpec, Params, Router};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let emb = ruvllm_router::default_embedder().unwrap_or_else(|e| panic!("{e}"));
    let specs = catalogue::default_agent_specs().expect("catalogue");
    if args.iter().any(|a| a == "--leak") {
        let tests = catalogue::test_split().expect("test");
        let tv = emb.embed(&tests.iter().map(|t| t.text.as_str()).collect::<Vec<_>>()).expect("embed");
        for s in &specs {
            let ev = emb.embed(&s.examples.iter().map(|t| t.as_str()).collect::<Vec<_>>()).expect("embed");
            for (e, v) in s.examples.iter().zip(&ev) {
                let (j, c) = tv.iter().enumerate().map(|(j, t)| (j, cosine(v, t))).fold((0, -1.0f32), |a, b| if b.1 > a.1 { b } else { a });
                if c > 0.9 {
                    println!("{c:.3}\t{}\t{e}\t<->\t{}", s.name, tests[j].text);
                }
            }
        }
        return;
    }
    let folds = 5;
    let mut correct = 0;
    let mut total = 0;
    let mut per_agent = vec![(0usize, 0usize); specs.len()];
    let mut conf_sum = 0.0f64;
    for f in 0..folds {
        let mut train = Vec::new();
        let mut held = Vec::new();
        for (ai, s) in specs.iter().enumerate() {
            let mut ex = Vec::new();
            for (i, e) in s.examples.iter().enumerate() {
                if i % folds == f {
                    held.push((e.clone(), ai));
                } else {
                    ex.push(e.clone());
                }
            }
            train.push(AgentSpec { name: s.name.clone(), description: s.description.clone(), examples: ex });
        }
        let mut r = Router::with_config(train, emb.clone(), Params::default(), IndexConfig { background: false, ..Default::default() }).expect("router");
        if f == 0 {
            eprintln!("fold 0 fitted params: {:?}", r.params());
        }
        let hv = emb.embed(&held.iter().map(|(t, _)| t.as_str()).collect::<Vec<_>>()).expect("embed");
        for ((_, ai), v) in held.iter().zip(&hv) {
            let route = r.route_vector(v).expect("route");
            let ok = route.agent == specs[*ai].name;
            correct += ok as usize;
            total += 1;
            per_agent[*ai].0 += ok as usize;
            per_agent[*ai].1 += 1;
            conf_sum += route.confidence as f64;
        }
    }
    let _ = Arc::strong_count(&emb);
    println!("{folds}-fold CV over the catalogue: {:.1} % ({correct}/{total}), mean confidence {:.3}", 100.0 * correct as f64 / total as f64, conf_sum / total as f64);
    for (s, (c, n)) in specs.iter().zip(per_agent) {
        println!("  {:20} {:.1} % ({c}/{n})", s.name, 100.0 * c as f64 / n as f64);
    }
}
