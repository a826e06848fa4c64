//! Aggregation of one adapter's (one bucket's) updates into one adapter.
//!
//! Averaging the factors separately (FedAvg of `A` and `B`, as FedIT does) does not give the
//! average update: `mean(Bᵢ)·mean(Aᵢ) ≠ mean(Bᵢ·Aᵢ)`; the cross terms `Bᵢ·Aⱼ` are noise. It is
//! kept here as the baseline ([`Method::FactorAverage`]). The exact methods:
//!
//! - [`Method::Stack`]: FLoRA (Wang et al., "FLoRA: Federated Fine-Tuning Large Language Models
//!   with Heterogeneous Low-Rank Adaptations", 2024) stacks the clients' factors,
//!   `A = [A₁; …; Aₙ]`, `B = [w₁s₁B₁ | … | wₙsₙBₙ]`, so `B·A = Σ wᵢ sᵢ Bᵢ Aᵢ` exactly; the rank
//!   grows to `Σ rᵢ`.
//! - [`Method::Svd`]: the same weighted mean re-factorised to rank `r` by a truncated SVD (the
//!   best rank-`r` approximation, Eckart–Young), computed from the stacked factors without
//!   forming the dense matrix. The relative Frobenius error, `sqrt(Σ_{j≥r} σⱼ²) / sqrt(Σ σⱼ²)`,
//!   is reported per target; it is 0 when `Σ rᵢ ≤ r`.
//!
//! FedEx-LoRA (Singhal et al., "FedEx-LoRA: Exact Aggregation for Federated and Efficient
//! Fine-Tuning of Foundation Models", 2025) keeps the averaged factors and adds the residual
//! `mean(sᵢBᵢAᵢ) − s·B̄·Ā` to the frozen weights; ruvllm's base weights are quantized and shared
//! by every adapter, so the residual is carried by the factors instead (stacking or SVD).

use std::collections::BTreeMap;

use crate::linalg::lowrank_svd;
use crate::update::{Factors, Update};
use crate::{Error, Result};

/// How factors are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Weighted mean of `A`s and of `B`s separately (inexact; ranks must be equal).
    FactorAverage,
    /// FLoRA stacking: exact, rank `Σ rᵢ`.
    Stack,
    /// Exact mean re-factorised to at most `rank` by truncated SVD.
    Svd { rank: usize },
}

impl Method {
    /// `factors` (factor averaging), `stack`, `svd` (rank 8) or `svd:<rank>`.
    pub fn parse(s: &str) -> Result<Method> {
        match s {
            "factors" => Ok(Method::FactorAverage),
            "stack" => Ok(Method::Stack),
            "svd" => Ok(Method::Svd { rank: 8 }),
            _ => match s.strip_prefix("svd:").map(str::parse::<usize>) {
                Some(Ok(rank)) if rank > 0 => Ok(Method::Svd { rank }),
                _ => Err(Error::Config(format!("aggregation '{s}': expected factors, stack, svd or svd:<rank>"))),
            },
        }
    }
}

impl std::fmt::Display for Method {
    /// The name [`Method::parse`] reads back.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Method::FactorAverage => write!(f, "factors"),
            Method::Stack => write!(f, "stack"),
            Method::Svd { rank } => write!(f, "svd:{rank}"),
        }
    }
}

/// One aggregated adapter (one bucket of it).
#[derive(Debug, Clone, PartialEq)]
pub struct Aggregate {
    pub adapter: String,
    pub bucket: Option<u16>,
    pub method: Method,
    /// `ΔW = scale · B·A` per target, as in an update.
    pub scale: f32,
    pub targets: Vec<Factors>,
    /// The contributing nodes, in aggregation order, and their normalised weights.
    pub contributors: Vec<[u8; 32]>,
    pub weights: Vec<f64>,
    /// Per target (same order): the relative Frobenius distance of the aggregate's `ΔW` from
    /// the exact weighted mean of the updates' `ΔW`: the truncation error of [`Method::Svd`],
    /// the cross-term error of [`Method::FactorAverage`], 0 for [`Method::Stack`].
    pub truncation_error: Vec<f64>,
}

