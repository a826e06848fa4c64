//! One node's federation state, independent of the transport: what it publishes for a round,
//! what it accepted from others, the aggregates, and the counters. [`crate::node::Node`] moves
//! the bytes between such states over libp2p; the tests here move them by hand.
//!
//! A round's aggregate is a function of the set of accepted updates of that round (ordered by
//! node id before summing), so it is idempotent: receiving an update twice changes nothing, and
//! two nodes that hold the same set, however it reached them (gossip, catch-up), hold
//! bit-identical aggregates.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use ed25519_dalek::SigningKey;
use rand::rngs::StdRng;
use rand::SeedableRng;
use sha2::{Digest, Sha256};

use crate::privacy::{open, seal, seal_public, DpConfig, Header, Keys, PublicTier};
use crate::update::{Tier, Update};
use crate::validate::{AdapterSpec, Limits, Reject, Source, Validator};
use crate::weighting::{aggregate_round, RoundOutput, RoundPolicy};
use crate::{Error, Result};

/// What a node needs to federate.
#[derive(Debug, Clone)]
pub struct FederationConfig {
    /// Explicit consent: nothing is federated unless this is true (`learning.federate`, off by
    /// default).
    pub federate: bool,
    /// The node's Ed25519 secret key: it signs the node's updates and is its libp2p identity.
    pub identity: [u8; 32],
    /// The adapters federated, each with its tier and expected shapes.
    pub adapters: Vec<AdapterSpec>,
    pub keys: Keys,
    pub dp: DpConfig,
    pub policy: RoundPolicy,
    pub limits: Limits,
    /// How many nodes (this one included) a round waits for before aggregating.
    pub expected_nodes: usize,
    /// How long a round waits for them; then it aggregates what it has.
    pub round_timeout: Duration,
    /// The multiaddr to listen on (`/ip4/127.0.0.1/tcp/0`: any free port on loopback).
    pub listen: String,
    /// Multiaddrs of peers to dial on start.
    pub peers: Vec<String>,
    /// The gossip topic; nodes federate only with nodes on the same topic.
    pub topic: String,
    /// How many rounds' envelopes a node holds to serve peers' catch-up (the newest ones; at
    /// least 1; default 2: the round just run and the one before). Older rounds keep their
    /// counts, not their bytes: a node offline for longer cannot catch them up from this node.
    /// Each round holds every contributor's updates (with 8 nodes and a three-bucket TALoRA
    /// adapter, ~180 MB).
    pub keep_rounds: usize,
}

impl Default for FederationConfig {
    fn default() -> Self {
        FederationConfig {
            federate: false,
            identity: [0; 32],
            adapters: Vec::new(),
            keys: Keys::default(),
            dp: DpConfig::default(),
            policy: RoundPolicy::default(),
            limits: Limits::default(),
            expected_nodes: 2,
            round_timeout: Duration::from_secs(10),
            listen: "/ip4/127.0.0.1/tcp/0".into(),
            peers: Vec::new(),
            topic: "ruvllm-daf/updates/1".into(),
            keep_rounds: 2,
        }
    }
}

/// Bytes and contributors of one round.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RoundStats {
    pub round: u64,
    /// Distinct nodes whose updates this node holds for the round (itself included).
    pub contributors: usize,
    /// Envelope bytes this node published for the round, and served for it in catch-up.
    pub bytes_sent: u64,
    /// Envelope bytes received for the round (accepted or not).
    pub bytes_received: u64,
    pub aggregates: usize,
    /// Public groups withheld for too few contributors (k-anonymity).
    pub withheld: usize,
}

