//! The learned BaseLoRA as a federation adapter. A federating node's adapters are two:
//!
//! - the **global adapter** `G`, the same on every node after a round: the weaker components of
//!   what the federation has learned so far, frozen locally (served, and applied under
//!   training as part of the model);
//! - the **BaseLoRA** `L`, trained on this node's feedback on top of `G`; after a round, the
//!   federation's strongest components.
//!
//! A round publishes `L` (one `ruvllm_daf::Update` target per slot, the projection by its GGUF
//! name). The nodes' adapters are `G + Lᵢ` with the same `G`, so the exact weighted mean of
//! their `ΔW` (weights summing to 1) is `G + Σ wᵢLᵢ`: the round's aggregate of the `Lᵢ` (FLoRA
//! stacking, exact) is added to `G` ([`accumulate`]), the sum re-factorised by SVD (truncated
//! only past a rank cap, the error reported), and split again: its strongest components
//! become every node's new `L`, so learning goes on in the directions the federation found
//! (with both factors non-zero), the rest the new `G`. The learner's methods that use these
//! are in `learner.rs` (`federated_update`, `apply_federated`); the transport is
//! `ruvllm_daf::Node`.

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
    adapter_spec_as(p, ADAPTER_ID, None, tier)
}

/// [`adapter_spec`] for adapter `id` with `buckets` timestep buckets (TALoRA).
pub fn adapter_spec_as(p: &LoraParams, id: &str, buckets: Option<u16>, tier: Tier) -> AdapterSpec {
    let targets: Vec<(u32, &str, usize, usize)> = p.slots.iter().map(|s| (s.layer as u32, s.proj.gguf_name(), s.d_in, s.d_out)).collect();
    AdapterSpec::new(id, tier, buckets, &targets)
}

/// What the federation glue needs of a learner: its adapters' specs, this round's updates,
/// and applying a round's aggregates. SONA's [`crate::Learner`] federates one adapter, the
/// TALoRA learner ([`crate::talora::TaLearner`]) one per timestep bucket.
pub trait FederatedLearner: Send + Sync {
    /// The specs of the adapters it federates at `tier` and their trained rank; refused without
    /// consent.
    fn fed_specs(&self, tier: Tier) -> Result<(Vec<AdapterSpec>, usize)>;
    /// Its unsigned updates for `round`.
    fn fed_updates(&self, tier: Tier, round: u64) -> Result<Vec<Update>>;
    /// Applies the aggregates of its adapters among `aggs` (see [`accumulate`]); `None` when
    /// none is there. Returns the adapters' digest and the largest truncation error.
    fn fed_apply(&self, aggs: &[Aggregate], cap: usize, server_lr: f64) -> Result<Option<(String, f64)>>;
    /// The digest of what it serves (nodes that applied the same rounds agree).
    fn fed_digest(&self) -> String;
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
    to_update_as(p, (ADAPTER_ID, None), tier, round, prov)
}

