//! `cargo run --release -p ruvllm-eval --example catalogue_cv [-- --leak | --learning "1,1,0.9;2,1,0.9"]`
//!
//! Tuning aid that never touches the held-out test split for scoring: k-fold cross-validation
//! over the catalogue's own examples (descriptions always kept), for the default scoring
//! parameters as fitted on each training fold. With `--leak`, lists catalogue examples whose
//! cosine to some held-out test task exceeds 0.9, so near-duplicates can be removed from the
//! catalogue (the test split must stay held out). With `--learning`, simulates the benchmark's
//! learning protocol inside each CV fold (feed back one half of the fold's outcomes, measure the
//! other half) for each `feedback_weight,negative_weight,failure_cos[,memory_gain,memory_cos,
//! outcomes_in_head (0/1)]` setting; per setting also how many measured tasks the feedback
//! turned right and how many it turned wrong; and, once, the reference: the fed half added with
//! its true agents as examples (`--learning ref`: that alone).
use std::sync::Arc;

use ruvllm_embed::cosine;
use ruvllm_eval::bench::learn_and_measure;
use ruvllm_router::catalogue::TestTask;
use ruvllm_router::index::IndexConfig;
use ruvllm_router::{catalogue, AgentSpec, Params, Router};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let emb = ruvllm_router::router_default_embedder().unwrap_or_else(|e| panic!("{e}"));
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
        let setups = match args.iter().position(|a| a == "--shift") {
            Some(j) => shift_setups(&emb, &specs, args.get(j + 1).and_then(|x| x.parse().ok()).unwrap_or(0.3)),
            None => cv_setups(&specs, folds),
        };
        learning_sim(&emb, setups, &grid);
        return;
    }
    let mut correct = 0;
    let mut total = 0;
    let mut per_agent = vec![(0usize, 0usize); specs.len()];
    let mut conf_sum = 0.0f64;
    for (f, (train, held)) in cv_setups(&specs, folds).into_iter().enumerate() {
        let mut r = Router::with_config(train, emb.clone(), Params::default(), IndexConfig { background: false, ..Default::default() }).expect("router");
        if f == 0 {
            eprintln!("fold 0 fitted params: {:?}", r.params());
        }
        let hv = emb.embed(&held.iter().map(|(t, _, _)| t.as_str()).collect::<Vec<_>>()).expect("embed");
        for ((text, ai, _), v) in held.iter().zip(&hv) {
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
    println!(
        "{folds}-fold CV over the catalogue: {:.1} % ({correct}/{total}), mean confidence {:.3}",
        100.0 * correct as f64 / total as f64,
        conf_sum / total as f64
    );
    for (s, (c, n)) in specs.iter().zip(per_agent) {
        println!("  {:20} {:.1} % ({c}/{n})", s.name, 100.0 * c as f64 / n as f64);
    }
}

/// One learning-simulation setup: the router's training agents and the held tasks
/// `(text, agent, half)`.
type Setup = (Vec<AgentSpec>, Vec<(String, usize, usize)>);

/// CV folds: fold `f`'s examples are held (halves alternate within each agent; plain CV
/// ignores them).
fn cv_setups(specs: &[AgentSpec], folds: usize) -> Vec<Setup> {
    (0..folds)
        .map(|f| {
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
            (train, held)
        })
        .collect()
}

/// Shifted setups: per agent, the examples are ordered along the first principal direction of
/// that agent's example embeddings; the `frac` at one end are held (a coherent region of the
/// agent's tasks the router never saw, as deployment tasks may differ from the catalogue), the
/// rest train. Two setups: each end of the direction.
fn shift_setups(emb: &Arc<dyn ruvllm_router::Embedder>, specs: &[AgentSpec], frac: f32) -> Vec<Setup> {
    let mut out = vec![(Vec::new(), Vec::new()), (Vec::new(), Vec::new())];
    for (ai, s) in specs.iter().enumerate() {
        let v = emb.embed(&s.examples.iter().map(|t| t.as_str()).collect::<Vec<_>>()).expect("embed");
        let d = v[0].len();
        let mean: Vec<f32> = (0..d).map(|j| v.iter().map(|x| x[j]).sum::<f32>() / v.len() as f32).collect();
        let c: Vec<Vec<f32>> = v.iter().map(|x| x.iter().zip(&mean).map(|(a, b)| a - b).collect()).collect();
        // Power iteration for the top principal direction.
        let mut u: Vec<f32> = (0..d).map(|j| ((j * 7919 + 13) % 101) as f32 / 101.0 - 0.5).collect();
        for _ in 0..50 {
            let mut nu = vec![0.0f32; d];
            for x in &c {
                let p: f32 = x.iter().zip(&u).map(|(a, b)| a * b).sum();
                nu.iter_mut().zip(x).for_each(|(n, a)| *n += p * a);
            }
            let norm = nu.iter().map(|a| a * a).sum::<f32>().sqrt().max(1e-12);
            u = nu.iter().map(|a| a / norm).collect();
        }
        let mut order: Vec<(f32, usize)> = c.iter().enumerate().map(|(i, x)| (x.iter().zip(&u).map(|(a, b)| a * b).sum(), i)).collect();
        order.sort_by(|a, b| a.0.total_cmp(&b.0));
        let n_held = ((s.examples.len() as f32) * frac).round() as usize;
        for (side, setup) in out.iter_mut().enumerate() {
            let held_ids: Vec<usize> =
                if side == 0 { order[..n_held].iter().map(|o| o.1).collect() } else { order[order.len() - n_held..].iter().map(|o| o.1).collect() };
            let mut ex = Vec::new();
            for (i, e) in s.examples.iter().enumerate() {
                if let Some(j) = held_ids.iter().position(|&h| h == i) {
                    setup.1.push((e.clone(), ai, j % 2));
                } else {
                    ex.push(e.clone());
                }
            }
            setup.0.push(AgentSpec { name: s.name.clone(), description: s.description.clone(), examples: ex });
        }
    }
    out
}

fn bad_grid(x: &str) -> f32 {
    eprintln!("--learning: {x:?} is not a number (settings are comma-separated numbers, ';' between settings, or `ref`)");
    std::process::exit(2)
}

fn learning_sim(emb: &Arc<dyn ruvllm_router::Embedder>, setups: Vec<Setup>, grid: &str) {
    // `--learning ref`: the reference alone.
    let settings: Vec<Vec<f32>> = if grid == "ref" {
        Vec::new()
    } else {
        grid.split(';').map(|g| g.split(',').map(|x| x.trim().parse().unwrap_or_else(|_| bad_grid(x))).collect()).collect()
    };
    // [setting][variant][direction] = (before, after, total)
    let mut acc = vec![vec![[(0usize, 0usize, 0usize); 2]; 2]; settings.len()];
    // [setting] = [wrong -> right, right -> wrong] over all variants and directions.
    let mut flips = vec![[0usize; 2]; settings.len()];
    // The reference, per direction: the fed half added with its true agents as examples (head
    // retrained), as the bench's `labelled examples` rows: (before, after, total).
    let mut labelled = [(0usize, 0usize, 0usize); 2];
    for (f, (train, held)) in setups.into_iter().enumerate() {
        let specs = train.clone();
        let cfg = || IndexConfig { background: false, ..Default::default() };
        let base = Router::with_config(train, emb.clone(), Params::default(), cfg()).expect("router");
        let json = base.to_json().expect("json");
        let hv = emb.embed(&held.iter().map(|(t, _, _)| t.as_str()).collect::<Vec<_>>()).expect("embed");
        // The held examples as a test split (no follow-ups); half `dir` is fed, the other measured.
        let tasks: Vec<TestTask> =
            held.iter().map(|(t, ai, _)| TestTask { text: t.clone(), agent: specs[*ai].name.clone(), difficulty: String::new(), follows: None }).collect();
        let run = |r: &Router, dir: usize, variant: &str| {
            learn_and_measure(r, &tasks, &hv, &|i| held[i].2 == dir, &|i| held[i].2 != dir, variant).expect("learning run")
        };
        for (dir, e) in labelled.iter_mut().enumerate() {
            let o = run(&base, dir, "labelled examples");
            (e.0, e.1, e.2) = (e.0 + o.before, e.1 + o.after, e.2 + o.total);
        }
        for (si, st) in settings.iter().enumerate() {
            let mut r = Router::from_json(&json, std::path::Path::new("<mem>"), emb.clone(), cfg()).expect("clone");
            let mut p = r.params().clone();
            p.feedback_weight = st[0];
            p.max_weight = p.max_weight.max(st[0]);
            p.negative_weight = st[1];
            p.failure_cos = st[2];
            if let Some(&g) = st.get(3) {
                p.memory_gain = g;
            }
            if let Some(&c) = st.get(4) {
                p.memory_cos = c;
            }
            if let Some(&h) = st.get(5) {
                p.outcomes_in_head = h != 0.0;
            }
            r.set_params(p);
            for (variant, name) in ["outcomes", "outcomes+retry"].into_iter().enumerate() {
                for (dir, e) in acc[si][variant].iter_mut().enumerate() {
                    let o = run(&r, dir, name);
                    // A measured task can only turn right or wrong if its routing changed.
                    for (i, b, a) in &o.changed {
                        let truth = &tasks[*i].agent;
                        flips[si][0] += (b != truth && a == truth) as usize;
                        flips[si][1] += (b == truth && a != truth) as usize;
                    }
                    (e.0, e.1, e.2) = (e.0 + o.before, e.1 + o.after, e.2 + o.total);
                }
            }
        }
        eprintln!("setup {f} done");
    }
    for (dir, (b, af, t)) in ["A->B", "B->A"].iter().zip(labelled) {
        println!("labelled examples (reference)\t{dir}\t{b}/{t} -> {af}/{t}\t({:+})", af as i64 - b as i64);
    }
    for ((st, a), fl) in settings.iter().zip(&acc).zip(&flips) {
        let mut sum = 0i64;
        for (variant, v) in ["outcomes", "outcomes+retry"].iter().zip(a) {
            for (dir, (b, af, t)) in ["A->B", "B->A"].iter().zip(v) {
                println!("{st:?}\t{variant}\t{dir}\t{b}/{t} -> {af}/{t}\t({:+})", *af as i64 - *b as i64);
                sum += *af as i64 - *b as i64;
            }
        }
        println!("{st:?}\tsum {sum:+}\t(gained {}, lost {})", fl[0], fl[1]);
    }
}