impl Aggregate {
    /// The largest relative error from the exact mean over the targets.
    pub fn max_truncation_error(&self) -> f64 {
        self.truncation_error.iter().copied().fold(0.0, f64::max)
    }
}

type TargetKey = (u32, String);

/// One target's dense `ΔW` (`d_out × d_in`, row-major).
#[derive(Debug, Clone, PartialEq)]
pub struct DenseTarget {
    pub layer: u32,
    pub proj: String,
    pub d_out: usize,
    pub d_in: usize,
    pub values: Vec<f64>,
}

/// The weighted mean of the updates' dense `ΔW` per target, in (layer, proj) order: the
/// reference the exact methods must equal.
pub fn dense_mean(updates: &[&Update], weights: &[f64]) -> Result<Vec<DenseTarget>> {
    let w = normalise(weights, updates.len())?;
    let mut out: BTreeMap<TargetKey, (usize, usize, Vec<f64>)> = BTreeMap::new();
    for (u, &wi) in updates.iter().zip(&w) {
        for t in &u.targets {
            let e = out.entry((t.layer, t.proj.clone())).or_insert_with(|| (t.d_out, t.d_in, vec![0.0; t.d_out * t.d_in]));
            if (e.0, e.1) != (t.d_out, t.d_in) {
                return Err(Error::Aggregate(format!("{}: shapes differ between updates", t.name())));
            }
            for (o, d) in e.2.iter_mut().zip(t.delta(wi * u.scale as f64)) {
                *o += d;
            }
        }
    }
    Ok(out.into_iter().map(|((layer, proj), (d_out, d_in, values))| DenseTarget { layer, proj, d_out, d_in, values }).collect())
}

fn normalise(weights: &[f64], n: usize) -> Result<Vec<f64>> {
    if weights.len() != n || n == 0 {
        return Err(Error::Aggregate(format!("{n} updates, {} weights", weights.len())));
    }
    let sum: f64 = weights.iter().sum();
    if !(sum > 0.0 && sum.is_finite()) || weights.iter().any(|&w| w < 0.0) {
        return Err(Error::Aggregate(format!("weights must be non-negative with a positive sum, got {weights:?}")));
    }
    Ok(weights.iter().map(|w| w / sum).collect())
}

/// Aggregates `updates` (one adapter, one bucket) with `weights` (normalised here). A target
/// that an update lacks counts as a zero change from it.
pub fn aggregate(updates: &[&Update], weights: &[f64], method: Method) -> Result<Aggregate> {
    let w = normalise(weights, updates.len())?;
    let first = updates[0];
    if updates.iter().any(|u| u.adapter != first.adapter || u.bucket != first.bucket) {
        return Err(Error::Aggregate("updates of different adapters or buckets".into()));
    }
    let mut by_target: BTreeMap<TargetKey, Vec<(usize, &Factors)>> = BTreeMap::new();
    for (i, u) in updates.iter().enumerate() {
        for t in &u.targets {
            by_target.entry((t.layer, t.proj.clone())).or_default().push((i, t));
        }
    }
    let mut targets = Vec::with_capacity(by_target.len());
    let mut truncation_error = Vec::with_capacity(by_target.len());
    let scale = match method {
        Method::FactorAverage => updates.iter().zip(&w).map(|(u, wi)| wi * u.scale as f64).sum::<f64>() as f32,
        Method::Stack | Method::Svd { .. } => 1.0,
    };
    for ((layer, proj), parts) in by_target {
        let (d_in, d_out) = (parts[0].1.d_in, parts[0].1.d_out);
        if parts.iter().any(|(_, t)| (t.d_in, t.d_out) != (d_in, d_out)) {
            return Err(Error::Aggregate(format!("blk.{layer}.{proj}: shapes differ between updates")));
        }
        let (f, err) = match method {
            Method::FactorAverage => {
                let f = factor_average(layer, &proj, &parts, &w)?;
                let err = factor_average_error(&parts, &w, updates, &f, scale);
                (f, err)
            }
            Method::Stack => (stack(layer, &proj, &parts, &w, updates)?, 0.0),
            Method::Svd { rank } => svd(layer, &proj, &parts, &w, updates, rank)?,
        };
        targets.push(f);
        truncation_error.push(err);
    }
    Ok(Aggregate {
        adapter: first.adapter.clone(),
        bucket: first.bucket,
        method,
        scale,
        targets,
        contributors: updates.iter().map(|u| u.node).collect(),
        weights: w,
        truncation_error,
    })
}