/// The counters a caller (JS `stats()`, the CLI) reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// This node's public key, hex.
    pub node: String,
    /// Rounds aggregated.
    pub rounds: u64,
    pub accepted: u64,
    /// By reason (`Reject::name`), only reasons that occurred.
    pub rejected: BTreeMap<&'static str, u64>,
    pub rejected_total: u64,
    /// Local updates of private adapters, kept off the wire.
    pub private_kept: u64,
    /// Envelopes received again byte for byte (another gossip path, a restart, overlapping
    /// catch-up): dropped without validation; not rejections. A replay in other bytes (the
    /// same update re-encrypted or re-signed, or an older round) is a rejection.
    pub duplicates: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Bytes that could not be attributed to a round (they did not parse).
    pub bytes_unattributed: u64,
    pub per_round: Vec<RoundStats>,
    /// ε spent by this node's public releases (at the configured δ).
    pub epsilon: f64,
    /// Connected peers (filled in by the transport).
    pub peers: usize,
}

type UpdateKey = ([u8; 32], String, Option<u16>);

/// What a node holds of one round. Accepted updates are kept as their envelopes only (the
/// bytes catch-up serves, opened again when the round is aggregated), not also decoded: a
/// round of 8 nodes' three-bucket TALoRA updates is ~180 MB either way.
#[derive(Debug, Default)]
struct RoundState {
    /// Accepted updates by (node, adapter, bucket): the index of each one's envelope.
    updates: BTreeMap<UpdateKey, usize>,
    /// The envelopes of those updates; emptied once the round is older than `keep_rounds`
    /// (`pruned`: later envelopes of it are refused).
    envelopes: Vec<Vec<u8>>,
    pruned: bool,
    /// Aggregates and withheld groups of the last aggregation.
    output: Option<(usize, usize)>,
    bytes_sent: u64,
    bytes_received: u64,
}

impl RoundState {
    fn contributors(&self) -> usize {
        self.updates.keys().map(|k| k.0).collect::<BTreeSet<_>>().len()
    }

    fn hold(&mut self, u: &Update, env: Vec<u8>) {
        self.updates.insert((u.node, u.adapter.clone(), u.bucket), self.envelopes.len());
        self.envelopes.push(env);
    }
}

/// One node's federation state.
pub struct Federation {
    cfg: FederationConfig,
    key: SigningKey,
    validator: Validator,
    public: Option<PublicTier>,
    rounds: BTreeMap<u64, RoundState>,
    private_kept: u64,
    /// SHA-256 of every envelope held (published or accepted).
    held: HashSet<[u8; 32]>,
    duplicates: u64,
    bytes_unattributed: u64,
    /// A CSPRNG (ChaCha) seeded from the OS: nonces and DP noise.
    rng: StdRng,
}

impl Federation {
    /// Checks `cfg` and sets up the node's state. Refused without consent.
    pub fn new(cfg: FederationConfig) -> Result<Federation> {
        if !cfg.federate {
            return Err(Error::Config("federation is off: it needs explicit consent (federate: true)".into()));
        }
        if cfg.adapters.is_empty() {
            return Err(Error::Config("no adapter to federate".into()));
        }
        if cfg.expected_nodes == 0 {
            return Err(Error::Config("expected_nodes must be at least 1".into()));
        }
        if cfg.keep_rounds == 0 {
            return Err(Error::Config("keep_rounds must be at least 1".into()));
        }
        let key = SigningKey::from_bytes(&cfg.identity);
        let public_streams: u64 = cfg.adapters.iter().filter(|a| a.tier == Tier::Public).map(|a| a.buckets.map_or(1, u64::from)).sum();
        let public = if public_streams > 0 { Some(PublicTier::new(cfg.dp, public_streams)?) } else { None };
        let members: Vec<[u8; 32]> = cfg.keys.tenant.as_ref().map(|t| t.members.clone()).unwrap_or_default();
        for a in &cfg.adapters {
            match a.tier {
                Tier::Group if cfg.keys.group.is_none() => return Err(Error::Key(format!("adapter '{}' is group-tier but no group key is set", a.id))),
                Tier::Tenant if !members.contains(&key.verifying_key().to_bytes()) => {
                    return Err(Error::Key(format!("adapter '{}' is tenant-tier but this node is not on the tenant's member list", a.id)))
                }
                _ => {}
            }
        }
        let validator = Validator::new(cfg.limits, &cfg.adapters, &members);
        Ok(Federation {
            validator,
            public,
            rounds: BTreeMap::new(),
            private_kept: 0,
            held: HashSet::new(),
            duplicates: 0,
            bytes_unattributed: 0,
            rng: StdRng::from_entropy(),
            key,
            cfg,
        })
    }

