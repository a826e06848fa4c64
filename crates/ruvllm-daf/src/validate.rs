//! Validation of received updates: nothing reaches aggregation before it passes here.
//!
//! Order of the checks: size (before decoding), decoding, finiteness, signature, policy
//! (tier, tenant membership), shape, replay. The replay state is written only for updates that
//! pass every other check, so a forged or broken copy cannot make the genuine one look replayed.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::update::{Tier, Update};

/// Why an update was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reject {
    /// Bytes that do not decode as an update (or an envelope).
    Malformed,
    /// No signature.
    Unsigned,
    /// A signature that does not verify against the update's node key.
    BadSignature,
    /// The same node, round, adapter and bucket seen before, or a round more than
    /// [`Limits::max_round_lag`] older than the newest accepted from that node for that
    /// adapter and bucket.
    Replayed,
    /// More bytes, targets or rank than the limits allow.
    Oversized,
    /// Targets or dimensions unlike the adapter's expected shapes (or a bucket it does not have).
    ShapeMismatch,
    /// A NaN or infinity among the factors or scalars.
    NonFinite,
    /// An adapter this node does not federate.
    UnknownAdapter,
    /// A tenant-tier update from a node not on the tenant's member list.
    NotTenantMember,
    /// An envelope that does not decrypt with the tier's key (wrong key or tampered).
    Undecryptable,
    /// The update's tier differs from the tier this node federates the adapter at (a private
    /// update on the wire, a public update in a group envelope, ...).
    WrongTier,
}

impl Reject {
    pub const ALL: [Reject; 11] = [
        Reject::Malformed,
        Reject::Unsigned,
        Reject::BadSignature,
        Reject::Replayed,
        Reject::Oversized,
        Reject::ShapeMismatch,
        Reject::NonFinite,
        Reject::UnknownAdapter,
        Reject::NotTenantMember,
        Reject::Undecryptable,
        Reject::WrongTier,
    ];

    /// camelCase, as the stats give it to JavaScript.
    pub fn name(self) -> &'static str {
        match self {
            Reject::Malformed => "malformed",
            Reject::Unsigned => "unsigned",
            Reject::BadSignature => "badSignature",
            Reject::Replayed => "replayed",
            Reject::Oversized => "oversized",
            Reject::ShapeMismatch => "shapeMismatch",
            Reject::NonFinite => "nonFinite",
            Reject::UnknownAdapter => "unknownAdapter",
            Reject::NotTenantMember => "notTenantMember",
            Reject::Undecryptable => "undecryptable",
            Reject::WrongTier => "wrongTier",
        }
    }
}

/// Size limits on what a node accepts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Bytes of one encoded update (or envelope).
    pub max_bytes: usize,
    /// Bytes of one gossip message (a node's bundle of envelopes for a round).
    pub max_message_bytes: usize,
    /// Rank of any one target.
    pub max_rank: usize,
    /// Targets in one update.
    pub max_targets: usize,
    /// How many rounds older than the newest seen from a sender a live update may be. 0: any
    /// older round is a replay. Gossip delivers late at times (a peer's queue flushed after a
    /// reconnect), and a late update of a round still open is no attack: the signed round
    /// number puts it in its own round, never in the current one. Catch-up, which asks for an
    /// old round on purpose, is not limited by this.
    pub max_round_lag: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_bytes: 16 << 20, max_message_bytes: 64 << 20, max_rank: 64, max_targets: 512, max_round_lag: 4 }
    }
}

/// What an adapter's updates must look like: its targets' `(layer, proj) → (d_in, d_out)` and
/// how many timestep buckets it has (`None`: it is not bucketed).
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterSpec {
    pub id: String,
    pub tier: Tier,
    pub buckets: Option<u16>,
    pub targets: BTreeMap<(u32, String), (usize, usize)>,
}

