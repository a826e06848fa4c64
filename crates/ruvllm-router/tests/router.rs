//! Integration tests with the real all-MiniLM-L6-v2 model (from `RUVLLM_EMBEDDER` or the model
//! cache, which the first use fills; CI fills it with `npx ruvllm models download all-minilm-l6-v2`).

use std::sync::Arc;

use ruvllm_embed::{cosine, Embedder};
use ruvllm_router::index::IndexConfig;
use ruvllm_router::{catalogue, hooks, AgentSpec, FeedbackEffect, Router};

fn required(e: ruvllm_embed::Error) -> Arc<dyn Embedder> {
    panic!("the embedding model is required for these tests: {e}\n(get it with `npx ruvllm models download all-minilm-l6-v2` or set RUVLLM_EMBEDDER)")
}

/// all-MiniLM-L6-v2 as published: `embed()` and the routers' default.
fn embedder() -> Arc<dyn Embedder> {
    ruvllm_embed::default_embedder().unwrap_or_else(required)
}

/// all-MiniLM-L6-v2 with the routing adapter (opt-in).
fn routing_embedder() -> Arc<dyn Embedder> {
    ruvllm_embed::routing_embedder().unwrap_or_else(required)
}

fn default_router() -> Router {
    Router::new(catalogue::default_agent_specs().expect("catalogue"), embedder()).expect("router")
}

#[test]
fn embeddings_separate_meanings() {
    // `embed()`'s space: all-MiniLM-L6-v2 as published.
    let e = embedder();
    let v = e.embed(&["fix the login bug", "repair the authentication defect", "bake a chocolate cake"]).expect("embed");
    let (p, u) = (cosine(&v[0], &v[1]), cosine(&v[0], &v[2]));
    assert!(p > u + 0.3, "paraphrase {p} vs unrelated {u}");
    let pairs = catalogue::paraphrase_pairs().expect("pairs");
    let failed = |e: &Arc<dyn Embedder>| -> Vec<String> {
        pairs
            .iter()
            .filter(|pr| {
                let v = e.embed(&[&pr.text, &pr.paraphrase, &pr.unrelated]).expect("embed");
                cosine(&v[0], &v[1]) <= cosine(&v[0], &v[2])
            })
            .map(|pr| pr.text.clone())
            .collect()
    };
    // Reported in the benchmark; the test allows one borderline pair ("plan the next sprint").
    let plain = failed(&e);
    assert!(plain.len() <= 1, "paraphrase pairs not separated: {plain:?}");
    // The routing adapter's space trades some of this for agent separation: two pairs whose
    // paraphrases straddle two agents fail there (see BENCHMARKS.md); no more.
    let routing = failed(&routing_embedder());
    assert!(routing.len() <= 2, "paraphrase pairs not separated with the routing adapter: {routing:?}");
}

#[test]
fn default_router_routes_clear_tasks() {
    let mut r = default_router();
    assert_eq!(r.agents().len(), 13);
    for (task, agent) in [
        ("Write unit tests for the shopping cart", "tester"),
        ("Set up a GitHub Actions workflow that deploys to Kubernetes", "devops"),
        ("The app crashes when I open the settings page", "debugger"),
        ("Threat model the new payment API", "security-architect"),
    ] {
        let route = r.route(task).expect("route");
        assert_eq!(route.agent, agent, "{task}: {route:?}");
        assert!(route.confidence > 0.0 && route.confidence <= 1.0);
        assert_eq!(route.alternatives.len(), 3);
        assert!(route.alternatives.iter().all(|a| a.score <= route.confidence));
    }
    assert!(r.route("  ").is_err());
}

#[test]
fn feedback_learns_and_failures_lower_weights() {
    let agents = vec![
        AgentSpec { name: "kitchen".into(), description: "cooking and baking".into(), examples: vec!["bake bread".into(), "cook pasta".into()] },
        AgentSpec { name: "garden".into(), description: "gardening".into(), examples: vec!["water the plants".into(), "mow the lawn".into()] },
    ];
    let mut r = Router::new(agents, embedder()).expect("router");
    let n0 = r.patterns().len();
    match r.feedback("prune the rose bushes", "garden", true).expect("feedback") {
        FeedbackEffect::Added { pattern } => assert_eq!(pattern, n0),
        other => panic!("{other:?}"),
    }
    assert!(matches!(r.feedback("prune the rose bushes", "garden", true).expect("fb"), FeedbackEffect::Reinforced { .. }));
    let before = r.patterns()[n0].weight;
    for _ in 0..3 {
        r.feedback("prune the rose bushes", "garden", false).expect("fb");
    }
    assert!(r.patterns()[n0].weight < before * 0.5, "weight {} -> {}", before, r.patterns()[n0].weight);
    assert_eq!(r.negatives().len(), 3);
    assert!(r.feedback("x", "nobody", true).is_err());
    let err = r.add_examples(&[("t".into(), "nobody".into())]).expect_err("unknown agent");
    assert_eq!(err.code(), "ERR_INVALID_ARG");
}

