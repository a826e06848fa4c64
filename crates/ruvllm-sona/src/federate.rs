//! The learned BaseLoRA as a federation adapter. A federating node's adapters are two:
//!
//! - the **global adapter** `G`, the same on every node: what the federation has learned so
//!   far, frozen locally (served, and applied under training as part of the model);
//! - the **local BaseLoRA** `L`, trained on this node's feedback on top of `G`.
//!
//! A round publishes `L` (one `ruvllm_daf::Update` target per slot, the projection by its GGUF
//! name): this node's change since the last round. The nodes' adapters are `G + Lᵢ`, so the
//! exact weighted mean of their `ΔW` is `G + Σ wᵢLᵢ`; the round's aggregate of the `Lᵢ` (FLoRA
//! stacking, exact) is added to `G` ([`accumulate`]), which is re-factorised by truncated SVD
//! only when its rank would pass a cap (the error reported), and `L` starts afresh. The
//! learner's methods that use these are in `learner.rs` (`federated_update`,
//! `apply_federated`); the transport is `ruvllm_daf::Node`.

use ruvllm_daf::aggregate::{Aggregate, Method};
use ruvllm_daf::flat::{from_flat, into_flat, FlatSlot};
use ruvllm_daf::update::{Tier, Update};
use ruvllm_daf::validate::AdapterSpec;
use sha2::{Digest, Sha256};

use crate::grad::{LoraParams, Slot};
use crate::{Error, Result};

/// The id nodes agree on for SONA's BaseLoRA.
pub const ADAPTER_ID: &str = "sona.base";

/// The flat layout of `p`, one [`FlatSlot`] per slot.
pub fn flat_slots(p: &LoraParams) -> Vec<FlatSlot> {
    p.slots.iter().map(|s| FlatSlot { layer: s.layer as u32, proj: s.proj.gguf_name().to_string(), d_in: s.d_in, d_out: s.d_out, a: s.a, b: s.b }).collect()
}

/// What a node expects of the adapter's updates: the same targets and shapes as its own.
pub fn adapter_spec(p: &LoraParams, tier: Tier) -> AdapterSpec {
    let targets: Vec<(u32, &str, usize, usize)> = p.slots.iter().map(|s| (s.layer as u32, s.proj.gguf_name(), s.d_in, s.d_out)).collect();
    AdapterSpec::new(ADAPTER_ID, tier, None, &targets)
}

/// How many examples an update learned from and how good they were (the weights' inputs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Provenance {
    pub samples: u64,
    /// Mean quality in `[0, 1]`.
    pub quality: f32,
    /// Held-out loss before minus after; 0 when not measured.
    pub improvement: f32,
}

/// `p` as an unsigned update for `round` (the federation sets tier and round from the
/// adapter's spec when it signs).
pub fn to_update(p: &LoraParams, tier: Tier, round: u64, prov: Provenance) -> Result<Update> {
    let targets = from_flat(p.rank, &flat_slots(p), &p.w)?;
    Ok(Update {
        adapter: ADAPTER_ID.into(),
        bucket: None,
        targets,
        scale: p.scale,
        samples: prov.samples,
        quality: prov.quality.clamp(0.0, 1.0),
        improvement: prov.improvement,
        tier,
        node: [0; 32],
        round,
        signature: None,
    })
}

/// The federation's global adapter after a round: `global + agg` (the aggregate of the nodes'
/// changes since the last global adapter), re-factorised to at most `cap` components per
/// projection by truncated SVD ([`ruvllm_daf::aggregate::accumulate`]). `template` gives the
/// slots (the local BaseLoRA's). The result applies `B·A` (scale 1), its rank the largest
/// target's (smaller targets padded with zero components); returned with the truncation's
/// largest relative error (0 while the sum's rank fits `cap`).
pub fn accumulate(global: Option<&LoraParams>, template: &LoraParams, agg: &Aggregate, cap: usize) -> Result<(LoraParams, f64)> {
    if agg.adapter != ADAPTER_ID || agg.bucket.is_some() {
        return Err(Error::InvalidArg(format!("aggregate of adapter '{}' is not SONA's BaseLoRA ('{ADAPTER_ID}')", agg.adapter)));
    }
    let prev = match global {
        Some(g) => global_factors(g)?,
        None => Vec::new(),
    };
    let (targets, errs) = ruvllm_daf::aggregate::accumulate(&prev, agg, cap)?;
    let err = errs.iter().copied().fold(0.0, f64::max);
    Ok((global_params(template, targets, agg)?, err))
}

