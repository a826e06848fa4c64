//! The backward pass against finite differences of the forward pass, on a tiny synthetic
//! Gemma-3-shaped model with F32 weights (so the products are exact and the check is tight):
//! every feature the real model uses is on (QK-norm, sandwich norms, grouped KV heads, a sliding
//! window shorter than the sequence, soft-capping, GELU gates).

use std::sync::Arc;

use ruvllm_core::backend::{Activation, RopeStyle};
use ruvllm_core::gguf::writer::GgufWriter;
use ruvllm_core::gguf::GgufFile;
use ruvllm_core::models::{RopeFactors, Transformer, TransformerConfig, WeightLoader};
use ruvllm_core::nn::Proj;
use ruvllm_sona::grad::{DiffusionInput, Example, Frozen, LoraParams, Rng};

pub fn tiny_model(dir: &std::path::Path, act: Activation) -> Arc<Transformer> {
    let (n_layer, d, nh, nkv, hd, ff, vocab) = (2usize, 64usize, 2usize, 1usize, 32usize, 96usize, 128usize);
    let cfg = TransformerConfig {
        architecture: "gemma3".into(),
        n_layer,
        d_model: d,
        n_head: nh,
        n_kv_head: nkv,
        head_dim: hd,
        ff_dim: ff,
        vocab_size: vocab,
        norm_eps: 1e-6,
        train_context: 64,
        rope_base: 1e6,
        rope_base_swa: Some(1e4),
        rope_dim: hd,
        rope_style: RopeStyle::Neox,
        rope_linear_factor: 1.0,
        sliding_window: Some(4),
        swa_layers: vec![true, false],
        activation: act,
        qk_norm: true,
        sandwich_norm: true,
        embed_scale: Some((d as f32).sqrt()),
        attn_scale: 1.0 / (hd as f32).sqrt(),
        qkv_bias: false,
        final_logit_softcap: Some(5.0),
        attn_softcap: None,
        rope_factors: RopeFactors::None,
    };
    let mut rng = Rng(7);
    let mut w = GgufWriter::new();
    let mut mat = |w: &mut GgufWriter, name: &str, rows: usize, cols: usize, s: f32| {
        let v: Vec<f32> = (0..rows * cols).map(|_| rng.uniform() * s).collect();
        w.add_f32(name, &[cols as u64, rows as u64], &v);
    };
    mat(&mut w, "token_embd.weight", vocab, d, 0.5);
    for l in 0..n_layer {
        let p = |n: &str| format!("blk.{l}.{n}");
        mat(&mut w, &p("attn_q.weight"), nh * hd, d, 0.2);
        mat(&mut w, &p("attn_k.weight"), nkv * hd, d, 0.2);
        mat(&mut w, &p("attn_v.weight"), nkv * hd, d, 0.2);
        mat(&mut w, &p("attn_output.weight"), d, nh * hd, 0.2);
        mat(&mut w, &p("ffn_gate.weight"), ff, d, 0.2);
        mat(&mut w, &p("ffn_up.weight"), ff, d, 0.2);
        mat(&mut w, &p("ffn_down.weight"), d, ff, 0.2);
    }
    let mut rng2 = Rng(11);
    let mut norm = |w: &mut GgufWriter, name: &str, len: usize| {
        let v: Vec<f32> = (0..len).map(|_| 1.0 + 0.3 * rng2.uniform()).collect();
        w.add_f32(name, &[len as u64], &v);
    };
    for l in 0..n_layer {
        let p = |n: &str| format!("blk.{l}.{n}");
        norm(&mut w, &p("attn_norm.weight"), d);
        norm(&mut w, &p("attn_q_norm.weight"), hd);
        norm(&mut w, &p("attn_k_norm.weight"), hd);
        norm(&mut w, &p("post_attention_norm.weight"), d);
        norm(&mut w, &p("ffn_norm.weight"), d);
        norm(&mut w, &p("post_ffw_norm.weight"), d);
    }
    norm(&mut w, "output_norm.weight", d);
    let path = dir.join("tiny.gguf");
    w.write(&path).unwrap();
    let file = GgufFile::open(&path).unwrap();
    let loader = WeightLoader { file: &file };
    Arc::new(Transformer::load(&loader, cfg, 64).unwrap())
}