#[test]
fn a_failure_pushes_that_agent_down_for_the_task() {
    let mut r = default_router();
    let task = "keep a changelog of what each release changes";
    let p0 = r.route(task).expect("route");
    r.feedback(task, &p0.agent, false).expect("fb");
    assert_eq!(r.negatives().len(), 1);
    let p1 = r.route(task).expect("route");
    let prob = |x: &ruvllm_router::Route| {
        if x.agent == p0.agent {
            x.confidence
        } else {
            x.alternatives.iter().find(|a| a.agent == p0.agent).map_or(0.0, |a| a.score)
        }
    };
    assert!(prob(&p1) < p0.confidence, "{p0:?} -> {p1:?}");
}

/// The head is retrained from scratch on every outcome, so what the router learned depends on
/// the outcomes, not on the order they came in (a warm-started head drifted with each retrain).
#[test]
fn learning_does_not_depend_on_the_order_of_outcomes() {
    let outcomes = [
        ("move the nightly exports to a scheduled Kubernetes job", "devops", true),
        ("write the OpenAPI spec for the orders service", "coder", false),
        ("explain to new hires how our feature flags work", "documenter", true),
    ];
    let mut fwd = default_router();
    let mut rev = default_router();
    for &(t, a, ok) in &outcomes {
        fwd.feedback(t, a, ok).expect("fb");
    }
    for &(t, a, ok) in outcomes.iter().rev() {
        rev.feedback(t, a, ok).expect("fb");
    }
    let scores = |r: &mut Router, t: &str| {
        let x = r.route(t).expect("route");
        let mut s: Vec<(String, f32)> = x.alternatives.iter().map(|a| (a.agent.clone(), a.score)).collect();
        s.push((x.agent, x.confidence));
        s.sort_by(|a, b| a.0.cmp(&b.0));
        s
    };
    for probe in ["schedule the backups as a cron job in the cluster", "document the payments webhook fields", "onboarding guide for the release tooling"] {
        let (a, b) = (scores(&mut fwd, probe), scores(&mut rev, probe));
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.0, y.0);
            assert!((x.1 - y.1).abs() < 1e-4, "{probe}: {a:?} vs {b:?}");
        }
    }
}

#[test]
fn save_and_load_round_trip() {
    let mut r = default_router();
    r.feedback("migrate the billing cron jobs to Kubernetes CronJobs", "devops", true).expect("fb");
    r.feedback("write the OpenAPI spec for the orders service", "coder", false).expect("fb");
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("sub").join("router.json");
    r.save(&path).expect("save");
    let mut l = Router::load(&path, embedder(), IndexConfig::default()).expect("load");
    assert_eq!(l.patterns().len(), r.patterns().len());
    assert_eq!(l.negatives().len(), 1);
    for t in ["optimise the slow dashboard query", "write the OpenAPI spec for the orders service"] {
        let (a, b) = (r.route(t).expect("r"), l.route(t).expect("l"));
        assert_eq!(a.agent, b.agent);
        assert!((a.confidence - b.confidence).abs() < 1e-5);
    }
    std::fs::write(&path, "{ not json").expect("write");
    let err = Router::load(&path, embedder(), IndexConfig::default()).err().expect("bad file must fail");
    assert_eq!(err.code(), "ERR_ROUTER_STATE");
    let err = Router::load(&dir.path().join("missing.json"), embedder(), IndexConfig::default()).err().expect("missing");
    assert_eq!(err.code(), "ERR_IO");
}