    pub fn config(&self) -> &FederationConfig {
        &self.cfg
    }

    /// This node's public key.
    pub fn node_id(&self) -> [u8; 32] {
        self.key.verifying_key().to_bytes()
    }

    /// Signs this node's `local` updates for `round` (tier and round set from the adapter's
    /// spec), keeps them in the round, and returns the envelopes to publish. Private adapters'
    /// updates are counted and dropped here: they have no wire form. Public ones are clipped
    /// and noised first (and refused once the privacy budget is spent).
    pub fn prepare(&mut self, round: u64, local: Vec<Update>) -> Result<Vec<Vec<u8>>> {
        if self.rounds.get(&round).is_some_and(|s| s.pruned) {
            return Err(Error::Round { round, msg: format!("too old: this node keeps the last {} rounds", self.cfg.keep_rounds) });
        }
        let mut out = Vec::new();
        for mut u in local {
            let tier = self
                .validator
                .spec(&u.adapter)
                .map(|s| s.tier)
                .ok_or_else(|| Error::Config(format!("adapter '{}' is not federated by this node", u.adapter)))?;
            if tier == Tier::Private {
                self.private_kept += 1;
                continue;
            }
            u.tier = tier;
            u.round = round;
            u.node = self.node_id();
            let (u, env) = match tier {
                Tier::Public => {
                    let public = self.public.as_mut().ok_or_else(|| Error::Config("public adapter without a public tier".into()))?;
                    // The release is signed after clipping and noise: what is signed is what
                    // goes out.
                    let rel = public.release(&u, &self.key, &mut self.rng)?;
                    let env = seal_public(&rel);
                    (rel.update().clone(), env)
                }
                _ => {
                    u.sign(&self.key);
                    let env = seal(&u, &self.cfg.keys, &mut self.rng)?;
                    (u, env)
                }
            };
            let u = self.validator.accept(u, Source::Live).map_err(Error::Rejected)?;
            self.held.insert(Sha256::digest(&env).into());
            let st = self.rounds.entry(round).or_default();
            st.bytes_sent += env.len() as u64;
            st.hold(&u, env.clone());
            out.push(env);
        }
        Ok(out)
    }

    /// What an adversarial node would publish in `round`, made from this node's own update of
    /// the earlier round `from` (for benchmarks and tests of the other nodes' validation):
    /// that update re-encrypted (a replay that gossip's duplicate filter cannot see), the same
    /// with a flipped byte (tampered), an update for `round` under this node's name signed by
    /// another key (forged), and bytes that do not parse. Honest nodes reject all four
    /// (`replayed`, `undecryptable`, `badSignature`, `malformed`). Group and tenant tiers only.
    pub fn attack_envelopes(&mut self, from: u64, round: u64) -> Result<Vec<Vec<u8>>> {
        use rand::Rng;
        let me = self.node_id();
        let old = self
            .rounds
            .get(&from)
            .and_then(|st| st.updates.iter().find(|(k, _)| k.0 == me).and_then(|(_, &i)| st.envelopes.get(i)))
            .ok_or_else(|| Error::Round { round: from, msg: "this node holds no update of its own from that round".into() })?;
        let old = self.open_checked(old).map_err(|e| Error::Round { round: from, msg: format!("its own update does not open: {}", e.name()) })?;
        if !matches!(old.tier, Tier::Group | Tier::Tenant) {
            return Err(Error::Config(format!("attacks are made for the group and tenant tiers, not {}", old.tier.name())));
        }
        let replay = seal(&old, &self.cfg.keys, &mut self.rng)?;
        let mut tampered = replay.clone();
        let at = tampered.len().saturating_sub(40);
        if let Some(b) = tampered.get_mut(at) {
            *b ^= 0x10;
        }
        let mut forged = old;
        forged.round = round;
        let other = SigningKey::from_bytes(&self.rng.gen::<[u8; 32]>());
        forged.sign(&other);
        forged.node = me;
        let forged = seal(&forged, &self.cfg.keys, &mut self.rng)?;
        let garbage: Vec<u8> = (0..200).map(|_| self.rng.gen()).collect();
        Ok(vec![replay, tampered, forged, garbage])
    }