impl AdapterSpec {
    /// A spec with `targets` given as `(layer, proj, d_in, d_out)`.
    pub fn new(id: &str, tier: Tier, buckets: Option<u16>, targets: &[(u32, &str, usize, usize)]) -> AdapterSpec {
        AdapterSpec { id: id.into(), tier, buckets, targets: targets.iter().map(|&(l, p, i, o)| ((l, p.to_string()), (i, o))).collect() }
    }

    fn shape_ok(&self, u: &Update) -> bool {
        let bucket_ok = match (self.buckets, u.bucket) {
            (None, None) => true,
            (Some(n), Some(b)) => b < n,
            _ => false,
        };
        let mut seen = HashSet::new();
        bucket_ok
            && !u.targets.is_empty()
            && u.targets.iter().all(|t| {
                seen.insert((t.layer, t.proj.as_str()))
                    && t.rank > 0
                    && self.targets.get(&(t.layer, t.proj.clone())) == Some(&(t.d_in, t.d_out))
                    && t.a.len() == t.rank * t.d_in
                    && t.b.len() == t.d_out * t.rank
            })
    }
}

/// Where an update came from: live gossip, or a catch-up answer for a round this node missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Live,
    /// Catch-up for `round`: updates must be of that round; an older round than the newest seen
    /// from the sender is expected here (the node missed it), an exact duplicate is still refused.
    CatchUp {
        round: u64,
    },
}

/// Accepted and rejected counts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    pub accepted: u64,
    pub rejected: BTreeMap<Reject, u64>,
}

impl Counters {
    pub fn rejected_total(&self) -> u64 {
        self.rejected.values().sum()
    }

    pub fn count(&mut self, r: std::result::Result<(), Reject>) {
        match r {
            Ok(()) => self.accepted += 1,
            Err(e) => *self.rejected.entry(e).or_default() += 1,
        }
    }
}

type ReplayKey = ([u8; 32], String, Option<u16>);

/// Checks updates against the limits, the adapters' specs and the replay state; counts each
/// outcome.
#[derive(Debug, Clone)]
pub struct Validator {
    pub limits: Limits,
    specs: HashMap<String, AdapterSpec>,
    /// Tenant members (public keys), for tenant-tier adapters.
    tenant: HashSet<[u8; 32]>,
    newest: HashMap<ReplayKey, u64>,
    seen: HashSet<(ReplayKey, u64)>,
    pub counters: Counters,
}

impl Validator {
    pub fn new(limits: Limits, specs: &[AdapterSpec], tenant_members: &[[u8; 32]]) -> Validator {
        Validator {
            limits,
            specs: specs.iter().map(|s| (s.id.clone(), s.clone())).collect(),
            tenant: tenant_members.iter().copied().collect(),
            newest: HashMap::new(),
            seen: HashSet::new(),
            counters: Counters::default(),
        }
    }

    pub fn spec(&self, adapter: &str) -> Option<&AdapterSpec> {
        self.specs.get(adapter)
    }

    /// Decodes and checks an encoded update; counts the outcome.
    pub fn accept_bytes(&mut self, bytes: &[u8], source: Source) -> std::result::Result<Update, Reject> {
        let r = if bytes.len() > self.limits.max_bytes { Err(Reject::Oversized) } else { Update::decode(bytes, self.limits.max_rank) };
        match r {
            Ok(u) => self.accept(u, source),
            Err(e) => {
                self.counters.count(Err(e));
                Err(e)
            }
        }
    }

    /// Checks a decoded update; counts the outcome; on success records it for replay checks.
    pub fn accept(&mut self, u: Update, source: Source) -> std::result::Result<Update, Reject> {
        let r = self.check(&u, source);
        self.counters.count(r.as_ref().map(|_| ()).map_err(|e| *e));
        let key = r?;
        self.newest.entry(key.clone()).and_modify(|n| *n = (*n).max(u.round)).or_insert(u.round);
        self.seen.insert((key, u.round));
        Ok(u)
    }