#[test]
fn hooks_state_is_safe_under_concurrent_writers() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("ruvllm").join("router-state.json");
    let pre = hooks::pre_task("add a dark mode toggle", embedder(), &path).expect("pre-task");
    assert!(path.is_file());
    assert_eq!(pre.model, hooks::model_suggestion(&pre.agent, pre.confidence));
    let base = pre.patterns;
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let path = path.clone();
            std::thread::spawn(move || {
                for i in 0..3 {
                    let task = format!("unique task number {t}-{i}: provision a Redis cluster {t}{i} with Terraform for tenant {i}{t}");
                    hooks::post_task(&task, "devops", true, embedder(), &path).expect("post-task");
                }
            })
        })
        .collect();
    for th in threads {
        th.join().expect("thread");
    }
    let r = Router::load(&path, embedder(), IndexConfig::default()).expect("load");
    let learned = r.patterns().len() - base;
    let reinforced: u32 = r.patterns().iter().map(|p| p.successes).sum();
    // Every one of the 12 outcomes is in the file: a new pattern or a reinforced one.
    assert_eq!(reinforced as usize, 12, "learned {learned}");
    // A corrupt file is moved aside, not fatal.
    std::fs::write(&path, "garbage").expect("write");
    let pre = hooks::pre_task("write docs", embedder(), &path).expect("pre-task after corruption");
    assert!(pre.warning.is_some());
}

/// The outcome memory acts near its outcomes only: with the head kept off the outcomes, a
/// failure lowers that agent for the task itself and leaves an unrelated task's probabilities
/// exactly as they were.
#[test]
fn outcome_memory_acts_near_the_outcome_only() {
    let mut r = default_router();
    let mut p = r.params().clone();
    p.outcomes_in_head = false;
    r.set_params(p);
    let task = "keep a changelog of what each release changes";
    let far = "benchmark the image resizing service under load";
    let (tv, fv) = (r.embed_one(task).expect("embed"), r.embed_one(far).expect("embed"));
    let before = (r.probabilities(task, &tv).expect("p"), r.probabilities(far, &fv).expect("p"));
    let top = (0..before.0.len()).max_by(|&a, &b| before.0[a].total_cmp(&before.0[b])).expect("agents");
    r.feedback_vector(task, &tv, top, false).expect("fb");
    let after = (r.probabilities(task, &tv).expect("p"), r.probabilities(far, &fv).expect("p"));
    assert!(after.0[top] < before.0[top] - 0.05, "{} -> {}", before.0[top], after.0[top]);
    assert_eq!(before.1, after.1, "an unrelated task must not move");
    // Off: the same failure changes nothing at all.
    let mut r = default_router();
    let mut p = r.params().clone();
    p.outcomes_in_head = false;
    p.memory_gain = 0.0;
    r.set_params(p);
    r.feedback_vector(task, &tv, top, false).expect("fb");
    assert_eq!(r.probabilities(task, &tv).expect("p"), before.0);
}

/// The outcome memory scans the latest 512 outcomes, so which outcomes are latest must survive
/// save and load: 512 learned patterns far from the task, then a failure on the task (inside
/// the window); after a round trip the task's probabilities are the same.
#[test]
fn outcome_memory_order_survives_save_and_load() {
    let mut r = default_router();
    let mut p = r.params().clone();
    p.outcomes_in_head = false; // no retrain per outcome: the memory alone decides
    r.set_params(p);
    let dim = r.embedder().dim();
    let mut seed = 0x9E3779B97F4A7C15u64;
    for i in 0..512 {
        let v: Vec<f32> = (0..dim)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 11) as f32 / (1u64 << 53) as f32 - 0.5
            })
            .collect();
        r.feedback_vector(&format!("outcome {i}"), &ruvllm_embed::l2_normalized(v), i % 13, true).expect("fb");
    }
    let task = "keep a changelog of what each release changes";
    let tv = r.embed_one(task).expect("embed");
    let before = r.probabilities(task, &tv).expect("p");
    let top = (0..before.len()).max_by(|&a, &b| before[a].total_cmp(&before[b])).expect("agents");
    r.feedback_vector(task, &tv, top, false).expect("fb");
    let after = r.probabilities(task, &tv).expect("p");
    assert!(after[top] < before[top] - 0.05, "the failure is inside the window: {} -> {}", before[top], after[top]);
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("router.json");
    r.save(&path).expect("save");
    let mut l = Router::load(&path, embedder(), IndexConfig::default()).expect("load");
    let loaded = l.probabilities(task, &tv).expect("p");
    for (a, b) in after.iter().zip(&loaded) {
        assert!((a - b).abs() < 1e-6, "{after:?} vs {loaded:?}");
    }
}
