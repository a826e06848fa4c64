//! The learned BaseLoRA as a federation adapter: its factors become a `ruvllm_daf::Update`
//! (one target per slot, the projection by its GGUF name), and a round's aggregate goes back
//! into the same flat layout. The learner's methods that use these are in `learner.rs`
//! (`federated_update`, `apply_federated`); the transport is `ruvllm_daf::Node`.
//!
//! The aggregate is written so that the local adapter applies exactly the aggregate's `ΔW`
//! (`flat::into_flat` divides `B` by the local scale). Aggregates must therefore come at the
//! local rank or below: factor averaging of equal-rank adapters, or the exact weighted mean
//! re-factorised by truncated SVD to the local rank ([`method`]).

use ruvllm_daf::aggregate::{Aggregate, Method};
use ruvllm_daf::flat::{from_flat, into_flat, FlatSlot};
use ruvllm_daf::update::{Tier, Update};
use ruvllm_daf::validate::AdapterSpec;
use sha2::{Digest, Sha256};

use crate::grad::LoraParams;
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

/// Replaces `p`'s factors by `agg`'s (same `ΔW` per slot; slots the aggregate lacks become
/// zero). `p` is left unchanged when the aggregate does not fit.
pub fn apply(p: &mut LoraParams, agg: &Aggregate) -> Result<()> {
    if agg.adapter != ADAPTER_ID || agg.bucket.is_some() {
        return Err(Error::InvalidArg(format!("aggregate of adapter '{}' is not SONA's BaseLoRA ('{ADAPTER_ID}')", agg.adapter)));
    }
    let mut w = p.w.clone();
    into_flat(agg, p.rank, p.scale, &flat_slots(p), &mut w)?;
    init_gauge(p, &mut w);
    p.w = w;
    Ok(())
}

/// `B·A` is unchanged by `A → g·A`, `B → B/g` per component; the aggregate's own split (the
/// SVD's `√σ` on each side) leaves `A`'s rows far smaller than at initialisation, which slows
/// every later step on `B`. Each component of `w` is rescaled so that `A`'s row has the norm
/// of an initial row (`1/√3`, uniform in `±1/√d_in`): the same `ΔW`, the same factors on
/// every node, and learning after a round moves as it did from the start.
fn init_gauge(p: &LoraParams, w: &mut [f32]) {
    let target = 1.0 / 3f64.sqrt();
    for s in &p.slots {
        for j in 0..p.rank {
            let row = s.a + j * s.d_in..s.a + (j + 1) * s.d_in;
            let norm = w[row.clone()].iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
            if !(norm > 0.0 && norm.is_finite()) {
                continue;
            }
            let g = target / norm;
            w[row].iter_mut().for_each(|x| *x = (*x as f64 * g) as f32);
            for o in 0..s.d_out {
                let i = s.b + o * p.rank + j;
                w[i] = (w[i] as f64 / g) as f32;
            }
        }
    }
}