    /// Every check, without counting or recording.
    pub fn check(&self, u: &Update, source: Source) -> std::result::Result<ReplayKey, Reject> {
        if u.targets.len() > self.limits.max_targets || u.max_rank() > self.limits.max_rank {
            return Err(Reject::Oversized);
        }
        if !u.all_finite() {
            return Err(Reject::NonFinite);
        }
        u.verify()?;
        let spec = self.specs.get(&u.adapter).ok_or(Reject::UnknownAdapter)?;
        if u.tier != spec.tier || u.tier == Tier::Private {
            return Err(Reject::WrongTier);
        }
        if u.tier == Tier::Tenant && !self.tenant.contains(&u.node) {
            return Err(Reject::NotTenantMember);
        }
        if !spec.shape_ok(u) {
            return Err(Reject::ShapeMismatch);
        }
        let key = (u.node, u.adapter.clone(), u.bucket);
        if self.seen.contains(&(key.clone(), u.round)) {
            return Err(Reject::Replayed);
        }
        match source {
            Source::Live => {
                if self.newest.get(&key).is_some_and(|&n| u.round.saturating_add(self.limits.max_round_lag) < n) {
                    return Err(Reject::Replayed);
                }
            }
            Source::CatchUp { round } => {
                if u.round != round {
                    return Err(Reject::Replayed);
                }
            }
        }
        Ok(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::update::tests::{key, random_update};

    const T: &[(u32, &str, usize, usize, usize)] = &[(5, "ffn_down", 2, 8, 4)];

    fn validator() -> Validator {
        Validator::new(
            Limits { max_bytes: 4096, max_message_bytes: 16384, max_rank: 4, max_targets: 4, max_round_lag: 0 },
            &[AdapterSpec::new("m", Tier::Group, Some(4), &[(5, "ffn_down", 8, 4)])],
            &[],
        )
    }

    #[test]
    fn each_bad_update_is_rejected_with_its_reason_and_counted() {
        let mut v = validator();
        let good = random_update(&key(1), "m", Some(1), 3, T, 1);
        assert!(v.accept(good.clone(), Source::Live).is_ok());

        let mut unsigned = random_update(&key(2), "m", Some(1), 3, T, 2);
        unsigned.signature = None;
        let mut forged = random_update(&key(2), "m", Some(1), 3, T, 3);
        forged.targets[0].a[0] += 1.0;
        let mut stolen = random_update(&key(2), "m", Some(1), 3, T, 4);
        stolen.node = key(3).verifying_key().to_bytes();
        let older = random_update(&key(1), "m", Some(1), 2, T, 5);
        let big = random_update(&key(2), "m", Some(1), 3, &[(5, "ffn_down", 5, 8, 4)], 6);
        let wrong_dim = random_update(&key(2), "m", Some(1), 3, &[(5, "ffn_down", 2, 8, 5)], 7);
        let wrong_target = random_update(&key(2), "m", Some(1), 3, &[(4, "ffn_down", 2, 8, 4)], 8);
        let wrong_bucket = random_update(&key(2), "m", Some(4), 3, T, 9);
        let no_bucket = random_update(&key(2), "m", None, 3, T, 10);
        let mut nan = random_update(&key(2), "m", Some(1), 3, T, 11);
        nan.targets[0].b[1] = f32::NAN;
        nan.sign(&key(2));
        let unknown = random_update(&key(2), "other", Some(1), 3, T, 12);
        let mut private = random_update(&key(2), "m", Some(1), 3, T, 13);
        private.tier = Tier::Private;
        private.sign(&key(2));

        let cases = [
            (unsigned, Reject::Unsigned),
            (forged, Reject::BadSignature),
            (stolen, Reject::BadSignature),
            (good.clone(), Reject::Replayed),
            (older, Reject::Replayed),
            (big, Reject::Oversized),
            (wrong_dim, Reject::ShapeMismatch),
            (wrong_target, Reject::ShapeMismatch),
            (wrong_bucket, Reject::ShapeMismatch),
            (no_bucket, Reject::ShapeMismatch),
            (nan, Reject::NonFinite),
            (unknown, Reject::UnknownAdapter),
            (private, Reject::WrongTier),
        ];
        let n = cases.len() as u64;
        for (u, want) in cases {
            assert_eq!(v.accept(u, Source::Live).err(), Some(want));
        }
        assert_eq!(v.counters.accepted, 1);
        assert_eq!(v.counters.rejected_total(), n);
        assert_eq!(v.counters.rejected[&Reject::ShapeMismatch], 4);
        assert_eq!(v.counters.rejected[&Reject::Replayed], 2);
    }

    #[test]
    fn oversized_and_garbage_bytes_are_rejected_before_decoding() {
        let mut v = validator();
        assert_eq!(v.accept_bytes(&vec![0u8; 4097], Source::Live).err(), Some(Reject::Oversized));
        assert_eq!(v.accept_bytes(b"not an update", Source::Live).err(), Some(Reject::Malformed));
        let ok = random_update(&key(1), "m", Some(0), 1, T, 1).encode();
        assert!(v.accept_bytes(&ok, Source::Live).is_ok());
        assert_eq!(v.counters.rejected_total(), 2);
    }

    #[test]
    fn a_forged_copy_does_not_block_the_genuine_update() {
        let mut v = validator();
        let good = random_update(&key(1), "m", Some(0), 1, T, 1);
        let mut forged = good.clone();
        forged.targets[0].a[3] = 9.0;
        assert_eq!(v.accept(forged, Source::Live).err(), Some(Reject::BadSignature));
        assert!(v.accept(good, Source::Live).is_ok());
    }

    #[test]
    fn catch_up_takes_a_missed_older_round_once() {
        let mut v = validator();
        assert!(v.accept(random_update(&key(1), "m", Some(0), 5, T, 1), Source::Live).is_ok());
        let missed = random_update(&key(1), "m", Some(0), 4, T, 2);
        assert_eq!(v.check(&missed, Source::Live).err(), Some(Reject::Replayed));
        assert_eq!(v.check(&missed, Source::CatchUp { round: 3 }).err(), Some(Reject::Replayed), "not the round asked for");
        assert!(v.accept(missed.clone(), Source::CatchUp { round: 4 }).is_ok());
        assert_eq!(v.accept(missed, Source::CatchUp { round: 4 }).err(), Some(Reject::Replayed));
    }

    #[test]
    fn a_late_update_within_the_lag_is_taken_an_older_one_is_a_replay() {
        let mut v = validator();
        v.limits.max_round_lag = 2;
        assert!(v.accept(random_update(&key(1), "m", Some(0), 5, T, 1), Source::Live).is_ok());
        assert!(v.accept(random_update(&key(1), "m", Some(0), 3, T, 2), Source::Live).is_ok());
        assert_eq!(v.accept(random_update(&key(1), "m", Some(0), 2, T, 3), Source::Live).err(), Some(Reject::Replayed));
        assert_eq!(v.accept(random_update(&key(1), "m", Some(0), 3, T, 4), Source::Live).err(), Some(Reject::Replayed), "round 3 is held");
    }

    #[test]
    fn tenant_updates_only_from_members() {
        let spec = AdapterSpec::new("t", Tier::Tenant, None, &[(5, "ffn_down", 8, 4)]);
        let mut v = Validator::new(Limits::default(), &[spec], &[key(1).verifying_key().to_bytes()]);
        let mut member = random_update(&key(1), "t", None, 1, T, 1);
        member.tier = Tier::Tenant;
        member.sign(&key(1));
        let mut outsider = random_update(&key(2), "t", None, 1, T, 2);
        outsider.tier = Tier::Tenant;
        outsider.sign(&key(2));
        assert!(v.accept(member, Source::Live).is_ok());
        assert_eq!(v.accept(outsider, Source::Live).err(), Some(Reject::NotTenantMember));
    }
}
