//! Several federation nodes on loopback over libp2p: rounds, a node offline for a round that
//! catches up, and bad envelopes from a peer.

use std::time::Duration;

use ed25519_dalek::SigningKey;
use rand::{Rng, SeedableRng};
use ruvllm_daf::demo;
use ruvllm_daf::federation::{bundle, FederationConfig};
use ruvllm_daf::node::Node;
use ruvllm_daf::privacy::{seal_bytes, Header};
use ruvllm_daf::update::Update;

const N: usize = 4;

fn config(i: usize, peers: Vec<String>) -> FederationConfig {
    demo::config(i, N, peers, Duration::from_secs(3))
}

fn local(i: usize, round: u64) -> Vec<Update> {
    demo::updates(i, round)
}

async fn start_all() -> Vec<Node> {
    let mut nodes: Vec<Node> = Vec::new();
    for i in 0..N {
        let peers = nodes.iter().map(|n| n.listen_addr().to_string()).collect();
        nodes.push(Node::join(config(i, peers)).await.expect("node starts"));
    }
    for n in &nodes {
        n.wait_for_peers(N - 1, Duration::from_secs(20)).await.expect("mesh forms");
    }
    nodes
}

async fn run_round(nodes: &[&Node], round: u64) -> Vec<ruvllm_daf::node::RoundReport> {
    let futs = nodes.iter().map(|n| {
        let idx = (0..N).find(|&k| SigningKey::from_bytes(&demo::identity(k)).verifying_key().to_bytes() == n.node_id()).expect("known node");
        n.round(round, local(idx, round))
    });
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
