//! `cargo run --release -p ruvllm-eval --example learning_probe [-- "<task prefix>" ...]`
//!
//! Diagnostic for the benchmark's learning experiment, not a benchmark and never used to choose
//! a parameter (it reads the held-out split).
//!
//! - No arguments: how the halves relate. For each held-out task, the rank of its related task
//!   (its follow-up, or the task it follows) among the other half by cosine, and whether the
//!   nearest other-half task has the same agent.
//! - Task prefixes (all from one half): feeds the other half's outcomes one by one as the bench's
//!   `outcomes+retry` variant does, and prints after each outcome how it moved each watched
//!   task's probability of its true agent and of its strongest rival
//!   (`d p(true) / d p(rival)`), then the final values.
use ruvllm_router::index::IndexConfig;
use ruvllm_router::{catalogue, Params, Router};

fn main() {
    let watch: Vec<String> = std::env::args().skip(1).collect();
    let emb = ruvllm_router::router_default_embedder().unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    let specs = catalogue::default_agent_specs().unwrap();
    let tests = catalogue::test_split().unwrap();
    let agents: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
    let half = ruvllm_eval::bench::halves(&tests, &agents);
    let build = || Router::with_config(specs.clone(), emb.clone(), Params::default(), IndexConfig { background: false, ..Default::default() }).unwrap();
    let tv = emb.embed(&tests.iter().map(|t| t.text.as_str()).collect::<Vec<_>>()).unwrap();
    if watch.is_empty() {
        // For each task: its relative's cosine and rank among the other half, and the agent of the
        // nearest other-half task.
        let mut same_nn = 0;
        let mut ranks = Vec::new();
        for (i, t) in tests.iter().enumerate() {
            let rel = ruvllm_eval::bench::related(&tests, i).unwrap();
            let mut other: Vec<(f32, usize)> = (0..tests.len()).filter(|&j| half[j] != half[i]).map(|j| (ruvllm_embed::cosine(&tv[i], &tv[j]), j)).collect();
            other.sort_by(|a, b| b.0.total_cmp(&a.0));
            let rank = other.iter().position(|o| o.1 == rel).unwrap();
            ranks.push(rank);
            same_nn += (tests[other[0].1].agent == t.agent) as usize;
        }
        ranks.sort();
        // Reference: the other half's tasks given as labelled examples (head retrained on
        // catalogue + those examples), measured on this half; against the router as built.
        let mut base = build();
        for (fed, name) in [(0usize, "A->B"), (1, "B->A")] {
            let mut oracle = build();
            let ex: Vec<(String, String)> = tests.iter().enumerate().filter(|(i, _)| half[*i] == fed).map(|(_, t)| (t.text.clone(), t.agent.clone())).collect();
            oracle.add_examples(&ex).unwrap();
            let mut right = [0usize; 2];
            let mut n = 0;
            for (i, t) in tests.iter().enumerate().filter(|(i, _)| half[*i] != fed) {
                right[0] += (base.route_vector(&t.text, &tv[i]).unwrap().agent == t.agent) as usize;
                right[1] += (oracle.route_vector(&t.text, &tv[i]).unwrap().agent == t.agent) as usize;
                n += 1;
            }
            println!("reference {name}: router as built {}/{n}, with the fed half as labelled catalogue examples (head retrained) {}/{n}", right[0], right[1]);
        }
        println!(
            "relative rank among other half: median {} ; rank0 {} ; <3 {} ; nearest other-half task same agent {}/{}",
            ranks[ranks.len() / 2],
            ranks.iter().filter(|&&r| r == 0).count(),
            ranks.iter().filter(|&&r| r < 3).count(),
            same_nn,
            tests.len()
        );
        return;
    }
    let w: Vec<usize> = watch
        .iter()
        .map(|s| {
            tests.iter().position(|t| t.text.starts_with(s.as_str())).unwrap_or_else(|| {
                eprintln!("no held-out task starts with {s:?}");
                std::process::exit(2)
            })
        })
        .collect();
    if w.iter().any(|&j| half[j] != half[w[0]]) {
        eprintln!("the watched tasks must all be in one half");
        std::process::exit(2);
    }
    let mut r = build();
    let margin = |r: &mut Router, j: usize| {
        let p = r.probabilities(&tests[j].text, &tv[j]).unwrap();
        let y = r.agent_index(&tests[j].agent).unwrap();
        let other = (0..p.len()).filter(|&a| a != y).max_by(|&a, &b| p[a].total_cmp(&p[b])).unwrap();
        (p[y], p[other], agents[other].clone())
    };
    for &j in &w {
        println!("watch [{}] {} ({}): {:?}", half[j], tests[j].text, tests[j].agent, margin(&mut r, j));
    }
    let fed = 1 - half[w[0]];
    for (i, t) in tests.iter().enumerate().filter(|(i, _)| half[*i] == fed) {
        let before: Vec<_> = w.iter().map(|&j| margin(&mut r, j)).collect();
        let routed = r.route_vector(&t.text, &tv[i]).unwrap().agent;
        let ok = routed == t.agent;
        let a = r.agent_index(&routed).unwrap();
        r.feedback_vector(&t.text, &tv[i], a, ok).unwrap();
        if !ok {
            let a = r.agent_index(&t.agent).unwrap();
            r.feedback_vector(&t.text, &tv[i], a, true).unwrap();
        }
        let after: Vec<_> = w.iter().map(|&j| margin(&mut r, j)).collect();
        let d: Vec<String> = before.iter().zip(&after).map(|(b, a)| format!("{:+.4}/{:+.4}", a.0 - b.0, a.1 - b.1)).collect();
        println!("{}\t{}\t{}->{}\t{}", d.join("  "), if ok { "ok " } else { "FIX" }, routed, t.agent, t.text);
    }
    for &j in &w {
        println!("final {} : {:?}", tests[j].text, margin(&mut r, j));
    }
}
