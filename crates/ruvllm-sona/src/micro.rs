//! Loop A, instant: a rank-1/2 LoRA on the last block's down projection (MicroLoRA), one Adam
//! step per feedback.
//!
//! Why there, and why a truncated vocabulary: the step must cost under a millisecond. The
//! last block's FFN output is the closest trainable point to the logits: its gradient needs no
//! backward pass through attention or any other block, only through the post-FFN norm, the
//! output norm and the LM head. The LM head is the expensive part (262,144 rows for Gemma 3):
//! the step takes the softmax over a candidate set instead: the target plus the top `k` tokens
//! the model gave that position when the trajectory was captured (sampled softmax; the
//! captured top-k mass is reported, typically most of the probability). The capture (one
//! forward pass of the trajectory with the current learned adapters) happens first on the same
//! thread and is reported separately; the update itself is the step.

use std::time::Instant;

use ruvllm_core::backend::cpu::ops::dot;
use ruvllm_core::nn::Proj;

use crate::adam::Adam;
use crate::grad::{rms_norm, rms_norm_back, Frozen, LoraParams};

/// One target position of a captured trajectory.
pub struct CapturedRow {
    act: Vec<f32>,
    down: Vec<f32>,
    x_mid: Vec<f32>,
    /// Candidate LM-head rows (`k × d`), the target's first.
    cand: Vec<f32>,
    weight: f32,
}

/// What the step needs of a trajectory, from one forward pass.
pub struct Capture {
    pub rows: Vec<CapturedRow>,
    /// Mean softmax mass of the candidate set (how much of the distribution the step sees).
    pub covered_mass: f64,
    pub ms: f64,
}

/// Captures `tokens` under `base` (the current BaseLoRA, if any) for targets `(i, weight)`:
/// the last block's activations and `k` candidates per target.
pub fn capture(fr: &Frozen, tokens: &[u32], targets: &[(usize, f32)], base: Option<&LoraParams>, k: usize) -> Capture {
    let start = Instant::now();
    let m = &fr.model;
    let (d, ff, last) = (m.cfg.d_model, m.cfg.ff_dim, m.cfg.n_layer - 1);
    let (x, acts) = fr.forward(tokens, base.map(|p| (p, p.w.as_slice())), last);
    let a = acts[last].as_ref().expect("kept the last block");
    let mut rows = Vec::with_capacity(targets.len());
    let mut mass = 0.0;
    let v = m.cfg.vocab_size;
    for chunk in targets.chunks(16) {
        let at: Vec<usize> = chunk.iter().map(|&(i, _)| i).collect();
        let (mut logits, _) = fr.head(&x, &at);
        for (j, &(i, weight)) in chunk.iter().enumerate() {
            let z = &mut logits[j * v..(j + 1) * v];
            crate::grad::softmax(z);
            let target = tokens[i + 1] as usize;
            let mut ids: Vec<usize> = top_k(z, k + 1).into_iter().filter(|&c| c != target).take(k).collect();
            ids.insert(0, target);
            mass += ids.iter().map(|&c| z[c] as f64).sum::<f64>();
            let mut cand = vec![0.0f32; ids.len() * d];
            for (r, &c) in ids.iter().enumerate() {
                m.output.dequantize_row(c, &mut cand[r * d..(r + 1) * d]);
            }
            rows.push(CapturedRow {
                act: a.act[i * ff..(i + 1) * ff].to_vec(),
                down: a.down[i * d..(i + 1) * d].to_vec(),
                x_mid: a.x_mid[i * d..(i + 1) * d].to_vec(),
                cand,
                weight,
            });
        }
    }
    let covered_mass = if rows.is_empty() { 0.0 } else { mass / rows.len() as f64 };
    Capture { rows, covered_mass, ms: start.elapsed().as_secs_f64() * 1e3 }
}

fn top_k(z: &[f32], k: usize) -> Vec<usize> {
    let mut best: Vec<(f32, usize)> = Vec::with_capacity(k + 1);
    for (i, &p) in z.iter().enumerate() {
        if best.len() < k || p > best[best.len() - 1].0 {
            let at = best.partition_point(|&(q, _)| q >= p);
            best.insert(at, (p, i));
            best.truncate(k);
        }
    }
    best.into_iter().map(|(_, i)| i).collect()
}

/// The MicroLoRA targets: the last block's down projection.
pub fn targets(n_layer: usize) -> Vec<(usize, Proj)> {
    vec![(n_layer - 1, Proj::Down)]
}

/// An EWC penalty `λ · F̂ ∘ (θ − θ*)` added to a gradient (`F̂` the Fisher diagonal scaled to
/// mean 1, `θ*` the anchor).
pub struct Penalty<'a> {
    pub lambda: f32,
    pub fisher: &'a [f32],
    pub anchor: &'a [f32],
}