fn factor_average(layer: u32, proj: &str, parts: &[(usize, &Factors)], w: &[f64]) -> Result<Factors> {
    let t0 = parts[0].1;
    if parts.iter().any(|(_, t)| t.rank != t0.rank) {
        return Err(Error::Aggregate(format!("blk.{layer}.{proj}: factor averaging needs equal ranks")));
    }
    let mut a = vec![0.0f64; t0.a.len()];
    let mut b = vec![0.0f64; t0.b.len()];
    for &(i, t) in parts {
        a.iter_mut().zip(&t.a).for_each(|(o, &v)| *o += w[i] * v as f64);
        b.iter_mut().zip(&t.b).for_each(|(o, &v)| *o += w[i] * v as f64);
    }
    let f32s = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect();
    Factors::new(layer, proj, t0.rank, t0.d_in, t0.d_out, f32s(a), f32s(b))
}

/// The exact weighted mean `Σᵢ cᵢ·BᵢAᵢ` (`cᵢ = wᵢsᵢ`) as rank-one terms `Σⱼ pⱼ qⱼᵀ`: the
/// columns `pⱼ` of each `cᵢBᵢ` and the matching rows `qⱼ` of `Aᵢ`, in f64.
fn rank_one_terms(parts: &[(usize, &Factors)], w: &[f64], updates: &[&Update]) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let (mut p_cols, mut q_rows) = (Vec::new(), Vec::new());
    for &(i, t) in parts {
        push_terms(&mut p_cols, &mut q_rows, w[i] * updates[i].scale as f64, t);
    }
    (p_cols, q_rows)
}

/// Appends `c·B·A` of one factor pair as rank-one terms (see [`rank_one_terms`]).
fn push_terms(p_cols: &mut Vec<Vec<f64>>, q_rows: &mut Vec<Vec<f64>>, c: f64, t: &Factors) {
    for j in 0..t.rank {
        p_cols.push((0..t.d_out).map(|o| c * t.b[o * t.rank + j] as f64).collect());
        q_rows.push(t.a[j * t.d_in..(j + 1) * t.d_in].iter().map(|&v| v as f64).collect());
    }
}

/// `‖Σ cᵢBᵢAᵢ − s·B̄Ā‖_F / ‖Σ cᵢBᵢAᵢ‖_F` (`cᵢ = wᵢsᵢ`) from the factors' Gram matrices,
/// without forming a dense matrix: `‖P·Q‖²_F = tr(PᵀP · QQᵀ)`.
fn factor_average_error(parts: &[(usize, &Factors)], w: &[f64], updates: &[&Update], avg: &Factors, scale: f32) -> f64 {
    let (mut p_cols, mut q_rows) = rank_one_terms(parts, w, updates);
    let exact_cols = p_cols.len();
    push_terms(&mut p_cols, &mut q_rows, -(scale as f64), avg);
    let k = p_cols.len();
    let dot = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(a, b)| a * b).sum::<f64>();
    let dot_p = |x: usize, y: usize| dot(&p_cols[x], &p_cols[y]);
    let dot_q = |x: usize, y: usize| dot(&q_rows[x], &q_rows[y]);
    let (mut all, mut exact) = (0.0f64, 0.0f64);
    for x in 0..k {
        for y in x..k {
            let g = dot_p(x, y) * dot_q(x, y) * if x == y { 1.0 } else { 2.0 };
            all += g;
            if y < exact_cols {
                exact += g;
            }
        }
    }
    if exact > 0.0 {
        (all.max(0.0) / exact).sqrt()
    } else {
        0.0
    }
}