/// `targets` (scale 1) in `template`'s slots at the largest target's rank.
fn global_params(template: &LoraParams, targets: Vec<ruvllm_daf::update::Factors>, agg: &Aggregate) -> Result<LoraParams> {
    let rank = targets.iter().map(|t| t.rank).max().unwrap_or(1).max(1);
    let mut slots = Vec::with_capacity(template.slots.len());
    let mut off = 0;
    for s in &template.slots {
        slots.push(Slot { a: off, b: off + rank * s.d_in, ..s.clone() });
        off += rank * (s.d_in + s.d_out);
    }
    let n_layer = template.slots.iter().map(|s| s.layer + 1).max().unwrap_or(0);
    let mut g = LoraParams::from_parts(n_layer, rank, 1.0, slots, vec![0.0; off]);
    let whole = Aggregate { targets, scale: 1.0, truncation_error: Vec::new(), ..agg.clone() };
    let mut w = std::mem::take(&mut g.w);
    into_flat(&whole, rank, 1.0, &flat_slots(&g), &mut w)?;
    g.w = w;
    Ok(g)
}

/// The global adapter's factors, each target applying `g.scale·B·A` folded into `B`.
fn global_factors(g: &LoraParams) -> Result<Vec<ruvllm_daf::update::Factors>> {
    let mut f = from_flat(g.rank, &flat_slots(g), &g.w)?;
    if g.scale != 1.0 {
        f.iter_mut().for_each(|t| t.b.iter_mut().for_each(|x| *x *= g.scale));
    }
    Ok(f)
}

/// How a round combines the nodes' changes: `exact` (FLoRA stacking: the exact weighted mean
/// of the changes, which the global adapter then holds up to its rank cap), `svd` (that mean
/// re-factorised to `rank` first) or `fedavg` (factor averaging, inexact).
pub fn method(name: &str, rank: usize) -> Result<Method> {
    match name {
        "fedavg" | "factors" => Ok(Method::FactorAverage),
        "exact" | "stack" => Ok(Method::Stack),
        "svd" => Ok(Method::Svd { rank }),
        _ => Err(Error::InvalidArg(format!("method must be 'exact', 'svd' or 'fedavg', got '{name}'"))),
    }
}