    /// Takes an envelope from the wire: opens, decodes, checks it against its header and
    /// validates it; an accepted update joins its round. Every outcome is counted.
    pub fn receive(&mut self, bytes: &[u8], source: Source) -> std::result::Result<(), Reject> {
        let header = Header::parse(bytes).ok();
        match header {
            Some(h) => self.rounds.entry(h.round).or_default().bytes_received += bytes.len() as u64,
            None => self.bytes_unattributed += bytes.len() as u64,
        }
        let digest: [u8; 32] = Sha256::digest(bytes).into();
        if self.held.contains(&digest) {
            self.duplicates += 1;
            return Err(Reject::Replayed);
        }
        let pruned = header.is_some_and(|h| self.rounds.get(&h.round).is_some_and(|s| s.pruned));
        let r = if pruned { Err(Reject::Replayed) } else { self.open_checked(bytes) };
        let u = match r {
            Ok(u) => self.validator.accept(u, source)?,
            Err(e) => {
                self.validator.counters.count(Err(e));
                return Err(e);
            }
        };
        self.held.insert(digest);
        self.rounds.entry(u.round).or_default().hold(&u, bytes.to_vec());
        Ok(())
    }

    /// Takes a bundle (one node's envelopes of a round, as gossip carries them): each envelope
    /// as [`Federation::receive`] does. Bytes that are not a bundle count once as malformed.
    pub fn receive_bundle(&mut self, bytes: &[u8], source: Source) -> Vec<std::result::Result<(), Reject>> {
        let r = if bytes.len() > self.cfg.limits.max_message_bytes { Err(Reject::Oversized) } else { unbundle(bytes) };
        match r {
            Ok(envs) => envs.into_iter().map(|e| self.receive(e, source)).collect(),
            Err(e) => {
                self.bytes_unattributed += bytes.len() as u64;
                self.validator.counters.count(Err(e));
                vec![Err(e)]
            }
        }
    }

    /// Opens, decodes and checks the update against the envelope's (authenticated) header.
    fn open_checked(&self, bytes: &[u8]) -> std::result::Result<Update, Reject> {
        if bytes.len() > self.cfg.limits.max_bytes {
            return Err(Reject::Oversized);
        }
        let (h, body) = open(bytes, &self.cfg.keys)?;
        let u = Update::decode(&body, self.cfg.limits.max_rank)?;
        if h != Header::of(&u) {
            return Err(Reject::Malformed);
        }
        Ok(u)
    }

    /// Distinct nodes whose updates this node holds for `round`.
    pub fn contributors(&self, round: u64) -> usize {
        self.rounds.get(&round).map_or(0, RoundState::contributors)
    }

    /// Whether `round` has updates from the expected number of nodes.
    pub fn ready(&self, round: u64) -> bool {
        self.contributors(round) >= self.cfg.expected_nodes
    }

    /// Aggregates `round` from the updates held now (again if more arrived since), then lets
    /// go of the envelopes of rounds more than `keep_rounds` older than the newest.
    pub fn aggregate(&mut self, round: u64) -> Result<RoundOutput> {
        let policy = self.cfg.policy;
        let mut updates = Vec::new();
        if let Some(st) = self.rounds.get(&round) {
            if st.pruned {
                return Err(Error::Round { round, msg: format!("its updates are no longer held (a node keeps the last {} rounds)", self.cfg.keep_rounds) });
            }
            // `updates` index `envelopes`: both are kept until the round is pruned.
            for &i in st.updates.values() {
                updates
                    .push(self.open_checked(&st.envelopes[i]).map_err(|e| Error::Round { round, msg: format!("a held update does not open: {}", e.name()) })?);
            }
        }
        let out = aggregate_round(&updates, &policy)?;
        self.rounds.entry(round).or_default().output = Some((out.aggregates.len(), out.withheld.len()));
        let newest = self.rounds.keys().next_back().copied().unwrap_or(round);
        for (_, s) in self.rounds.range_mut(..newest.saturating_add(1).saturating_sub(self.cfg.keep_rounds as u64)) {
            s.envelopes = Vec::new();
            s.pruned = true;
        }
        Ok(out)
    }

