//! Synthetic adapters and updates of a fixed shape: what the loopback tests, the node binary's
//! smoke runs and transport measurements federate when no model is involved. Node `i` has the
//! identity `[i + 1; 32]` and the group key is shared, so any process can rebuild any node's
//! configuration from its index.

use std::time::Duration;

use rand::{Rng, SeedableRng};

use crate::aggregate::Method;
use crate::federation::FederationConfig;
use crate::privacy::Keys;
use crate::update::{Factors, Tier, Update};
use crate::validate::AdapterSpec;
use crate::weighting::{RoundPolicy, Weighting};

pub const GROUP_KEY: [u8; 32] = [5; 32];

/// The Ed25519 secret of demo node `i`.
pub fn identity(i: usize) -> [u8; 32] {
    [(i % 255) as u8 + 1; 32]
}

/// Demo node `i` of `n`: a SONA-like adapter (one target) and a two-bucket TALoRA adapter, both
/// group tier, hybrid DAF weighting, SVD aggregation to rank 4.
pub fn config(i: usize, n: usize, peers: Vec<String>, round_timeout: Duration) -> FederationConfig {
    FederationConfig {
        federate: true,
        identity: identity(i),
        adapters: vec![
            AdapterSpec::new("sona", Tier::Group, None, &[(17, "ffn_down", 16, 8)]),
            AdapterSpec::new("talora", Tier::Group, Some(2), &[(0, "attn_q", 8, 8)]),
        ],
        keys: Keys { group: Some(GROUP_KEY), tenant: None },
        policy: RoundPolicy { weighting: Weighting::Hybrid { mix: 0.5 }, method: Method::Svd { rank: 4 }, k_anonymity: 5 },
        expected_nodes: n,
        round_timeout,
        peers,
        topic: "ruvllm-daf/demo".into(),
        ..FederationConfig::default()
    }
}

fn factors(rng: &mut impl Rng, layer: u32, proj: &str, rank: usize, d_in: usize, d_out: usize) -> Factors {
    let a = (0..rank * d_in).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    let b = (0..d_out * rank).map(|_| rng.gen_range(-0.1f32..0.1)).collect();
    Factors { layer, proj: proj.into(), rank, d_in, d_out, a, b }
}

/// Demo node `i`'s updates for `round` (deterministic; unsigned: the federation signs).
pub fn updates(i: usize, round: u64) -> Vec<Update> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(i as u64 * 100 + round);
    let mk = |adapter: &str, bucket, f: Factors, improvement: f32| Update {
        adapter: adapter.into(),
        bucket,
        targets: vec![f],
        scale: 0.5,
        samples: 10 + i as u64,
        quality: 0.7,
        improvement,
        tier: Tier::Group,
        node: [0; 32],
        round,
        signature: None,
    };
    vec![
        mk("sona", None, factors(&mut rng, 17, "ffn_down", 2, 16, 8), 0.1),
        mk("talora", Some(0), factors(&mut rng, 0, "attn_q", 1, 8, 8), 0.05 * i as f32),
        mk("talora", Some(1), factors(&mut rng, 0, "attn_q", 1, 8, 8), (0.2 - 0.05 * i as f32).max(0.0)),
    ]
}