/// A rank-2 adapter on every projection with non-zero `B` (seeded).
fn frozen_adapter(model: &Transformer, seed: u64) -> LoraParams {
    let targets: Vec<(usize, Proj)> = (0..2).flat_map(|l| Proj::ALL.map(|p| (l, p))).collect();
    let mut e = LoraParams::new(model, &targets, 2, 2.0, seed);
    let mut rng = Rng(seed + 100);
    for s in e.slots.clone() {
        for v in &mut e.w[s.b..s.b + s.d_out * 2] {
            *v = rng.uniform() * 0.4;
        }
    }
    e
}

fn check(act: Activation, extra: bool, diffusion: bool) {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), act);
    let targets: Vec<(usize, Proj)> = (0..2).flat_map(|l| Proj::ALL.map(|p| (l, p))).collect();
    let mut params = LoraParams::new(&model, &targets, 3, 6.0, 1);
    // B = 0 would make every A-gradient zero: give B values too.
    let mut rng = Rng(3);
    for s in params.slots.clone() {
        for v in &mut params.w[s.b..s.b + s.d_out * 3] {
            *v = rng.uniform() * 0.3;
        }
    }
    let tokens: Vec<u32> = (0..10).map(|i| (i * 37 + 5) % 128).collect();
    let mut ex = Example { tokens: tokens.clone(), targets: (2..9).map(|i| (i, 0.5 + i as f32 * 0.1)).collect(), labels: None };
    let mut frozen = Frozen::new(model.clone(), 1);
    let mut frozen_diffusion = None;
    if diffusion {
        // A masked-diffusion model: positions 3, 5, 6 and 9 masked (token 127, its own
        // embedding row), every position sees every other (within the local layer's window
        // back), the targets before each masked position predict its token (the AR shift).
        let mask_embd: Vec<f32> = (0..64).map(|i| ((i * 13 % 17) as f32 - 8.0) * 0.05).collect();
        let plain = frozen.loss(&ex, None).0;
        frozen_diffusion = Some(DiffusionInput { mask_token: 127, mask_embd: Some(mask_embd) });
        frozen.set_diffusion(frozen_diffusion.clone());
        let mut input = tokens.clone();
        for i in [3, 5, 6, 9] {
            input[i] = 127;
        }
        ex = Example { tokens: input, targets: [2, 4, 5, 8].map(|i| (i, 1.0 / 0.4)).to_vec(), labels: Some(tokens.clone()) };
        // Later positions are seen: changing the last token changes the first target's loss.
        let mut later = ex.clone();
        later.tokens[8] = 1;
        let first = Example { targets: vec![(2, 1.0)], ..ex.clone() };
        let first_later = Example { targets: vec![(2, 1.0)], ..later };
        assert!((frozen.loss(&first, None).0 - frozen.loss(&first_later, None).0).abs() > 1e-4, "attention is not bidirectional");
        assert!((frozen.loss(&ex, None).0 - plain).abs() > 1e-3);
    }
    if extra {
        // The federation's global adapter: frozen, applied in every pass, no gradient.
        let e = Arc::new(frozen_adapter(&model, 9));
        let mut plain = Frozen::new(model.clone(), 1);
        plain.set_diffusion(frozen_diffusion.clone());
        frozen.set_extra(Some(e.clone()));
        // Applied: the loss moves, and equals the plain model's with the adapter as `params`.
        let untrained = LoraParams::new(&model, &targets, 3, 6.0, 1);
        let with_extra = frozen.loss(&ex, Some(&untrained)).0;
        assert!((with_extra - plain.loss(&ex, Some(&e)).0).abs() < 1e-5 * with_extra.abs(), "extra adapter not applied as an adapter");
        assert!((with_extra - plain.loss(&ex, None).0).abs() > 1e-3, "extra adapter changed nothing");
    }
    let mut grad = vec![0.0f32; params.len()];
    let (loss, wsum) = frozen.loss_and_grad(&ex, &params, &mut grad);
    let (loss2, _) = frozen.loss(&ex, Some(&params));
    assert!((loss - loss2).abs() < 1e-4 * loss.abs().max(1.0), "{loss} vs {loss2}");
    assert!(wsum > 0.0);
    let mut checked = 0;
    let mut worst = 0.0f64;
    for (si, s) in params.slots.iter().enumerate() {
        for (k, off) in [s.a + (si * 7) % (3 * s.d_in), s.b + (si * 5) % (3 * s.d_out)].into_iter().enumerate() {
            let eps = 1e-2f32;
            let mut p = params.clone();
            p.w[off] += eps;
            let up = frozen.loss(&ex, Some(&p)).0;
            p.w[off] -= 2.0 * eps;
            let down = frozen.loss(&ex, Some(&p)).0;
            let fd = (up - down) / (2.0 * eps as f64);
            let g = grad[off] as f64;
            // The f32 forward pass rounds the loss by ~1e-6 relative, which the central
            // difference divides by 2·eps: an absolute allowance of 3e-4 on top of 3 %.
            let err = ((fd - g).abs() - 3e-4).max(0.0) / fd.abs().max(g.abs()).max(1e-6);
            worst = worst.max(err);
            assert!(err < 0.03, "slot {si} ({:?} layer {}) {} : backward {g:.6}, finite difference {fd:.6}", s.proj, s.layer, if k == 0 { "A" } else { "B" });
            checked += 1;
        }
    }
    assert_eq!(checked, 28);
    eprintln!("{act:?} (frozen extra adapter: {extra}, diffusion: {diffusion}): worst relative error {worst:.2e}");
}