/// The aggregation that fits an adapter of rank `rank`: `fedavg` (factor averaging, inexact),
/// `svd` or `exact` (the exact weighted mean of the clients' `ΔW`, re-factorised to `rank` by
/// truncated SVD; the truncation error is reported with the aggregate).
pub fn method(name: &str, rank: usize) -> Result<Method> {
    match name {
        "fedavg" | "factors" => Ok(Method::FactorAverage),
        "svd" | "exact" => Ok(Method::Svd { rank }),
        _ => Err(Error::InvalidArg(format!("method must be 'fedavg', 'exact' or 'svd', got '{name}' (stacking exceeds the adapter's rank)"))),
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
    use ruvllm_daf::aggregate::{aggregate, dense_mean};

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

    #[test]
    fn an_adapter_round_trips_exactly_through_an_update() {
        let p = params(4, 1);
        let u = to_update(&p, Tier::Group, 3, prov(5)).expect("update");
        assert_eq!(u.targets.len(), 3);
        assert_eq!(u.targets[1].name(), "blk.1.ffn_down");
        assert_eq!((u.targets[0].d_in, u.targets[0].d_out, u.targets[0].rank), (12, 16, 4));
        // The update's own factors as an aggregate at the local scale: bit-identical factors.
        let agg = Aggregate {
            adapter: ADAPTER_ID.into(),
            bucket: None,
            method: Method::Stack,
            scale: u.scale,
            targets: u.targets.clone(),
            contributors: vec![[0; 32]],
            weights: vec![1.0],
            truncation_error: vec![0.0; 3],
        };
        let mut q = params(4, 2);
        assert_ne!(digest(&p), digest(&q));
        apply(&mut q, &agg).expect("fits");
        assert_same_delta(&q, &p);
        // Applied on another node (other local factors): the same factors, bit for bit.
        let mut q2 = params(4, 9);
        apply(&mut q2, &agg).expect("fits");
        assert_eq!(digest(&q2), digest(&q));
        // A factor average of one adapter is the adapter (weights normalise to 1).
        let one = aggregate(&[&u], &[3.0], Method::FactorAverage).expect("aggregates");
        let mut r = params(4, 3);
        apply(&mut r, &one).expect("fits");
        assert_same_delta(&r, &p);
        // A's rows have the initial norm.
        for s in &r.slots {
            let n: f32 = r.w[s.a..s.a + s.d_in].iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((n - 1.0 / 3f32.sqrt()).abs() < 1e-5, "row norm {n}");
        }
    }

    fn assert_same_delta(got: &LoraParams, want: &LoraParams) {
        let (g, w) = (to_update(got, Tier::Group, 1, prov(1)).expect("update"), to_update(want, Tier::Group, 1, prov(1)).expect("update"));
        for (x, y) in g.targets.iter().zip(&w.targets) {
            let (dx, dy) = (x.delta(got.scale as f64), y.delta(want.scale as f64));
            let err = dx.iter().zip(&dy).map(|(a, b)| (a - b).abs()).fold(0.0f64, f64::max);
            let max = dy.iter().map(|a| a.abs()).fold(0.0f64, f64::max);
            assert!(err <= 1e-5 * max, "{}: {err} of {max}", x.name());
        }
    }

    #[test]
    fn the_exact_mean_of_adapters_goes_back_into_the_local_rank() {
        // Two rank-2 clients into a rank-4 adapter: the SVD keeps the exact weighted mean.
        let a = to_update(&params(2, 4), Tier::Group, 1, prov(1)).expect("update");
        let b = to_update(&params(2, 5), Tier::Group, 1, prov(3)).expect("update");
        let w = [1.0, 3.0];
        let agg = aggregate(&[&a, &b], &w, method("exact", 4).expect("method")).expect("aggregates");
        let want = dense_mean(&[&a, &b], &w).expect("dense");
        let mut local = params(4, 6);
        apply(&mut local, &agg).expect("fits");
        let back = to_update(&local, Tier::Group, 2, prov(1)).expect("update");
        for d in &want {
            let f = back.targets.iter().find(|f| f.layer == d.layer && f.proj == d.proj).expect("slot");
            let got = f.delta(local.scale as f64);
            let err = d.values.iter().zip(&got).map(|(x, y)| (x - y).abs()).fold(0.0f64, f64::max);
            assert!(err < 1e-5, "blk.{}.{}: {err}", d.layer, d.proj);
        }
        // Factor averaging of equal ranks fits; an aggregate of another adapter does not apply.
        assert!(apply(&mut params(2, 7), &aggregate(&[&a, &b], &w, method("fedavg", 2).expect("m")).expect("agg")).is_ok());
        let mut other = agg.clone();
        other.adapter = "talora".into();
        let before = local.w.clone();
        assert!(apply(&mut local, &other).is_err());
        assert_eq!(local.w, before);
        // A rank above the local one is refused, the adapter untouched.
        let wide = aggregate(&[&a, &b], &w, Method::Stack).expect("aggregates");
        let mut small = params(2, 8);
        let before = small.w.clone();
        assert!(apply(&mut small, &wide).is_err());
        assert_eq!(small.w, before);
        assert!(method("stack", 4).is_err());
    }
}
