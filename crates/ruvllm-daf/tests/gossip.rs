//! Several federation nodes on loopback over libp2p: rounds, a node offline for a round that
//! catches up, and bad envelopes from a peer.

use std::time::Duration;

use ed25519_dalek::SigningKey;
use rand::{Rng, SeedableRng};
use ruvllm_daf::demo;
use ruvllm_daf::federation::{bundle, FederationConfig};
use ruvllm_daf::node::Node;
use ruvllm_daf::privacy::DpConfig;
use ruvllm_daf::privacy::{seal_bytes, Header};
use ruvllm_daf::update::{Tier, Update};
use ruvllm_daf::validate::AdapterSpec;

const N: usize = 4;

fn config(i: usize, peers: Vec<String>) -> FederationConfig {
    // Every round stays held: the tests re-aggregate round 1 after round 3.
    FederationConfig { keep_rounds: 8, ..demo::config(i, N, peers, Duration::from_secs(5)) }
}

fn local(i: usize, round: u64) -> Vec<Update> {
    demo::updates(i, round)
}

/// Starts one node per config, each dialing all started before it, and waits for the full mesh.
async fn start(configs: Vec<FederationConfig>) -> Vec<Node> {
    let n = configs.len();
    let mut nodes: Vec<Node> = Vec::new();
    for mut c in configs {
        c.peers = nodes.iter().map(|n| n.listen_addr().to_string()).collect();
        nodes.push(Node::join(c).await.expect("node starts"));
    }
    for node in &nodes {
        node.wait_for_peers(n - 1, Duration::from_secs(20)).await.expect("mesh forms");
    }
    nodes
}

async fn start_all() -> Vec<Node> {
    start((0..N).map(|i| config(i, Vec::new())).collect()).await
}

fn index_of(n: &Node) -> usize {
    (0..255).find(|&k| SigningKey::from_bytes(&demo::identity(k)).verifying_key().to_bytes() == n.node_id()).expect("a demo node")
}

