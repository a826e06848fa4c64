//! Diffusion-aware federation (DAF): how much each client's update counts, per adapter and
//! per timestep bucket.
//!
//! A TALoRA adapter has one set of factors per range of mask ratios (timestep bucket); a client
//! whose data made its bucket-`b` adapter better (held-out loss down) should shape bucket `b`'s
//! aggregate more than one whose bucket-`b` adapter learned nothing, even if the latter saw more
//! samples. Each bucket is therefore aggregated on its own, with one of:
//!
//! - [`Weighting::FedAvg`]: `wᵢ ∝ nᵢ` (samples), as in FedAvg (McMahan et al., 2017);
//! - [`Weighting::QualityWeighted`]: `wᵢ ∝ nᵢ · clamp(qᵢ, 0, 1)`: samples counted at the mean
//!   quality of the feedback they carried;
//! - [`Weighting::TimestepAligned`]: `wᵢ ∝ max(Δℓᵢ, 0)`, the client's measured loss improvement
//!   on that bucket; when no client improved, FedAvg;
//! - [`Weighting::Hybrid`]: the convex mix `λ·w_TA + (1 − λ)·w_QW` of the two normalised
//!   weightings. A mix rather than a product: a product zeroes a client that is strong on one
//!   signal and zero on the other, and a single zero signal would then silence the bucket.
//!
//! Within a group the updates are ordered by node id before anything is summed, so every node
//! that aggregates the same set gets bit-identical factors.

use std::collections::BTreeMap;

use crate::aggregate::{aggregate, Aggregate, Method};
use crate::update::{Tier, Update};
use crate::Result;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Weighting {
    FedAvg,
    QualityWeighted,
    TimestepAligned,
    /// `mix` is λ, the weight of TimestepAligned, in `[0, 1]`.
    Hybrid {
        mix: f64,
    },
}

impl Weighting {
    pub fn parse(s: &str) -> Option<Weighting> {
        Some(match s {
            "fedavg" => Weighting::FedAvg,
            "quality" => Weighting::QualityWeighted,
            "timestep" => Weighting::TimestepAligned,
            "hybrid" => Weighting::Hybrid { mix: 0.5 },
            _ => return None,
        })
    }
}

fn normalised(raw: Vec<f64>) -> Option<Vec<f64>> {
    let sum: f64 = raw.iter().sum();
    (sum > 0.0 && sum.is_finite()).then(|| raw.iter().map(|w| w / sum).collect())
}

/// The normalised weights of `updates` (one adapter, one bucket) under `scheme`.
pub fn weights(updates: &[&Update], scheme: Weighting) -> Vec<f64> {
    let n = updates.len();
    let uniform = || vec![1.0 / n as f64; n];
    let fedavg = || normalised(updates.iter().map(|u| u.samples as f64).collect()).unwrap_or_else(uniform);
    let quality = || normalised(updates.iter().map(|u| u.samples as f64 * (u.quality as f64).clamp(0.0, 1.0)).collect()).unwrap_or_else(fedavg);
    let aligned = || normalised(updates.iter().map(|u| (u.improvement as f64).max(0.0)).collect()).unwrap_or_else(fedavg);
    match scheme {
        Weighting::FedAvg => fedavg(),
        Weighting::QualityWeighted => quality(),
        Weighting::TimestepAligned => aligned(),
        Weighting::Hybrid { mix } => {
            let l = mix.clamp(0.0, 1.0);
            aligned().iter().zip(quality()).map(|(a, q)| l * a + (1.0 - l) * q).collect()
        }
    }
}

/// How one round's accepted updates become aggregates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundPolicy {
    pub weighting: Weighting,
    pub method: Method,
    /// A public-tier aggregate is released only when at least this many distinct nodes
    /// contributed to it (k-anonymity).
    pub k_anonymity: usize,
}

impl Default for RoundPolicy {
    fn default() -> Self {
        RoundPolicy { weighting: Weighting::FedAvg, method: Method::Svd { rank: 8 }, k_anonymity: 5 }
    }
}

/// The aggregates of one round, and the public groups withheld for too few contributors.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RoundOutput {
    pub aggregates: Vec<Aggregate>,
    /// `(adapter, bucket, distinct nodes)` of each withheld public group.
    pub withheld: Vec<(String, Option<u16>, usize)>,
}

impl RoundOutput {
    /// SHA-256 of everything in the output (factor values by their bits): equal digests, equal
    /// aggregates; what nodes in different processes compare.
    pub fn digest(&self) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        for a in &self.aggregates {
            h.update((a.adapter.len() as u64).to_le_bytes());
            h.update(a.adapter.as_bytes());
            h.update(format!("{:?}{:?}", a.bucket, a.method).as_bytes());
            h.update(a.scale.to_bits().to_le_bytes());
            for t in &a.targets {
                h.update(t.name().as_bytes());
                for d in [t.rank, t.d_in, t.d_out] {
                    h.update((d as u64).to_le_bytes());
                }
                t.a.iter().chain(&t.b).for_each(|v| h.update(v.to_bits().to_le_bytes()));
            }
            a.contributors.iter().for_each(|c| h.update(c));
            a.weights.iter().chain(&a.truncation_error).for_each(|w| h.update(w.to_bits().to_le_bytes()));
        }
        for (adapter, bucket, n) in &self.withheld {
            h.update(format!("{adapter}{bucket:?}{n}").as_bytes());
        }
        h.finalize().into()
    }
}