    /// Rounds before `upto`, from the first this node holds, with fewer contributors than
    /// expected: the ones a catch-up may complete.
    pub fn incomplete_rounds(&self, upto: u64) -> Vec<u64> {
        let Some(&first) = self.rounds.keys().next() else { return Vec::new() };
        (first..upto).filter(|&r| self.contributors(r) < self.cfg.expected_nodes).collect()
    }

    /// The nodes this node holds updates from for `round`.
    pub fn holders(&self, round: u64) -> Vec<[u8; 32]> {
        self.rounds.get(&round).map(|s| s.updates.keys().map(|k| k.0).collect::<BTreeSet<_>>().into_iter().collect()).unwrap_or_default()
    }

    /// The envelopes held for `round` whose sender is not in `have`, to serve a peer's catch-up
    /// (counted as sent). The filter reads the envelope header's sender: an envelope that lies
    /// there fails the requester's checks, which compare header and update.
    pub fn serve(&mut self, round: u64, have: &[[u8; 32]]) -> Vec<Vec<u8>> {
        let Some(st) = self.rounds.get_mut(&round) else { return Vec::new() };
        let out: Vec<Vec<u8>> = st.envelopes.iter().filter(|e| Header::parse(e).is_ok_and(|h| !have.contains(&h.sender))).cloned().collect();
        st.bytes_sent += out.iter().map(|e| e.len() as u64).sum::<u64>();
        out
    }

    pub fn stats(&self) -> Stats {
        let c = &self.validator.counters;
        let per_round: Vec<RoundStats> = self
            .rounds
            .iter()
            .map(|(&round, s)| RoundStats {
                round,
                contributors: s.contributors(),
                bytes_sent: s.bytes_sent,
                bytes_received: s.bytes_received,
                aggregates: s.output.map_or(0, |o| o.0),
                withheld: s.output.map_or(0, |o| o.1),
            })
            .collect();
        Stats {
            node: self.node_id().iter().map(|b| format!("{b:02x}")).collect(),
            rounds: self.rounds.values().filter(|s| s.output.is_some()).count() as u64,
            accepted: c.accepted,
            rejected: c.rejected.iter().map(|(r, n)| (r.name(), *n)).collect(),
            rejected_total: c.rejected_total(),
            private_kept: self.private_kept,
            duplicates: self.duplicates,
            bytes_sent: per_round.iter().map(|r| r.bytes_sent).sum(),
            bytes_received: per_round.iter().map(|r| r.bytes_received).sum::<u64>() + self.bytes_unattributed,
            bytes_unattributed: self.bytes_unattributed,
            per_round,
            epsilon: self.public.as_ref().map_or(0.0, PublicTier::epsilon_spent),
            peers: 0,
        }
    }
}

const BUNDLE_MAGIC: &[u8; 8] = b"RVDAFB1\0";

/// One message of several envelopes: a node's updates of a round travel together, so a peer
/// holds all of them or none (a round counts a node as contributed once its message arrived).
pub fn bundle(envelopes: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(12 + envelopes.iter().map(|e| e.len() + 4).sum::<usize>());
    out.extend_from_slice(BUNDLE_MAGIC);
    out.extend_from_slice(&(envelopes.len() as u32).to_le_bytes());
    for e in envelopes {
        out.extend_from_slice(&(e.len() as u32).to_le_bytes());
        out.extend_from_slice(e);
    }
    out
}

