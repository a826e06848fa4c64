//! `cargo run --release -p ruvllm-router --example catalogue_cv [-- --leak | --learning "1,1,0.9;2,1,0.9"]`
//!
//! Tuning aid that never touches the held-out test split for scoring: k-fold cross-validation
//! over the catalogue's own examples (descriptions always kept), for the default scoring
//! parameters as fitted on each training fold. With `--leak`, lists catalogue examples whose
//! cosine to some held-out test task exceeds 0.9, so near-duplicates can be removed from the
//! catalogue (the test split must stay held out). With `--learning`, simulates the benchmark's
//! learning protocol inside each CV fold (feed back one half of the fold's outcomes, measure the
//! other half) for each `feedback_weight,negative_weight,failure_cos` triple.
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
    if let Some(i) = args.iter().position(|a| a == "--learning") {
        // Simulates the benchmark's learning protocol on the catalogue: for each fold, a router
        // built from the other folds; the fold's examples split in two halves (alternating within
        // each agent); feed back one half's outcomes, measure the other half. Parameters from
        // `--learning feedback_weight,negative_weight,failure_cos` triples separated by ';'.
        let grid = args.get(i + 1).cloned().unwrap_or_else(|| "2,1,0.9".into());
        learning_sim(&emb, &specs, folds, &grid);
        return;
    }
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
        for ((text, ai), v) in held.iter().zip(&hv) {
            let route = r.route_vector(text, v).expect("route");
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

fn learning_sim(emb: &Arc<dyn ruvllm_router::Embedder>, specs: &[AgentSpec], folds: usize, grid: &str) {
    let settings: Vec<Vec<f32>> = grid.split(';').map(|g| g.split(',').map(|x| x.trim().parse().expect("number")).collect()).collect();
    // [setting][variant][direction] = (before, after, total)
    let mut acc = vec![vec![[(0usize, 0usize, 0usize); 2]; 2]; settings.len()];
    for f in 0..folds {
        let mut train = Vec::new();
        let mut held = Vec::new();
        for (ai, s) in specs.iter().enumerate() {
            let mut ex = Vec::new();
            let mut j = 0;
            for (i, e) in s.examples.iter().enumerate() {
                if i % folds == f {
                    held.push((e.clone(), ai, j % 2));
                    j += 1;
                } else {
                    ex.push(e.clone());
                }
            }
            train.push(AgentSpec { name: s.name.clone(), description: s.description.clone(), examples: ex });
        }
        let cfg = || IndexConfig { background: false, ..Default::default() };
        let base = Router::with_config(train, emb.clone(), Params::default(), cfg()).expect("router");
        let json = base.to_json().expect("json");
        let hv = emb.embed(&held.iter().map(|(t, _, _)| t.as_str()).collect::<Vec<_>>()).expect("embed");
        for (si, st) in settings.iter().enumerate() {
            for variant in 0..2 {
                for dir in 0..2 {
                    let mut r = Router::from_json(&json, std::path::Path::new("<mem>"), emb.clone(), cfg()).expect("clone");
                    let mut p = r.params().clone();
                    p.feedback_weight = st[0];
                    p.negative_weight = st[1];
                    p.failure_cos = st[2];
                    r.set_params(p);
                    let score = |r: &mut Router| {
                        held.iter().zip(&hv).filter(|(h, _)| h.2 != dir).filter(|((t, ai, _), v)| r.route_vector(t, v).expect("route").agent == specs[*ai].name).count()
                    };
                    let before = score(&mut r);
                    for ((t, ai, _), v) in held.iter().zip(&hv).filter(|(h, _)| h.2 == dir) {
                        let routed = r.route_vector(t, v).expect("route").agent;
                        let a = r.agent_index(&routed).expect("agent");
                        let ok = a == *ai;
                        r.feedback_vector(t, v, a, ok).expect("feedback");
                        if !ok && variant == 1 {
                            r.feedback_vector(t, v, *ai, true).expect("feedback");
                        }
                    }
                    let after = score(&mut r);
                    let total = held.iter().filter(|h| h.2 != dir).count();
                    let e = &mut acc[si][variant][dir];
                    e.0 += before;
                    e.1 += after;
                    e.2 += total;
                }
            }
        }
        eprintln!("fold {f} done");
    }
    for (st, a) in settings.iter().zip(&acc) {
        for (variant, v) in ["outcomes", "outcomes+retry"].iter().zip(a) {
            for (dir, (b, af, t)) in ["A->B", "B->A"].iter().zip(v) {
                println!("{st:?}\t{variant}\t{dir}\t{b}/{t} -> {af}/{t}\t({:+})", *af as i64 - *b as i64);
            }
        }
    }
}
