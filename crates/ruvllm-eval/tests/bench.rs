//! The routing benchmark's learning protocol, with the real all-MiniLM-L6-v2 model (from
//! `RUVLLM_EMBEDDER` or the model cache: `npx ruvllm models download all-minilm-l6-v2`).

use std::sync::Arc;

use ruvllm_embed::Embedder;
use ruvllm_eval::bench::{learning_over_halvings, shuffled_halves, HalvingRun};
use ruvllm_router::index::IndexConfig;
use ruvllm_router::{AgentSpec, Router};

/// all-MiniLM-L6-v2 as published.
fn embedder() -> Arc<dyn Embedder> {
    ruvllm_embed::default_embedder().unwrap_or_else(|e| {
        panic!("the embedding model is required for these tests: {e}\n(get it with `npx ruvllm models download all-minilm-l6-v2` or set RUVLLM_EMBEDDER)")
    })
}

/// The learning protocol over random halvings: the same results on one thread and on two, both
/// directions per seed, the measured half's size, and `first round` leaving the follow-ups out.
#[test]
fn learning_over_halvings_is_deterministic_and_scoped() {
    use ruvllm_router::catalogue::TestTask;
    let agents = vec![
        AgentSpec { name: "kitchen".into(), description: "cooking and baking".into(), examples: vec!["bake bread".into(), "cook pasta".into()] },
        AgentSpec { name: "garden".into(), description: "gardening".into(), examples: vec!["water the plants".into(), "mow the lawn".into()] },
    ];
    let names: Vec<String> = agents.iter().map(|a| a.name.clone()).collect();
    let router = Router::with_config(agents, embedder(), Default::default(), IndexConfig { background: false, ..Default::default() }).expect("router");
    let task = |text: &str, agent: &str, follows: Option<usize>| TestTask { text: text.into(), agent: agent.into(), difficulty: "easy".into(), follows };
    let tests = vec![
        task("roast a chicken", "kitchen", None),
        task("make pancakes for breakfast", "kitchen", None),
        task("prune the rose bushes", "garden", None),
        task("plant tulip bulbs in autumn", "garden", None),
        task("roast some vegetables", "kitchen", Some(0)),
        task("fry eggs for breakfast", "kitchen", Some(1)),
        task("trim the hedges", "garden", Some(2)),
        task("sow carrot seeds", "garden", Some(3)),
    ];
    let vecs = embedder().embed(&tests.iter().map(|t| t.text.as_str()).collect::<Vec<_>>()).expect("embed");
    let one = learning_over_halvings(&router, &tests, &vecs, &names, 1..4, false, 1).expect("halvings");
    let two = learning_over_halvings(&router, &tests, &vecs, &names, 1..4, false, 2).expect("halvings");
    let key = |runs: &[HalvingRun]| runs.iter().map(|h| (h.seed, h.fed.clone(), h.before, h.outcomes_retry, h.labelled, h.total)).collect::<Vec<_>>();
    assert_eq!(key(&one), key(&two));
    assert_eq!(one.len(), 6, "two directions per seed");
    for h in &one {
        assert_eq!(h.total, 4, "{h:?}");
        assert!(h.before <= 4 && h.outcomes_retry <= 4 && h.labelled <= 4);
        let half = shuffled_halves(&tests, &names, Some(h.seed));
        assert_eq!(half.iter().filter(|&&x| x == (h.fed == "A") as usize).count(), 4);
    }
    let first = learning_over_halvings(&router, &tests, &vecs, &names, 1..3, true, 2).expect("halvings");
    assert!(first.iter().all(|h| h.total == 2 && h.scope == "first round"), "{first:?}");
}