fn stack(layer: u32, proj: &str, parts: &[(usize, &Factors)], w: &[f64], updates: &[&Update]) -> Result<Factors> {
    let (d_in, d_out) = (parts[0].1.d_in, parts[0].1.d_out);
    let rank: usize = parts.iter().map(|(_, t)| t.rank).sum();
    let mut a = Vec::with_capacity(rank * d_in);
    let mut b = vec![0.0f32; d_out * rank];
    let mut at = 0;
    for &(i, t) in parts {
        a.extend_from_slice(&t.a);
        let c = w[i] * updates[i].scale as f64;
        for o in 0..d_out {
            for j in 0..t.rank {
                b[o * rank + at + j] = (c * t.b[o * t.rank + j] as f64) as f32;
            }
        }
        at += t.rank;
    }
    Factors::new(layer, proj, rank, d_in, d_out, a, b)
}

fn svd(layer: u32, proj: &str, parts: &[(usize, &Factors)], w: &[f64], updates: &[&Update], rank: usize) -> Result<(Factors, f64)> {
    if rank == 0 {
        return Err(Error::Config("SVD aggregation to rank 0".into()));
    }
    let (d_in, d_out) = (parts[0].1.d_in, parts[0].1.d_out);
    let (p_cols, q_rows) = rank_one_terms(parts, w, updates);
    truncated(layer, proj, d_in, d_out, &p_cols, &q_rows, rank)
}

/// The best rank-`rank` factors of `Σⱼ pⱼqⱼᵀ` (components with σ = 0 dropped) and the relative
/// Frobenius error of the truncation.
fn truncated(layer: u32, proj: &str, d_in: usize, d_out: usize, p_cols: &[Vec<f64>], q_rows: &[Vec<f64>], rank: usize) -> Result<(Factors, f64)> {
    let (u, sigma, v) = lowrank_svd(p_cols, q_rows);
    let nonzero = sigma.iter().take_while(|&&s| s > 0.0).count();
    let keep = rank.min(nonzero);
    let total: f64 = sigma.iter().map(|s| s * s).sum();
    let dropped: f64 = sigma[keep..].iter().map(|s| s * s).sum();
    let err = if total > 0.0 && dropped > 0.0 { (dropped / total).sqrt() } else { 0.0 };
    // Each kept component's magnitude is split evenly between A and B (as SONA balances its
    // factors), so neither is tiny when stored in half precision.
    let mut a = Vec::with_capacity(keep * d_in);
    let mut b = vec![0.0f32; d_out * keep];
    for j in 0..keep {
        let r = sigma[j].sqrt();
        a.extend(v[j].iter().map(|&x| (r * x) as f32));
        for o in 0..d_out {
            b[o * keep + j] = (r * u[j][o]) as f32;
        }
    }
    Ok((Factors::new(layer, proj, keep, d_in, d_out, a, b)?, err))
}