impl Penalty<'_> {
    /// Adds the penalty's gradient at `w` into `grad`.
    pub fn add(&self, w: &[f32], grad: &mut [f32]) {
        let mean = self.fisher.iter().map(|&x| x as f64).sum::<f64>() / self.fisher.len().max(1) as f64;
        if mean.is_nan() || mean <= 0.0 || self.lambda == 0.0 {
            return;
        }
        let k = self.lambda / mean as f32;
        for i in 0..grad.len() {
            grad[i] += k * self.fisher[i] * (w[i] - self.anchor[i]);
        }
    }
}

/// One Adam step of the sampled-softmax loss on `cap` (plus `penalty`); returns (mean loss
/// before the step, milliseconds the step took).
pub fn step(fr: &Frozen, micro: &mut LoraParams, adam: &mut Adam, cap: &Capture, penalty: Option<&Penalty>) -> (f64, f64) {
    let start = Instant::now();
    let mut grad = vec![0.0f32; micro.len()];
    let (loss, wsum) = loss_and_grad(fr, micro, cap, &mut grad);
    if wsum > 0.0 {
        let inv = (1.0 / wsum) as f32;
        grad.iter_mut().for_each(|g| *g *= inv);
        if let Some(p) = penalty {
            p.add(&micro.w, &mut grad);
        }
        adam.step(&mut micro.w, &grad, 1.0);
    }
    let mean = if wsum > 0.0 { loss / wsum } else { 0.0 };
    (mean, start.elapsed().as_secs_f64() * 1e3)
}

/// The weighted sampled-softmax loss of `cap` under `micro` and its gradient (added into
/// `grad`): returns (Σ weight·nll, Σ weight).
pub fn loss_and_grad(fr: &Frozen, micro: &LoraParams, cap: &Capture, grad: &mut [f32]) -> (f64, f64) {
    let m = &fr.model;
    let c = &m.cfg;
    let (d, r) = (c.d_model, micro.rank);
    let s = micro.slots[0].clone();
    let ff = s.d_in;
    let layer = &m.layers[s.layer];
    let (mut loss, mut wsum) = (0.0f64, 0.0f64);
    let mut u = vec![0.0f32; r];
    let (mut down, mut y, mut xf, mut h) = (vec![0.0f32; d], vec![0.0f32; d], vec![0.0f32; d], vec![0.0f32; d]);
    let (mut dh, mut dxf, mut dd) = (vec![0.0f32; d], vec![0.0f32; d], vec![0.0f32; d]);
    let (a, b) = micro.factors(&s, &micro.w);
    for row in &cap.rows {
        for j in 0..r {
            u[j] = dot(&a[j * ff..(j + 1) * ff], &row.act);
        }
        for o in 0..d {
            down[o] = row.down[o] + micro.scale * (0..r).map(|j| b[o * r + j] * u[j]).sum::<f32>();
        }
        match &layer.post_ffn_norm {
            Some(w) => rms_norm(&down, w, c.norm_eps, &mut y),
            None => y.copy_from_slice(&down),
        }
        for o in 0..d {
            xf[o] = row.x_mid[o] + y[o];
        }
        rms_norm(&xf, &m.output_norm, c.norm_eps, &mut h);
        let k = row.cand.len() / d;
        let mut z: Vec<f32> = (0..k).map(|ci| dot(&row.cand[ci * d..(ci + 1) * d], &h)).collect();
        let raw = z.clone();
        if let Some(cap) = c.final_logit_softcap {
            z.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
        }
        loss += row.weight as f64 * crate::grad::nll(&z, 0);
        wsum += row.weight as f64;
        crate::grad::softmax(&mut z);
        z[0] -= 1.0;
        dh.iter_mut().for_each(|v| *v = 0.0);
        for ci in 0..k {
            let mut dz = z[ci] * row.weight;
            if let Some(cap) = c.final_logit_softcap {
                let t = (raw[ci] / cap).tanh();
                dz *= 1.0 - t * t;
            }
            for (o, &e) in dh.iter_mut().zip(&row.cand[ci * d..(ci + 1) * d]) {
                *o += dz * e;
            }
        }
        dxf.iter_mut().for_each(|v| *v = 0.0);
        rms_norm_back(&xf, &m.output_norm, c.norm_eps, &dh, &mut dxf);
        dd.iter_mut().for_each(|v| *v = 0.0);
        match &layer.post_ffn_norm {
            Some(w) => rms_norm_back(&down, w, c.norm_eps, &dxf, &mut dd),
            None => dd.copy_from_slice(&dxf),
        }
        for j in 0..r {
            let mut g = 0.0f32;
            for o in 0..d {
                g += dd[o] * b[o * r + j];
                grad[s.b + o * r + j] += micro.scale * dd[o] * u[j];
            }
            let ga = &mut grad[s.a + j * ff..s.a + (j + 1) * ff];
            for (gv, &xv) in ga.iter_mut().zip(&row.act) {
                *gv += micro.scale * g * xv;
            }
        }
    }
    (loss, wsum)
}