#[test]
fn gradients_match_finite_differences_gelu() {
    check(Activation::GeluTanh, false, false);
}

#[test]
fn gradients_match_finite_differences_silu() {
    check(Activation::Silu, false, false);
}

/// With the federation's global adapter frozen under the trained one (forward and `dx` paths).
#[test]
fn gradients_match_finite_differences_under_a_frozen_adapter() {
    check(Activation::GeluTanh, true, false);
}

/// A masked-diffusion model (bidirectional attention, the mask embedding, labels apart from the
/// input) under its conversion adapter.
#[test]
fn gradients_match_finite_differences_for_a_diffusion_model() {
    check(Activation::GeluTanh, true, true);
}

/// The MicroLoRA step's gradient equals the full backward pass's when its candidate set is the
/// whole vocabulary.
#[test]
fn micro_gradient_matches_full_backward_with_all_candidates() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), Activation::GeluTanh);
    let mut micro = LoraParams::new(&model, &ruvllm_sona::micro::targets(2), 2, 4.0, 9);
    let mut rng = Rng(5);
    let s = micro.slots[0].clone();
    for v in &mut micro.w[s.b..s.b + s.d_out * 2] {
        *v = rng.uniform() * 0.3;
    }
    let tokens: Vec<u32> = (0..9).map(|i| (i * 53 + 1) % 128).collect();
    let targets: Vec<(usize, f32)> = (3..8).map(|i| (i, 1.0 + i as f32 * 0.2)).collect();
    let mut fr = Frozen::new(model, 1);
    let cap = ruvllm_sona::micro::capture(&fr, &tokens, &targets, None, 127);
    assert!((cap.covered_mass - 1.0).abs() < 1e-4, "all candidates cover all the mass: {}", cap.covered_mass);
    let mut g_micro = vec![0.0f32; micro.len()];
    let (l1, w1) = ruvllm_sona::micro::loss_and_grad(&fr, &micro, &cap, &mut g_micro);
    let mut g_full = vec![0.0f32; micro.len()];
    let (l2, w2) = fr.loss_and_grad(&Example { tokens, targets, labels: None }, &micro, &mut g_full);
    assert!((l1 - l2).abs() < 1e-3 * l2.abs() && (w1 - w2).abs() < 1e-9, "{l1} vs {l2}");
    let norm = g_full.iter().map(|x| x * x).sum::<f32>().sqrt();
    let diff = g_micro.iter().zip(&g_full).map(|(a, b)| (a - b) * (a - b)).sum::<f32>().sqrt();
    assert!(norm > 0.0 && diff / norm < 1e-3, "relative gradient difference {}", diff / norm);
}