/// SHA-256 of the adapter's rank, scale and factor bits, hex: equal digests, equal adapters.
pub fn digest(p: &LoraParams) -> String {
    let mut h = Sha256::new();
    h.update((p.rank as u64).to_le_bytes());
    h.update(p.scale.to_bits().to_le_bytes());
    p.w.iter().for_each(|v| h.update(v.to_bits().to_le_bytes()));
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grad::{Rng, Slot};
    use ruvllm_core::nn::Proj;
    use ruvllm_daf::aggregate::{aggregate, dense_mean, DenseTarget};

    fn params(rank: usize, seed: u64) -> LoraParams {
        let mut slots = Vec::new();
        let mut off = 0;
        for (layer, proj, d_in, d_out) in [(0, Proj::Q, 12, 16), (1, Proj::Down, 20, 12), (1, Proj::Up, 12, 20)] {
            slots.push(Slot { layer, proj, d_in, d_out, a: off, b: off + rank * d_in });
            off += rank * (d_in + d_out);
        }
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let w = (0..off).map(|_| rng.uniform()).collect();
        LoraParams::from_parts(2, rank, 2.0, slots, w)
    }

    fn prov(samples: u64) -> Provenance {
        Provenance { samples, quality: 0.8, improvement: 0.0 }
    }

    /// The dense `ΔW` `p` applies on each slot, in slot order.
    fn dense(p: &LoraParams) -> Vec<Vec<f64>> {
        to_update(p, Tier::Group, 1, prov(1)).expect("update").targets.iter().map(|t| t.delta(p.scale as f64)).collect()
    }

    fn max_diff(x: &[f64], y: &[f64]) -> f64 {
        x.iter().zip(y).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max)
    }

    fn find<'a>(want: &'a [DenseTarget], s: &Slot) -> &'a DenseTarget {
        want.iter().find(|d| d.layer == s.layer as u32 && d.proj == s.proj.gguf_name()).expect("target")
    }

    #[test]
    fn an_adapter_round_trips_exactly_through_an_update() {
        let p = params(4, 1);
        let u = to_update(&p, Tier::Group, 3, prov(5)).expect("update");
        assert_eq!(u.targets.len(), 3);
        assert_eq!(u.targets[1].name(), "blk.1.ffn_down");
        assert_eq!((u.targets[0].d_in, u.targets[0].d_out, u.targets[0].rank), (12, 16, 4));
        // One client's stacked aggregate as the first global adapter: the same ΔW.
        let agg = aggregate(&[&u], &[3.0], Method::Stack).expect("aggregates");
        let (g, err) = accumulate(None, &params(4, 2), &agg, 64).expect("accumulates");
        assert_eq!(err, 0.0);
        for (x, y) in dense(&g).iter().zip(dense(&p)) {
            assert!(max_diff(x, &y) < 1e-5);
        }
    }

    #[test]
    fn the_global_adapter_holds_the_exact_mean_of_every_round() {
        // Round 1: three rank-2 clients, stacked (exact), become the global adapter G₁.
        let us: Vec<Update> = (0..3).map(|i| to_update(&params(2, 10 + i), Tier::Group, 1, prov(1 + i)).expect("update")).collect();
        let refs: Vec<&Update> = us.iter().collect();
        let w = [1.0, 2.0, 3.0];
        let agg = aggregate(&refs, &w, method("exact", 2).expect("method")).expect("aggregates");
        let template = params(2, 1);
        let (g1, err) = accumulate(None, &template, &agg, 64).expect("accumulates");
        assert_eq!(err, 0.0);
        assert_eq!(g1.rank, 6);
        let want = dense_mean(&refs, &w).expect("dense");
        for (s, got) in g1.slots.iter().zip(dense(&g1)) {
            assert!(max_diff(&find(&want, s).values, &got) < 1e-5, "blk.{}.{:?}", s.layer, s.proj);
        }
        // Round 2: the clients' changes L_i on top of G₁. Every client's adapter is G₁ + L_i, so
        // the exact mean is G₁ + Σ wᵢLᵢ; the new global adapter equals it.
        let ls: Vec<Update> = (0..3).map(|i| to_update(&params(2, 20 + i), Tier::Group, 2, prov(1)).expect("update")).collect();
        let lrefs: Vec<&Update> = ls.iter().collect();
        let agg2 = aggregate(&lrefs, &[1.0, 1.0, 2.0], Method::Stack).expect("aggregates");
        let (g2, err2) = accumulate(Some(&g1), &template, &agg2, 64).expect("accumulates");
        assert_eq!(err2, 0.0);
        let delta = dense_mean(&lrefs, &[1.0, 1.0, 2.0]).expect("dense");
        for ((s, got), before) in g2.slots.iter().zip(dense(&g2)).zip(dense(&g1)) {
            let exact: Vec<f64> = before.iter().zip(&find(&delta, s).values).map(|(a, b)| a + b).collect();
            assert!(max_diff(&exact, &got) < 1e-5, "blk.{}.{:?}", s.layer, s.proj);
        }
        // Equal inputs, equal outputs (every node computes its own).
        let (again, _) = accumulate(Some(&g1), &template, &agg2, 64).expect("accumulates");
        assert_eq!(digest(&again), digest(&g2));
        // A cap below the sum's rank: the best approximation, its error reported and true.
        let (capped, err3) = accumulate(Some(&g1), &template, &agg2, 4).expect("accumulates");
        assert_eq!(capped.rank, 4);
        assert!(err3 > 0.0 && err3 < 1.0, "{err3}");
        let mut worst = 0.0f64;
        for (s, (got, full)) in capped.slots.iter().zip(dense(&capped).iter().zip(dense(&g2))) {
            let num: f64 = got.iter().zip(&full).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
            let den: f64 = full.iter().map(|a| a * a).sum::<f64>().sqrt();
            worst = worst.max(num / den);
            let _ = s;
        }
        assert!((worst - err3).abs() < 1e-4, "measured {worst}, reported {err3}");
    }

    #[test]
    fn methods_and_foreign_aggregates() {
        assert_eq!(method("exact", 8).expect("m"), Method::Stack);
        assert_eq!(method("svd", 8).expect("m"), Method::Svd { rank: 8 });
        assert_eq!(method("fedavg", 8).expect("m"), Method::FactorAverage);
        assert!(method("mean", 8).is_err());
        let u = to_update(&params(2, 3), Tier::Group, 1, prov(1)).expect("update");
        let mut agg = aggregate(&[&u], &[1.0], Method::Stack).expect("aggregates");
        agg.adapter = "talora".into();
        assert!(accumulate(None, &params(2, 1), &agg, 8).is_err());
    }
}