async fn run_round(nodes: &[&Node], round: u64) -> Vec<ruvllm_daf::node::RoundReport> {
    let futs = nodes.iter().map(|n| n.round(round, local(index_of(n), round)));
    futures::future::join_all(futs).await.into_iter().map(|r| r.expect("round runs")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_agree_across_rounds_and_an_offline_node_catches_up() {
    let mut nodes = start_all().await;

    let r1 = run_round(&nodes.iter().collect::<Vec<_>>(), 1).await;
    for r in &r1 {
        assert_eq!((r.contributors, r.timed_out, r.output.aggregates.len()), (N, false, 3));
        assert_eq!(r.output, r1[0].output);
    }

    // Node 3 goes offline for round 2; the others finish without it.
    let gone = nodes.pop().expect("four nodes");
    let state = gone.stop().await.expect("state back");
    for n in &nodes {
        n.wait_for_peers(N - 2, Duration::from_secs(20)).await.expect("peers");
        while n.peer_counts().1 > N - 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let r2 = run_round(&nodes.iter().collect::<Vec<_>>(), 2).await;
    for r in &r2 {
        assert_eq!((r.contributors, r.timed_out), (N - 1, true));
        assert_eq!(r.output, r2[0].output);
    }

    // It comes back (same identity, same state, new port), joins round 3, then catches up.
    let back = Node::start(state).await.expect("restarts");
    nodes.push(back);
    for n in &nodes {
        n.wait_for_peers(N - 1, Duration::from_secs(20)).await.expect("mesh re-forms");
    }
    let r3 = run_round(&nodes.iter().collect::<Vec<_>>(), 3).await;
    for r in &r3 {
        assert_eq!(r.contributors, N);
        assert_eq!(r.output, r3[0].output);
    }
    let caught = nodes[N - 1].sync(4).await.expect("syncs");
    assert_eq!(caught, vec![2]);
    for round in 1..=3 {
        let want = nodes[0].aggregate(round).expect("aggregates");
        for n in &nodes {
            assert_eq!(n.aggregate(round).expect("aggregates"), want, "round {round}");
        }
    }
    // Rounds are idempotent: catching up again brings nothing and changes nothing.
    let again = nodes[N - 1].catch_up(2).await.expect("catch-up");
    assert_eq!(again.accepted, 0);
    assert_eq!(nodes[N - 1].aggregate(2).expect("aggregates"), nodes[0].aggregate(2).expect("aggregates"));
    for (i, n) in nodes.iter().enumerate() {
        let s = n.stats();
        assert_eq!(s.rejected_total, 0, "honest nodes: {:?}", s.rejected);
        assert_eq!(s.rounds, 3);
        for r in &s.per_round {
            let offline = i == N - 1 && r.round == 2;
            assert_eq!(r.bytes_sent == 0, offline, "node {i}: {r:?}");
            assert!(r.bytes_received > 0, "node {i}: {r:?}");
        }
    }
    for n in nodes {
        n.stop().await.expect("stops");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tampered_and_replayed_envelopes_from_a_peer_are_rejected() {
    let nodes = start_all().await;
    let refs: Vec<&Node> = nodes.iter().collect();
    let r1 = run_round(&refs, 1).await;

    // Node 0 turns bad in round 2: a flipped byte, a re-encrypted copy of its round-1 update
    // (new nonce, same signed update: a replay gossip's own duplicate filter cannot see), an
    // update signed by someone else under its name, and garbage.
    let key = SigningKey::from_bytes(&demo::identity(0));
    let mut old = local(0, 1).remove(0);
    old.node = key.verifying_key().to_bytes();
    old.sign(&key);
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut os = rand::rngs::OsRng;
    let replay = seal_bytes(&Header::of(&old), &old.encode(), &demo::GROUP_KEY, &mut os).expect("seals");
    let mut tampered = replay.clone();
    let at = tampered.len() - 40;
    tampered[at] ^= 0x10;
    let mut forged = local(0, 2).remove(0);
    forged.round = 2;
    forged.sign(&SigningKey::from_bytes(&[77; 32]));
    forged.node = key.verifying_key().to_bytes();
    let forged = seal_bytes(&Header::of(&forged), &forged.encode(), &demo::GROUP_KEY, &mut os).expect("seals");
    let garbage: Vec<u8> = (0..200).map(|_| rng.gen()).collect();
    let messages = vec![bundle(&[tampered]), bundle(&[replay]), bundle(&[forged]), garbage];
    nodes[0].publish_raw(messages).await.expect("publishes");

    let honest: Vec<&Node> = nodes[1..].iter().collect();
    for n in &honest {
        let end = std::time::Instant::now() + Duration::from_secs(20);
        while n.stats().rejected_total < 4 && std::time::Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let s = n.stats();
        assert_eq!(s.rejected_total, 4, "{:?}", s.rejected);
        for reason in ["undecryptable", "replayed", "badSignature", "malformed"] {
            assert_eq!(s.rejected.get(reason), Some(&1), "{reason}: {:?}", s.rejected);
        }
        assert_eq!(n.aggregate(1).expect("aggregates"), r1[0].output, "round 1 untouched");
    }
    for n in nodes {
        n.stop().await.expect("stops");
    }
}

/// The public tier over the network: each node's release is clipped and noised before it
/// leaves, ε stays within budget, and the aggregate is released only with k = 5 contributors.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn public_aggregates_need_five_nodes_and_stay_within_epsilon() {
    let public = |i: usize, n: usize| FederationConfig {
        adapters: vec![AdapterSpec::new("sona", Tier::Public, None, &[(17, "ffn_down", 16, 8)])],
        dp: DpConfig { epsilon: 1.0, delta: 1e-5, rounds: 2, clip: 0.5 },
        ..demo::config(i, n, Vec::new(), Duration::from_secs(5))
    };
    let sona_only = |i: usize, round: u64| local(i, round).into_iter().filter(|u| u.adapter == "sona").collect::<Vec<_>>();
    for (n, released) in [(4, false), (5, true)] {
        let nodes = start((0..n).map(|i| public(i, n)).collect()).await;
        let reports = futures::future::join_all(nodes.iter().map(|node| node.round(1, sona_only(index_of(node), 1)))).await;
        for r in reports {
            let r = r.expect("round runs");
            assert_eq!(r.contributors, n);
            assert_eq!(r.output.aggregates.len(), released as usize, "{n} nodes");
            assert_eq!(r.output.withheld.len(), !released as usize, "{n} nodes");
            if released {
                let a = &r.output.aggregates[0];
                assert!(a.weights.iter().all(|&w| (w - 0.2).abs() < 1e-12), "public metadata is withheld: uniform weights");
            }
        }
        for node in nodes {
            let s = node.stats();
            assert!(s.epsilon > 0.0 && s.epsilon <= 1.0, "epsilon {}", s.epsilon);
            assert_eq!(s.rejected_total, 0);
            node.stop().await.expect("stops");
        }
    }
}