/// The envelopes of a bundle.
pub fn unbundle(bytes: &[u8]) -> std::result::Result<Vec<&[u8]>, Reject> {
    let rest = bytes.strip_prefix(BUNDLE_MAGIC).ok_or(Reject::Malformed)?;
    let (n, mut rest) = rest.split_first_chunk::<4>().ok_or(Reject::Malformed)?;
    let n = u32::from_le_bytes(*n) as usize;
    if n > rest.len() / 4 {
        return Err(Reject::Malformed);
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let (len, tail) = rest.split_first_chunk::<4>().ok_or(Reject::Malformed)?;
        let len = u32::from_le_bytes(*len) as usize;
        if len > tail.len() {
            return Err(Reject::Malformed);
        }
        out.push(&tail[..len]);
        rest = &tail[len..];
    }
    if rest.is_empty() {
        Ok(out)
    } else {
        Err(Reject::Malformed)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::aggregate::Method;
    use crate::privacy::Tenant;
    use crate::update::tests::random_update;
    use crate::weighting::Weighting;

    pub(crate) const SHAPE: (u32, &str, usize, usize, usize) = (3, "ffn_down", 2, 12, 6);

    pub(crate) fn specs() -> Vec<AdapterSpec> {
        let t = &[(SHAPE.0, SHAPE.1, SHAPE.3, SHAPE.4)];
        vec![
            AdapterSpec::new("grp", Tier::Group, None, t),
            AdapterSpec::new("talora", Tier::Group, Some(2), t),
            AdapterSpec::new("ten", Tier::Tenant, None, t),
            AdapterSpec::new("pub", Tier::Public, None, t),
            AdapterSpec::new("mine", Tier::Private, None, t),
        ]
    }

    pub(crate) fn config(i: u8, n: usize) -> FederationConfig {
        let members = (1..=n as u8).map(|j| SigningKey::from_bytes(&[j; 32]).verifying_key().to_bytes()).collect();
        FederationConfig {
            federate: true,
            identity: [i; 32],
            adapters: specs(),
            keys: Keys { group: Some([5; 32]), tenant: Some(Tenant { key: [6; 32], members }) },
            dp: DpConfig { epsilon: 1.0, delta: 1e-5, rounds: 4, clip: 1.0 },
            policy: RoundPolicy { weighting: Weighting::TimestepAligned, method: Method::Svd { rank: 4 }, k_anonymity: 5 },
            expected_nodes: n,
            ..FederationConfig::default()
        }
    }

    /// Node `i`'s local updates of every adapter for one round.
    pub(crate) fn local(i: u8, round: u64) -> Vec<Update> {
        let key = SigningKey::from_bytes(&[i; 32]);
        let seed = i as u64 * 1000 + round;
        let mut v = vec![
            random_update(&key, "grp", None, round, &[SHAPE], seed),
            random_update(&key, "talora", Some(0), round, &[SHAPE], seed + 1),
            random_update(&key, "talora", Some(1), round, &[SHAPE], seed + 2),
            random_update(&key, "ten", None, round, &[SHAPE], seed + 3),
            random_update(&key, "pub", None, round, &[SHAPE], seed + 4),
            random_update(&key, "mine", None, round, &[SHAPE], seed + 5),
        ];
        v[1].improvement = i as f32 * 0.1;
        v
    }

    fn contains(hay: &[u8], needle: &[u8]) -> bool {
        hay.windows(needle.len()).any(|w| w == needle)
    }

    #[test]
    fn consent_and_keys_are_required() {
        assert!(Federation::new(FederationConfig { federate: false, ..config(1, 2) }).is_err());
        let mut c = config(1, 2);
        c.keys.group = None;
        assert!(matches!(Federation::new(c), Err(Error::Key(_))));
        let c = config(9, 2);
        assert!(matches!(Federation::new(c), Err(Error::Key(_))), "node 9 is not a tenant member");
    }

    #[test]
    fn only_the_last_keep_rounds_rounds_are_held() {
        let n = 2;
        let mut feds: Vec<Federation> = (1..=n as u8).map(|i| Federation::new(FederationConfig { keep_rounds: 2, ..config(i, n) }).expect("config")).collect();
        assert!(Federation::new(FederationConfig { keep_rounds: 0, ..config(1, n) }).is_err());
        let mut late = Vec::new();
        for round in 1..=3u64 {
            let wire: Vec<Vec<Vec<u8>>> = feds.iter_mut().enumerate().map(|(i, f)| f.prepare(round, local(i as u8 + 1, round)).expect("prepares")).collect();
            // Node 2's round-1 update reaches node 1 only after round 3.
            for e in &wire[1] {
                if round == 1 {
                    late.push(e.clone());
                } else {
                    feds[0].receive(e, Source::Live).expect("accepted");
                }
            }
            let before = feds[0].aggregate(round).expect("aggregates");
            assert_eq!(before, feds[0].aggregate(round).expect("again"), "re-aggregating from the held envelopes is idempotent");
        }
        // Rounds 2 and 3 are held; round 1 only as counts.
        assert_eq!(feds[0].serve(1, &[]), Vec::<Vec<u8>>::new());
        assert_eq!(feds[0].serve(3, &[]).len(), 2 * 5);
        assert!(matches!(feds[0].aggregate(1), Err(Error::Round { round: 1, .. })));
        assert!(matches!(feds[0].prepare(1, local(1, 1)), Err(Error::Round { round: 1, .. })));
        assert_eq!(feds[0].stats().per_round[0].contributors, 1);
        assert_eq!(feds[0].stats().per_round[2].contributors, 2);
        for e in &late {
            assert_eq!(feds[0].receive(e, Source::Live), Err(Reject::Replayed), "an update of a round no longer held");
        }
        assert_eq!(feds[0].contributors(1), 1);
        // Node 2 kept its own round-1 envelopes: an attack built from them still works there.
        assert!(feds[1].attack_envelopes(2, 4).is_ok());
        assert!(feds[0].attack_envelopes(1, 4).is_err(), "round 1's bytes are gone at node 1");
    }

    #[test]
    fn five_nodes_exchange_a_round_by_hand_and_agree() {
        let n = 5;
        let mut feds: Vec<Federation> = (1..=n as u8).map(|i| Federation::new(config(i, n)).expect("config")).collect();
        let mut wire: Vec<Vec<u8>> = Vec::new();
        let mut private_factors = Vec::new();
        for (i, f) in feds.iter_mut().enumerate() {
            let updates = local(i as u8 + 1, 1);
            private_factors.push(updates[5].targets[0].a[..6].iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
            wire.extend(f.prepare(1, updates).expect("prepares"));
        }
        assert_eq!(wire.len(), n * 5, "five wire updates per node, the private one kept");
        for p in &private_factors {
            assert!(!wire.iter().any(|e| contains(e, p)), "private factors on the wire");
        }
        // Everyone receives everything, in a different order, and some things twice.
        for (i, f) in feds.iter_mut().enumerate() {
            for k in 0..wire.len() {
                let e = &wire[(k + 7 * i) % wire.len()];
                let _ = f.receive(e, Source::Live);
            }
            let _ = f.receive(&wire[0], Source::Live);
            assert!(f.ready(1));
        }
        let outs: Vec<RoundOutput> = feds.iter_mut().map(|f| f.aggregate(1).expect("aggregates")).collect();
        assert!(outs.windows(2).all(|w| w[0] == w[1]), "nodes disagree");
        let o = &outs[0];
        assert_eq!(o.aggregates.len(), 5, "grp, talora×2, ten, pub");
        assert!(o.withheld.is_empty());
        let s = feds[0].stats();
        assert_eq!((s.private_kept, s.rounds), (1, 1));
        // Own 5 accepted at prepare, 20 from others; own echoes and the second copy are
        // duplicates, not rejections.
        assert_eq!((s.accepted, s.rejected_total, s.duplicates), (25, 0, 6));
        assert!(s.epsilon > 0.0 && s.epsilon <= 1.0);
        assert!(s.bytes_sent > 0 && s.bytes_received > s.bytes_sent);
    }

    #[test]
    fn public_aggregates_wait_for_k_nodes_and_catch_up_reproduces_the_round() {
        let n = 4;
        let mut feds: Vec<Federation> = (1..=n as u8).map(|i| Federation::new(config(i, n)).expect("config")).collect();
        let wire: Vec<Vec<u8>> = feds.iter_mut().enumerate().flat_map(|(i, f)| f.prepare(1, local(i as u8 + 1, 1)).expect("prepares")).collect();
        for f in feds.iter_mut().take(3) {
            for e in &wire {
                let _ = f.receive(e, Source::Live);
            }
        }
        let out = feds[0].aggregate(1).expect("aggregates");
        assert_eq!(out.withheld, vec![("pub".to_string(), None, 4)], "4 < k = 5");
        // Node 4 saw only its own updates; it catches up from node 1's store.
        let have = feds[3].holders(1);
        assert_eq!(have, vec![feds[3].node_id()]);
        let served = feds[0].serve(1, &have);
        assert_eq!(served.len(), 15, "5 updates of each of the 3 others");
        for e in &served {
            assert_eq!(feds[3].receive(e, Source::CatchUp { round: 1 }), Ok(()));
        }
        assert_eq!(feds[3].aggregate(1).expect("aggregates"), out);
        // Catching up twice changes nothing; the same update in new bytes is a replay.
        for e in &served {
            assert_eq!(feds[3].receive(e, Source::CatchUp { round: 1 }), Err(Reject::Replayed));
        }
        assert_eq!(feds[3].stats().duplicates, 15);
        let (_, body) = open(&served[0], &feds[3].cfg.keys).expect("opens");
        let resealed = seal(&Update::decode(&body, 64).expect("decodes"), &feds[3].cfg.keys, &mut rand::thread_rng()).expect("seals");
        assert_eq!(feds[3].receive(&resealed, Source::CatchUp { round: 1 }), Err(Reject::Replayed));
        assert_eq!(feds[3].stats().rejected.get("replayed"), Some(&1));
        assert_eq!(feds[3].aggregate(1).expect("aggregates"), out);
    }

    #[test]
    fn bundles_round_trip_and_bad_ones_count_once() {
        let envs = vec![vec![1u8, 2, 3], vec![], vec![9; 300]];
        let b = bundle(&envs);
        assert_eq!(unbundle(&b).expect("unbundles"), envs.iter().map(Vec::as_slice).collect::<Vec<_>>());
        for n in 0..b.len() {
            assert!(unbundle(&b[..n]).is_err());
        }
        let mut f = Federation::new(config(1, 2)).expect("config");
        assert_eq!(f.receive_bundle(b"nonsense", Source::Live), vec![Err(Reject::Malformed)]);
        assert_eq!(f.receive_bundle(&b, Source::Live).len(), 3);
        assert_eq!(f.stats().rejected_total, 4);
    }

    #[test]
    fn tampered_envelopes_are_rejected_and_never_aggregated() {
        let mut a = Federation::new(config(1, 2)).expect("config");
        let mut b = Federation::new(config(2, 2)).expect("config");
        let wire = a.prepare(1, local(1, 1)).expect("prepares");
        let mut bad = wire[0].clone();
        let at = bad.len() - 30;
        bad[at] ^= 0x40;
        assert_eq!(b.receive(&bad, Source::Live), Err(Reject::Undecryptable));
        let mut pub_tampered = wire[4].clone();
        let at = pub_tampered.len() - 100;
        pub_tampered[at] ^= 0x40;
        assert_eq!(b.receive(&pub_tampered, Source::Live), Err(Reject::BadSignature));
        assert_eq!(b.receive(b"garbage", Source::Live), Err(Reject::Malformed));
        assert_eq!(b.contributors(1), 0);
        for e in &wire {
            assert_eq!(b.receive(e, Source::Live), Ok(()));
        }
        assert_eq!(b.receive(&wire[1], Source::Live), Err(Reject::Replayed));
        let s = b.stats();
        assert_eq!((s.accepted, s.rejected_total, s.duplicates), (5, 3, 1));
        assert_eq!(s.bytes_unattributed, 7);
    }
}
