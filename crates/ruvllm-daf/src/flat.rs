//! Factors to and from a flat parameter vector laid out as SONA's `LoraParams` keeps them: all
//! factors in one `Vec<f32>`, each slot's `A` (`rank × d_in`) at one offset and `B`
//! (`d_out × rank`) at another, one rank and one scale for all slots. The binding maps SONA's
//! `Slot`s to [`FlatSlot`]s (the projection by its GGUF name), so this crate needs no model
//! types.

use crate::aggregate::Aggregate;
use crate::update::Factors;
use crate::{Error, Result};

/// Where one projection's factors sit in the flat vector.
#[derive(Debug, Clone, PartialEq)]
pub struct FlatSlot {
    pub layer: u32,
    /// GGUF name of the projection (`ffn_down`, `attn_q`, ...).
    pub proj: String,
    pub d_in: usize,
    pub d_out: usize,
    /// Offset of `A`.
    pub a: usize,
    /// Offset of `B`.
    pub b: usize,
}

fn range(s: &FlatSlot, at: usize, len: usize, w_len: usize) -> Result<std::ops::Range<usize>> {
    match at.checked_add(len) {
        Some(end) if end <= w_len => Ok(at..end),
        _ => Err(Error::Shape { target: format!("blk.{}.{}", s.layer, s.proj), msg: format!("{len} values at offset {at} run past the {w_len} parameters") }),
    }
}

/// The factors of every slot of `w`.
pub fn from_flat(rank: usize, slots: &[FlatSlot], w: &[f32]) -> Result<Vec<Factors>> {
    slots
        .iter()
        .map(|s| {
            let a = w[range(s, s.a, rank * s.d_in, w.len())?].to_vec();
            let b = w[range(s, s.b, s.d_out * rank, w.len())?].to_vec();
            Factors::new(s.layer, &s.proj, rank, s.d_in, s.d_out, a, b)
        })
        .collect()
}

/// Writes `agg` into `w` (same layout, `rank`), for an adapter that applies
/// `local_scale · B·A`: each `B` is divided by `local_scale`, so `w` then applies exactly the
/// aggregate's `ΔW`. A target of lower rank is padded with zero components; a slot the
/// aggregate lacks is zeroed (the aggregate changes nothing there). Aggregate with
/// [`crate::aggregate::Method::Svd`] at the local rank to get targets that fit.
pub fn into_flat(agg: &Aggregate, rank: usize, local_scale: f32, slots: &[FlatSlot], w: &mut [f32]) -> Result<()> {
    if !(local_scale.is_finite() && local_scale != 0.0) {
        return Err(Error::Config(format!("local scale {local_scale} must be finite and non-zero")));
    }
    for t in &agg.targets {
        if !slots.iter().any(|s| s.layer == t.layer && s.proj == t.proj) {
            return Err(Error::Shape { target: t.name(), msg: "the flat layout has no slot for it".into() });
        }
    }
    let c = agg.scale / local_scale;
    for s in slots {
        let ra = range(s, s.a, rank * s.d_in, w.len())?;
        let rb = range(s, s.b, s.d_out * rank, w.len())?;
        w[ra.clone()].iter_mut().for_each(|x| *x = 0.0);
        w[rb.clone()].iter_mut().for_each(|x| *x = 0.0);
        let Some(t) = agg.targets.iter().find(|t| t.layer == s.layer && t.proj == s.proj) else { continue };
        if t.rank > rank || (t.d_in, t.d_out) != (s.d_in, s.d_out) {
            return Err(Error::Shape {
                target: t.name(),
                msg: format!("rank {} {}×{} does not fit rank {rank} {}×{}", t.rank, t.d_out, t.d_in, s.d_out, s.d_in),
            });
        }
        w[ra.start..ra.start + t.rank * s.d_in].copy_from_slice(&t.a);
        for o in 0..s.d_out {
            for j in 0..t.rank {
                w[rb.start + o * rank + j] = c * t.b[o * t.rank + j];
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{aggregate, Method};
    use crate::update::tests::{key, random_update};

    fn layout(rank: usize) -> (Vec<FlatSlot>, usize) {
        let s1 = FlatSlot { layer: 17, proj: "ffn_down".into(), d_in: 12, d_out: 6, a: 0, b: rank * 12 };
        let off = rank * (12 + 6);
        let s2 = FlatSlot { layer: 3, proj: "attn_q".into(), d_in: 6, d_out: 6, a: off, b: off + rank * 6 };
        (vec![s1, s2], off + rank * 12)
    }

    #[test]
    fn aggregates_go_back_into_the_flat_layout_exactly() {
        let rank = 3;
        let (slots, len) = layout(rank);
        let us: Vec<_> = (1..=3).map(|i| random_update(&key(i), "sona", None, 1, &[(17, "ffn_down", 1, 12, 6), (3, "attn_q", 1, 6, 6)], i as u64)).collect();
        let refs: Vec<_> = us.iter().collect();
        // Three rank-1 clients into rank 3: the SVD keeps everything.
        let agg = aggregate(&refs, &[1.0, 2.0, 3.0], Method::Svd { rank }).expect("aggregates");
        let mut w = vec![7.0f32; len];
        into_flat(&agg, rank, 0.25, &slots, &mut w).expect("fits");
        let back = from_flat(rank, &slots, &w).expect("reads");
        assert_eq!(agg.targets.len(), back.len());
        for t in &agg.targets {
            let f = back.iter().find(|f| f.name() == t.name()).expect("every target has its slot");
            let want = t.delta(agg.scale as f64);
            let got = f.delta(0.25);
            let err = want.iter().zip(&got).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
            assert!(err < 1e-5, "{}: {err}", t.name());
        }
        // A bigger rank than the layout does not fit.
        let wide = aggregate(&refs, &[1.0; 3], Method::Stack).expect("aggregates");
        assert!(into_flat(&wide, 2, 1.0, &layout(2).0, &mut vec![0.0; layout(2).1]).is_err());
        assert!(from_flat(rank, &slots, &w[..len - 1]).is_err(), "a short vector");
        assert!(into_flat(&agg, rank, 0.0, &slots, &mut w).is_err());
    }
}