/// Groups `updates` by adapter and bucket and aggregates each group under `policy`. Updates are
/// assumed validated (one per node per group: the validator's replay rule).
pub fn aggregate_round(updates: &[Update], policy: &RoundPolicy) -> Result<RoundOutput> {
    let mut groups: BTreeMap<(String, Option<u16>), Vec<&Update>> = BTreeMap::new();
    for u in updates {
        groups.entry((u.adapter.clone(), u.bucket)).or_default().push(u);
    }
    let mut out = RoundOutput::default();
    for ((adapter, bucket), mut group) in groups {
        group.sort_by_key(|u| u.node);
        group.dedup_by(|a, b| a.node == b.node);
        if group.iter().any(|u| u.tier == Tier::Public) && group.len() < policy.k_anonymity {
            out.withheld.push((adapter, bucket, group.len()));
            continue;
        }
        let w = weights(&group, policy.weighting);
        out.aggregates.push(aggregate(&group, &w, policy.method)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::update::tests::{key, random_update};

    const T: &[(u32, &str, usize, usize, usize)] = &[(0, "attn_q", 1, 4, 4)];

    fn client(i: u8, bucket: u16, samples: u64, quality: f32, improvement: f32) -> Update {
        let mut u = random_update(&key(i), "talora", Some(bucket), 1, T, i as u64);
        (u.samples, u.quality, u.improvement) = (samples, quality, improvement);
        u
    }

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6)
    }

    #[test]
    fn each_scheme_on_a_constructed_case() {
        let us = [client(1, 0, 100, 0.5, 0.0), client(2, 0, 300, 1.0, 0.2), client(3, 0, 100, 0.0, 0.6)];
        let r: Vec<&Update> = us.iter().collect();
        assert!(close(&weights(&r, Weighting::FedAvg), &[0.2, 0.6, 0.2]));
        // 50 : 300 : 0
        assert!(close(&weights(&r, Weighting::QualityWeighted), &[50.0 / 350.0, 300.0 / 350.0, 0.0]));
        // 0 : 0.2 : 0.6, whatever the sample counts
        assert!(close(&weights(&r, Weighting::TimestepAligned), &[0.0, 0.25, 0.75]));
        let h = weights(&r, Weighting::Hybrid { mix: 0.5 });
        assert!(close(&h, &[0.5 * 50.0 / 350.0, 0.5 * 0.25 + 0.5 * 300.0 / 350.0, 0.5 * 0.75]));
        assert!(close(&weights(&r, Weighting::Hybrid { mix: 1.0 }), &weights(&r, Weighting::TimestepAligned)));
        assert!(close(&weights(&r, Weighting::Hybrid { mix: 0.0 }), &weights(&r, Weighting::QualityWeighted)));
    }

    #[test]
    fn negative_improvements_are_clamped_and_all_zero_falls_back_to_samples() {
        let us = [client(1, 0, 10, 1.0, -0.5), client(2, 0, 30, 1.0, 0.1)];
        let r: Vec<&Update> = us.iter().collect();
        assert!(close(&weights(&r, Weighting::TimestepAligned), &[0.0, 1.0]));
        let none = [client(1, 0, 10, 1.0, -0.5), client(2, 0, 30, 1.0, 0.0)];
        let r: Vec<&Update> = none.iter().collect();
        assert!(close(&weights(&r, Weighting::TimestepAligned), &[0.25, 0.75]));
        let zero_quality = [client(1, 0, 10, 0.0, 0.0), client(2, 0, 30, -1.0, 0.0)];
        let r: Vec<&Update> = zero_quality.iter().collect();
        assert!(close(&weights(&r, Weighting::QualityWeighted), &[0.25, 0.75]));
    }

    #[test]
    fn buckets_are_aggregated_separately_with_their_own_weights() {
        // Client 1 improved bucket 0 only, client 2 bucket 1 only.
        let us = vec![client(1, 0, 10, 1.0, 0.4), client(2, 0, 10, 1.0, 0.0), client(1, 1, 10, 1.0, 0.0), client(2, 1, 10, 1.0, 0.3)];
        let policy = RoundPolicy { weighting: Weighting::TimestepAligned, method: Method::Stack, k_anonymity: 5 };
        let out = aggregate_round(&us, &policy).expect("aggregates");
        assert_eq!(out.aggregates.len(), 2);
        let (k1, k2) = (key(1).verifying_key().to_bytes(), key(2).verifying_key().to_bytes());
        for agg in &out.aggregates {
            let best = if agg.bucket == Some(0) { k1 } else { k2 };
            let at = agg.contributors.iter().position(|c| *c == best).expect("contributed");
            assert_eq!(agg.weights[at], 1.0, "bucket {:?}", agg.bucket);
        }
    }

    /// A constructed diffusion case: each bucket has a true change `T_b`; client `i`'s bucket-`b`
    /// update is `T_b` plus noise whose size depends on (client, bucket): each client is good
    /// at some buckets (its data covers those mask ratios) and poor at others. The measured
    /// improvement is the proxy a client can compute, the decrease of `‖T_b − W‖²` from `W = 0`
    /// to `W = U_ib`. TimestepAligned must land closer to `T_b` than sample-count FedAvg.
    #[test]
    fn timestep_aligned_beats_fedavg_when_clients_differ_per_bucket() {
        use crate::aggregate::dense_mean;
        use crate::update::Factors;
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let (d, r) = (16usize, 2usize);
        let mut gauss = move |s: f32| s * (rng.gen_range(-1.0f32..1.0) + rng.gen_range(-1.0f32..1.0) + rng.gen_range(-1.0f32..1.0));
        // Noise of client i on bucket b: small on "its" bucket, large elsewhere.
        let noise = |i: usize, b: usize| if i % 2 == b { 0.05 } else { 1.0 };
        for b in 0..2usize {
            let truth = Factors::new(0, "attn_q", r, d, d, (0..r * d).map(|_| gauss(1.0)).collect(), (0..d * r).map(|_| gauss(1.0)).collect()).expect("shapes");
            let t = truth.delta(1.0);
            let t_norm: f64 = t.iter().map(|x| x * x).sum();
            let mut clients = Vec::new();
            for i in 0..4usize {
                // Rank-r factors of the truth plus factor noise.
                let a: Vec<f32> = truth.a.iter().map(|&x| x + gauss(noise(i, b))).collect();
                let bb: Vec<f32> = truth.b.iter().map(|&x| x + gauss(noise(i, b))).collect();
                let f = Factors::new(0, "attn_q", r, d, d, a, bb).expect("shapes");
                let u_err: f64 = f.delta(1.0).iter().zip(&t).map(|(x, y)| (x - y) * (x - y)).sum();
                let mut u = random_update(&key(i as u8 + 1), "talora", Some(b as u16), 1, T, i as u64);
                (u.targets, u.scale, u.quality) = (vec![f], 1.0, 1.0);
                // Poor clients have seen more samples: FedAvg trusts them more.
                u.samples = if noise(i, b) > 0.5 { 300 } else { 100 };
                u.improvement = ((t_norm - u_err) / t_norm) as f32;
                clients.push(u);
            }
            let refs: Vec<&Update> = clients.iter().collect();
            let err = |scheme| {
                let w = weights(&refs, scheme);
                let m = &dense_mean(&refs, &w).expect("mean")[0].values;
                (m.iter().zip(&t).map(|(x, y)| (x - y) * (x - y)).sum::<f64>() / t_norm).sqrt()
            };
            let (fedavg, aligned, hybrid) = (err(Weighting::FedAvg), err(Weighting::TimestepAligned), err(Weighting::Hybrid { mix: 0.5 }));
            assert!(aligned < 0.5 * fedavg, "bucket {b}: timestep-aligned {aligned} vs FedAvg {fedavg}");
            assert!(hybrid < fedavg, "bucket {b}: hybrid {hybrid} vs FedAvg {fedavg}");
        }
    }

    #[test]
    fn aggregation_is_independent_of_arrival_order() {
        let us: Vec<Update> = (1..=4).map(|i| client(i, 0, 10 * i as u64, 0.9, 0.1 * i as f32)).collect();
        let mut rev = us.clone();
        rev.reverse();
        let policy = RoundPolicy { weighting: Weighting::Hybrid { mix: 0.3 }, method: Method::Svd { rank: 2 }, k_anonymity: 5 };
        assert_eq!(aggregate_round(&us, &policy).expect("a"), aggregate_round(&rev, &policy).expect("b"));
    }

    #[test]
    fn public_groups_need_k_distinct_nodes() {
        let mut us: Vec<Update> = (1..=4).map(|i| client(i, 0, 10, 1.0, 0.1)).collect();
        us.iter_mut().for_each(|u| u.tier = Tier::Public);
        let policy = RoundPolicy::default();
        let out = aggregate_round(&us, &policy).expect("runs");
        assert!(out.aggregates.is_empty());
        assert_eq!(out.withheld, vec![("talora".to_string(), Some(0), 4)]);
        let mut fifth = client(5, 0, 10, 1.0, 0.1);
        fifth.tier = Tier::Public;
        us.push(fifth);
        // A duplicate from one node does not count twice.
        us.push(us[0].clone());
        let out = aggregate_round(&us, &policy).expect("runs");
        assert_eq!(out.aggregates.len(), 1);
        assert_eq!(out.aggregates[0].contributors.len(), 5);
    }
}