/// [`to_update`] for adapter `id`'s timestep bucket `bucket` (TALoRA).
pub fn to_update_as(p: &LoraParams, (id, bucket): (&str, Option<u16>), tier: Tier, round: u64, prov: Provenance) -> Result<Update> {
    let targets = from_flat(p.rank, &flat_slots(p), &p.w)?;
    Ok(Update {
        adapter: id.into(),
        bucket,
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

/// A node's adapters after a round: the sum `frozen + agg` (the aggregate of the nodes'
/// BaseLoRAs, every one trained on top of the same frozen part) re-factorised by truncated SVD
/// ([`ruvllm_daf::aggregate::accumulate`]) to at most `cap` components per projection, then
/// split: the `local.rank` strongest components of each projection become the new BaseLoRA
/// (in `local`'s layout and scale; each `A` row at its initial norm, see [`init_gauge`]; spare
/// components start as at initialisation), the rest the new frozen part (scale 1; `None` when
/// nothing is left). Their sum is the whole re-factorised mean. Returns them with the cap's
/// largest relative truncation error (0 while the sum's rank fits `cap`).
///
/// `server` = (`start`, `η`) with `η ≠ 1` is a server learning rate (FedAvgM/FedOpt without
/// momentum, Reddi et al. 2021): the adapters move from where the round started, `frozen +
/// start` (`start` the BaseLoRA as the last round left it; `None` before the first round, whose
/// BaseLoRA starts at `ΔW = 0`), by `η` times the step to the exact mean:
/// `frozen + start + η·(Σ wᵢLᵢ − start)`. `η = 1` is the exact mean.
pub fn accumulate(
    frozen: Option<&LoraParams>,
    local: &LoraParams,
    agg: &Aggregate,
    cap: usize,
    seed: u64,
    server: (Option<&LoraParams>, f64),
) -> Result<(LoraParams, Option<LoraParams>, f64)> {
    if agg.adapter != ADAPTER_ID || agg.bucket.is_some() {
        return Err(Error::InvalidArg(format!("aggregate of adapter '{}' is not SONA's BaseLoRA ('{ADAPTER_ID}')", agg.adapter)));
    }
    accumulate_any(frozen, local, agg, cap, seed, server)
}

/// [`accumulate`] without checking which adapter (or bucket) the aggregate is of.
pub(crate) fn accumulate_any(
    frozen: Option<&LoraParams>,
    local: &LoraParams,
    agg: &Aggregate,
    cap: usize,
    seed: u64,
    server: (Option<&LoraParams>, f64),
) -> Result<(LoraParams, Option<LoraParams>, f64)> {
    let (start, lr) = server;
    if !(lr.is_finite() && lr > 0.0) {
        return Err(Error::InvalidArg(format!("server learning rate must be a finite number > 0, got {lr}")));
    }
    let mut prev = match frozen {
        Some(g) => global_factors(g)?,
        None => Vec::new(),
    };
    let mut step = agg.clone();
    if lr != 1.0 {
        step.scale = (agg.scale as f64 * lr) as f32;
        if let Some(st) = start {
            let c = ((1.0 - lr) * st.scale as f64) as f32;
            for mut t in from_flat(st.rank, &flat_slots(st), &st.w)? {
                t.b.iter_mut().for_each(|x| *x *= c);
                prev.push(t);
            }
        }
    }
    let (targets, errs) = ruvllm_daf::aggregate::accumulate(&prev, &step, cap.max(local.rank))?;
    let err = errs.iter().copied().fold(0.0, f64::max);
    // Components come in descending σ: the first `rank` of each target train, the rest freeze.
    let r = local.rank;
    let (mut top, mut rest) = (Vec::with_capacity(targets.len()), Vec::new());
    for t in targets {
        let k = r.min(t.rank);
        let (d_in, d_out) = (t.d_in, t.d_out);
        let cols = |from: usize, to: usize| -> Vec<f32> { (0..d_out).flat_map(|o| t.b[o * t.rank + from..o * t.rank + to].to_vec()).collect() };
        if t.rank > k {
            rest.push(ruvllm_daf::update::Factors::new(t.layer, &t.proj, t.rank - k, d_in, d_out, t.a[k * d_in..].to_vec(), cols(k, t.rank))?);
        }
        top.push(ruvllm_daf::update::Factors::new(t.layer, &t.proj, k, d_in, d_out, t.a[..k * d_in].to_vec(), cols(0, k))?);
    }
    let mut next = local.clone();
    let whole = Aggregate { targets: top, scale: 1.0, truncation_error: Vec::new(), ..agg.clone() };
    into_flat(&whole, r, local.scale, &flat_slots(local), &mut next.w)?;
    init_gauge(&mut next, seed);
    let frozen = if rest.is_empty() { None } else { Some(global_params(local, rest, agg)?) };
    Ok((next, frozen, err))
}

/// `B·A` is unchanged by `A → g·A`, `B → B/g` per component; the SVD's split (`√σ` on each
/// side) leaves `A`'s rows far smaller than at initialisation, which slows every later step on
/// `B`. Each component is rescaled so that `A`'s row has the norm of an initial row (`1/√3`,
/// uniform in `±1/√d_in`): the same `ΔW`, the same factors on every node, and learning after
/// a round moves as it did from the start. A component the aggregate left empty starts as at
/// initialisation (`A` row drawn from `seed`, `B` column 0), so it can still learn.
fn init_gauge(p: &mut LoraParams, seed: u64) {
    let target = 1.0 / 3f64.sqrt();
    let mut rng = crate::grad::Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let rank = p.rank;
    for s in p.slots.clone() {
        for j in 0..rank {
            let row = s.a + j * s.d_in..s.a + (j + 1) * s.d_in;
            let norm = p.w[row.clone()].iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
            if !(norm > 0.0 && norm.is_finite()) {
                let bound = 1.0 / (s.d_in as f32).sqrt();
                p.w[row].iter_mut().for_each(|x| *x = rng.uniform() * bound);
                (0..s.d_out).for_each(|o| p.w[s.b + o * rank + j] = 0.0);
                continue;
            }
            let g = target / norm;
            p.w[row].iter_mut().for_each(|x| *x = (*x as f64 * g) as f32);
            for o in 0..s.d_out {
                let i = s.b + o * rank + j;
                p.w[i] = (p.w[i] as f64 / g) as f32;
            }
        }
    }
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

    /// The dense `ΔW` of `local` plus `frozen`, in `local`'s slot order.
    fn total(local: &LoraParams, frozen: Option<&LoraParams>) -> Vec<Vec<f64>> {
        let mut d = dense(local);
        if let Some(g) = frozen {
            for (x, y) in d.iter_mut().zip(dense(g)) {
                x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
            }
        }
        d
    }

    #[test]
    fn an_adapter_round_trips_exactly_through_an_update() {
        let p = params(4, 1);
        let u = to_update(&p, Tier::Group, 3, prov(5)).expect("update");
        assert_eq!(u.targets.len(), 3);
        assert_eq!(u.targets[1].name(), "blk.1.ffn_down");
        assert_eq!((u.targets[0].d_in, u.targets[0].d_out, u.targets[0].rank), (12, 16, 4));
        // One client's stacked aggregate: it fits the BaseLoRA, nothing is left to freeze.
        let agg = aggregate(&[&u], &[3.0], Method::Stack).expect("aggregates");
        let (local, frozen, err) = accumulate(None, &params(4, 2), &agg, 64, 7, (None, 1.0)).expect("accumulates");
        assert!(frozen.is_none());
        assert_eq!(err, 0.0);
        for (x, y) in dense(&local).iter().zip(dense(&p)) {
            assert!(max_diff(x, &y) < 1e-5);
        }
        // A's rows have the initial norm.
        for s in &local.slots {
            let n: f32 = local.w[s.a..s.a + s.d_in].iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((n - 1.0 / 3f32.sqrt()).abs() < 1e-5, "row norm {n}");
        }
    }

    #[test]
    fn every_round_keeps_the_exact_mean_split_between_the_baselora_and_the_global_adapter() {
        // Round 1: three rank-2 clients, stacked (exact): rank 6, the strongest 2 components of
        // each projection train from now on, the other 4 freeze.
        let us: Vec<Update> = (0..3).map(|i| to_update(&params(2, 10 + i), Tier::Group, 1, prov(1 + i)).expect("update")).collect();
        let refs: Vec<&Update> = us.iter().collect();
        let w = [1.0, 2.0, 3.0];
        let agg = aggregate(&refs, &w, method("exact", 2).expect("method")).expect("aggregates");
        let template = params(2, 1);
        let (l1, g1, err) = accumulate(None, &template, &agg, 64, 7, (None, 1.0)).expect("accumulates");
        let g1 = g1.expect("a frozen part");
        assert_eq!(err, 0.0);
        assert_eq!((l1.rank, g1.rank), (2, 4));
        let want = dense_mean(&refs, &w).expect("dense");
        for (s, got) in l1.slots.iter().zip(total(&l1, Some(&g1))) {
            assert!(max_diff(&find(&want, s).values, &got) < 1e-5, "blk.{}.{:?}", s.layer, s.proj);
        }
        // Round 2: every client trained its BaseLoRA (starting from l1) on top of g1; each
        // client's adapter is g1 + Lᵢ, and the exact mean (weights summing to 1) is g1 + Σ wᵢLᵢ.
        let ls: Vec<Update> = (0..3).map(|i| to_update(&params(2, 20 + i), Tier::Group, 2, prov(1)).expect("update")).collect();
        let lrefs: Vec<&Update> = ls.iter().collect();
        let w2 = [1.0, 1.0, 2.0];
        let agg2 = aggregate(&lrefs, &w2, Method::Stack).expect("aggregates");
        let (l2, g2, err2) = accumulate(Some(&g1), &template, &agg2, 64, 8, (Some(&l1), 1.0)).expect("accumulates");
        assert_eq!(err2, 0.0);
        let mean = dense_mean(&lrefs, &w2).expect("dense");
        let before = dense(&g1);
        for ((s, got), frozen) in l2.slots.iter().zip(total(&l2, g2.as_ref())).zip(&before) {
            let exact: Vec<f64> = frozen.iter().zip(&find(&mean, s).values).map(|(a, b)| a + b).collect();
            assert!(max_diff(&exact, &got) < 1e-5, "blk.{}.{:?}", s.layer, s.proj);
        }
        // Equal inputs, equal outputs (every node computes its own).
        let (l2b, g2b, _) = accumulate(Some(&g1), &template, &agg2, 64, 8, (Some(&l1), 1.0)).expect("accumulates");
        assert_eq!(digest(&l2b), digest(&l2));
        assert_eq!(g2b.as_ref().map(digest), g2.as_ref().map(digest));
        // A cap below the sum's rank: the best approximation, its error reported and true.
        let full = total(&l2, g2.as_ref());
        let (l3, g3, err3) = accumulate(Some(&g1), &template, &agg2, 4, 8, (Some(&l1), 1.0)).expect("accumulates");
        assert_eq!(g3.as_ref().map(|g| g.rank), Some(2));
        assert!(err3 > 0.0 && err3 < 1.0, "{err3}");
        let mut worst = 0.0f64;
        for (got, full) in total(&l3, g3.as_ref()).iter().zip(&full) {
            let num: f64 = got.iter().zip(full).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
            let den: f64 = full.iter().map(|a| a * a).sum::<f64>().sqrt();
            worst = worst.max(num / den);
        }
        assert!((worst - err3).abs() < 1e-4, "measured {worst}, reported {err3}");
    }

    #[test]
    fn a_server_learning_rate_moves_from_the_round_start_by_eta_times_the_step() {
        let us: Vec<Update> = (0..2).map(|i| to_update(&params(2, 30 + i), Tier::Group, 1, prov(1)).expect("update")).collect();
        let refs: Vec<&Update> = us.iter().collect();
        let template = params(2, 1);
        let (l1, g1, _) = accumulate(None, &template, &aggregate(&refs, &[1.0, 1.0], Method::Stack).expect("agg"), 64, 7, (None, 1.0)).expect("acc");
        let ls: Vec<Update> = (0..2).map(|i| to_update(&params(2, 40 + i), Tier::Group, 2, prov(1)).expect("update")).collect();
        let lrefs: Vec<&Update> = ls.iter().collect();
        let agg = aggregate(&lrefs, &[1.0, 3.0], Method::Stack).expect("agg");
        let mean = dense_mean(&lrefs, &[1.0, 3.0]).expect("dense");
        let (l2, g2, err) = accumulate(g1.as_ref(), &template, &agg, 64, 8, (Some(&l1), 2.5)).expect("acc");
        assert_eq!(err, 0.0);
        for (((s, got), frozen), start) in l2.slots.iter().zip(total(&l2, g2.as_ref())).zip(dense(g1.as_ref().expect("frozen"))).zip(dense(&l1)) {
            let m = &find(&mean, s).values;
            let want: Vec<f64> = (0..got.len()).map(|i| frozen[i] + start[i] + 2.5 * (m[i] - start[i])).collect();
            assert!(max_diff(&want, &got) < 1e-4, "blk.{}.{:?}", s.layer, s.proj);
        }
        assert!(accumulate(None, &template, &agg, 64, 8, (None, 0.0)).is_err());
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
        assert!(accumulate(None, &params(2, 1), &agg, 8, 1, (None, 1.0)).is_err());
    }
}