/// Adds a round's aggregate to a running global adapter: `G' = G + agg.scale·B·A` per target
/// (`G`'s factors apply `B·A`, scale 1), re-factorised by truncated SVD to at most `cap`
/// components per target. This is how a node keeps the exact weighted mean of the clients'
/// `ΔW` when each client publishes only its change since the last global adapter (every
/// client's adapter is `G + Lᵢ`, so the mean is `G + Σ wᵢLᵢ`). Returns the new targets (each of
/// its own rank, in (layer, proj) order; targets with no change left out) and, per returned
/// target, the relative Frobenius error the cap cost (0 when the sum's rank fits). Zero
/// components (padding) are ignored, so equal inputs give equal outputs on every node.
pub fn accumulate(global: &[Factors], agg: &Aggregate, cap: usize) -> Result<(Vec<Factors>, Vec<f64>)> {
    if cap == 0 {
        return Err(Error::Config("global adapter of rank 0".into()));
    }
    let mut by_target: BTreeMap<TargetKey, Vec<(f64, &Factors)>> = BTreeMap::new();
    for t in global {
        by_target.entry((t.layer, t.proj.clone())).or_default().push((1.0, t));
    }
    for t in &agg.targets {
        by_target.entry((t.layer, t.proj.clone())).or_default().push((agg.scale as f64, t));
    }
    let (mut out, mut errs) = (Vec::new(), Vec::new());
    for ((layer, proj), parts) in by_target {
        let (d_in, d_out) = (parts[0].1.d_in, parts[0].1.d_out);
        if parts.iter().any(|(_, t)| (t.d_in, t.d_out) != (d_in, d_out)) {
            return Err(Error::Aggregate(format!("blk.{layer}.{proj}: the aggregate's shape differs from the global adapter's")));
        }
        let (mut p_cols, mut q_rows) = (Vec::new(), Vec::new());
        for &(c, t) in &parts {
            push_terms(&mut p_cols, &mut q_rows, c, t);
        }
        let live: Vec<usize> = (0..p_cols.len()).filter(|&j| p_cols[j].iter().any(|&x| x != 0.0) && q_rows[j].iter().any(|&x| x != 0.0)).collect();
        if live.is_empty() {
            continue;
        }
        let p_cols: Vec<Vec<f64>> = live.iter().map(|&j| std::mem::take(&mut p_cols[j])).collect();
        let q_rows: Vec<Vec<f64>> = live.iter().map(|&j| std::mem::take(&mut q_rows[j])).collect();
        let (f, err) = truncated(layer, &proj, d_in, d_out, &p_cols, &q_rows, cap)?;
        if f.rank > 0 {
            out.push(f);
            errs.push(err);
        }
    }
    Ok((out, errs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::update::tests::{key, random_update};

    const T: &[(u32, &str, usize, usize, usize)] = &[(2, "attn_q", 2, 12, 10), (3, "ffn_down", 3, 9, 6)];

    fn clients(n: u8) -> Vec<Update> {
        (0..n)
            .map(|i| {
                let mut u = random_update(&key(i + 1), "m", None, 1, T, i as u64);
                u.scale = 0.25 + 0.1 * i as f32;
                u
            })
            .collect()
    }

    /// `‖aggregate − dense mean‖_F / ‖dense mean‖_F` per target.
    fn rel_errors(agg: &Aggregate, updates: &[&Update], w: &[f64]) -> Vec<f64> {
        let dense = dense_mean(updates, w).expect("dense mean");
        dense
            .iter()
            .zip(&agg.targets)
            .map(|(d, t)| {
                assert_eq!((t.layer, &t.proj), (d.layer, &d.proj));
                let got = t.delta(agg.scale as f64);
                let want = &d.values;
                let num: f64 = want.iter().zip(&got).map(|(a, b)| (a - b) * (a - b)).sum();
                let den: f64 = want.iter().map(|a| a * a).sum();
                (num / den).sqrt()
            })
            .collect()
    }

    #[test]
    fn stacking_equals_the_weighted_mean_of_the_updates() {
        let us = clients(4);
        let refs: Vec<&Update> = us.iter().collect();
        let w = [1.0, 2.0, 3.0, 4.0];
        let agg = aggregate(&refs, &w, Method::Stack).expect("aggregates");
        assert_eq!(agg.targets[0].rank, 8);
        assert_eq!(agg.targets[1].rank, 12);
        for e in rel_errors(&agg, &refs, &w) {
            assert!(e < 1e-6, "stacking error {e}");
        }
    }

    #[test]
    fn factor_averaging_is_not_the_mean_update() {
        let us = clients(4);
        let refs: Vec<&Update> = us.iter().collect();
        let w = [1.0; 4];
        let agg = aggregate(&refs, &w, Method::FactorAverage).expect("aggregates");
        for (e, reported) in rel_errors(&agg, &refs, &w).into_iter().zip(&agg.truncation_error) {
            assert!(e > 0.3, "independent random clients: the cross terms dominate, got {e}");
            assert!((e - reported).abs() < 1e-6 * e.max(1.0), "reported {reported}, dense {e}");
        }
        // Clients that share A: factor averaging is exact (and reports 0).
        let mut same = clients(3);
        let a0: Vec<Vec<f32>> = same[0].targets.iter().map(|t| t.a.clone()).collect();
        same.iter_mut().for_each(|u| u.targets.iter_mut().zip(&a0).for_each(|(t, a)| t.a = a.clone()));
        same.iter_mut().for_each(|u| u.scale = 0.5);
        let refs: Vec<&Update> = same.iter().collect();
        let agg = aggregate(&refs, &[1.0, 2.0, 3.0], Method::FactorAverage).expect("aggregates");
        for (e, reported) in rel_errors(&agg, &refs, &[1.0, 2.0, 3.0]).into_iter().zip(&agg.truncation_error) {
            assert!(e < 1e-6 && *reported < 1e-3, "shared A: dense {e}, reported {reported}");
        }
    }

    #[test]
    fn svd_error_is_the_discarded_singular_values() {
        let us = clients(4);
        let refs: Vec<&Update> = us.iter().collect();
        let w = [4.0, 3.0, 2.0, 1.0];
        // Full rank of the stack: exact.
        let full = aggregate(&refs, &w, Method::Svd { rank: 12 }).expect("aggregates");
        for e in rel_errors(&full, &refs, &w) {
            assert!(e < 1e-6, "untruncated SVD error {e}");
        }
        assert_eq!(full.truncation_error, vec![0.0, 0.0]);
        // Rank 3: the reported error is the measured one, and it is the Eckart–Young optimum,
        // no better than the residual left by the dense matrix's own singular values.
        let cut = aggregate(&refs, &w, Method::Svd { rank: 3 }).expect("aggregates");
        let measured = rel_errors(&cut, &refs, &w);
        for (t, (&reported, &got)) in cut.truncation_error.iter().zip(&measured).enumerate() {
            assert!(reported > 0.01, "target {t}: rank 3 of 8/12 must lose something");
            assert!((reported - got).abs() < 1e-5, "target {t}: reported {reported}, measured {got}");
        }
        let dense = dense_mean(&refs, &w).expect("dense");
        for (t, d) in dense.iter().enumerate() {
            // Singular values of the dense matrix from its own columns (an independent path).
            let (d_out, d_in, m) = (d.d_out, d.d_in, &d.values);
            let cols: Vec<Vec<f64>> = (0..d_in).map(|j| (0..d_out).map(|i| m[i * d_in + j]).collect()).collect();
            let eye: Vec<Vec<f64>> = (0..d_in).map(|j| (0..d_in).map(|i| if i == j { 1.0 } else { 0.0 }).collect()).collect();
            let (_, s, _) = lowrank_svd(&cols, &eye);
            let tail = (s[3..].iter().map(|x| x * x).sum::<f64>() / s.iter().map(|x| x * x).sum::<f64>()).sqrt();
            assert!((tail - cut.truncation_error[t]).abs() < 1e-6, "target {t}: dense tail {tail} vs {}", cut.truncation_error[t]);
        }
    }

    #[test]
    fn a_missing_target_counts_as_no_change() {
        let mut us = clients(2);
        us[1].targets.truncate(1);
        let refs: Vec<&Update> = us.iter().collect();
        let agg = aggregate(&refs, &[1.0, 1.0], Method::Stack).expect("aggregates");
        assert_eq!(agg.targets[1].rank, 3, "only the first client adapts ffn_down");
        for e in rel_errors(&agg, &refs, &[1.0, 1.0]) {
            assert!(e < 1e-6);
        }
    }

    #[test]
    fn methods_parse() {
        assert_eq!(Method::parse("svd:4").expect("parses"), Method::Svd { rank: 4 });
        assert_eq!(Method::parse("stack").expect("parses"), Method::Stack);
        assert!(Method::parse("svd:0").is_err() && Method::parse("mean").is_err());
    }

    #[test]
    fn bad_inputs_are_errors() {
        let us = clients(2);
        let refs: Vec<&Update> = us.iter().collect();
        assert!(aggregate(&refs, &[1.0], Method::Stack).is_err());
        assert!(aggregate(&refs, &[0.0, 0.0], Method::Stack).is_err());
        assert!(aggregate(&refs, &[-1.0, 2.0], Method::Stack).is_err());
        assert!(aggregate(&[], &[], Method::Stack).is_err());
    }
}
