//! The CUDA backend's reference mode against the CPU's scalar reference path, one operation at a
//! time: every `Backend` operation a forward pass makes (norms, the products of each weight type
//! the kernels take, LoRA deltas, QK-norm + RoPE + KV store + attention under each mask, the
//! residual step, gated activations, the embedding, the LM head and its greedy pick) on the same
//! random inputs in both backends, outputs compared bit for bit. Needs a GPU and
//! `RUVLLM_CUDA_EXACT=1 RUVLLM_FORCE_SCALAR=1` (scripts/gpu-check.sh exact sets them).
//!
//! `gpu_exact_ops` prints one line per operation and `EXACT OPS: PASS` or `FAIL` (exit code 1).
//! `gpu_exact_ops --fast` (without `RUVLLM_CUDA_EXACT`) is the comparison's control: the fast
//! kernels against the same scalar path must differ somewhere (exit code 1 if they do not, which
//! would mean the comparison cannot see a difference).
use std::sync::Arc;

use half::f16;
use ruvllm_core::backend::cpu::{quant, CpuBackend, GgmlType};
use ruvllm_core::backend::cuda::CudaBackend;
use ruvllm_core::backend::{
    Activation, AttentionMask, AttnShape, Backend, Buf, BufWidths, DevicePicks, KvType, LayerCache, LowRank, LowRankTerms, Memory, QWeight, QkNorms, RopeStyle,
    RopeTable, Span, WeightData,
};
use ruvllm_eval::bench::Rng;

/// `n` values uniform in (-s, s), one in 64 ten times larger (activations have outliers).
fn values(rng: &mut Rng, n: usize, s: f32) -> Vec<f32> {
    (0..n).map(|i| (rng.unif() * 2.0 - 1.0) * s * if i % 64 == 7 { 10.0 } else { 1.0 }).collect()
}

fn weight(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> QWeight {
    let bytes = quant::quantize(ty, &values(rng, rows * cols, 0.05));
    QWeight::new(ty, rows, cols, WeightData::Owned(Arc::new(bytes))).expect("weight")
}

/// Both backends side by side.
struct Pair {
    cpu: CpuBackend,
    gpu: CudaBackend,
    failed: Vec<String>,
    checks: usize,
}

impl Pair {
    fn both(&mut self, f: impl Fn(&mut dyn Backend)) {
        f(&mut self.cpu);
        f(&mut self.gpu);
    }

    fn write(&mut self, b: Buf, data: &[f32]) {
        self.cpu.write_buf(b, data);
        self.gpu.write_buf(b, data);
    }

    /// Compares buffer `b`'s first `n` rows; true when bit-identical.
    fn check(&mut self, what: &str, b: Buf, n: usize) -> bool {
        let (c, g) = (self.cpu.read_buf(b, n), self.gpu.read_buf(b, n));
        self.report(what, &c, &g)
    }

    fn report(&mut self, what: &str, c: &[f32], g: &[f32]) -> bool {
        if let Err(e) = self.gpu.status() {
            println!("  {what}: GPU error [{}] {e}", e.code());
            self.failed.push(what.to_string());
            return false;
        }
        let differ = c.iter().zip(g).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
        let max = c.iter().zip(g).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        let first = c.iter().zip(g).position(|(x, y)| x.to_bits() != y.to_bits());
        let ok = differ == 0 && c.len() == g.len() && !c.is_empty();
        self.checks += 1;
        println!(
            "  {what}: {} ({} values, {differ} differ, max |d| {max:e}{})",
            if ok { "identical" } else { "DIFFERENT" },
            c.len(),
            first.map(|i| format!(", first at {i}: CPU {} GPU {}", c[i], g[i])).unwrap_or_default()
        );
        if !ok {
            self.failed.push(what.to_string());
        }
        ok
    }
}

fn main() {
    let fast = std::env::args().any(|a| a == "--fast");
    let exact = std::env::var("RUVLLM_CUDA_EXACT").as_deref() == Ok("1");
    if std::env::var("RUVLLM_FORCE_SCALAR").as_deref() != Ok("1") || exact == fast {
        eprintln!(
            "gpu_exact_ops: run with RUVLLM_CUDA_EXACT=1 RUVLLM_FORCE_SCALAR=1 (the reference mode against the scalar CPU path), \
             or with RUVLLM_FORCE_SCALAR=1 and --fast (the control: the fast kernels)"
        );
        std::process::exit(2);
    }
    let gpu = match CudaBackend::new() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("gpu_exact_ops: no usable GPU: [{}] {e}", e.code());
            std::process::exit(2);
        }
    };
    // Gemma 3 270M's shapes, with a small vocabulary.
    let (d, hd, n_head, n_kv, ff, vocab) = (640, 256, 4, 1, 2048, 4096);
    let widths = BufWidths { d_model: d, q_dim: n_head * hd, kv_dim: n_kv * hd, ff_dim: ff, vocab_size: vocab };
    let max_batch = 16;
    let mut p = Pair { cpu: CpuBackend::new(2), gpu, failed: Vec::new(), checks: 0 };
    println!("CPU: {}; GPU: {}", p.cpu.describe(), p.gpu.describe());
    p.both(|b| b.reserve(widths, max_batch));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let eps = 1e-6;
    let norm = |rng: &mut Rng, n: usize| -> Vec<f32> { values(rng, n, 0.5).iter().map(|v| 1.0 + v).collect() };
    let (w_in, w_post, w_next, w_q, w_k, w_out) =
        (norm(&mut rng, d), norm(&mut rng, d), norm(&mut rng, d), norm(&mut rng, hd), norm(&mut rng, hd), norm(&mut rng, d));
    let wq = weight(&mut rng, GgmlType::Q5_0, n_head * hd, d);
    let wk = weight(&mut rng, GgmlType::Q4_0, n_kv * hd, d);
    let wv = weight(&mut rng, GgmlType::Q8_0, n_kv * hd, d);
    let wo = weight(&mut rng, GgmlType::Q4_K, d, n_head * hd);
    let wg = weight(&mut rng, GgmlType::Q5_0, ff, d);
    let wu = weight(&mut rng, GgmlType::F16, ff, d);
    let wd = weight(&mut rng, GgmlType::Q6_K, d, ff);
    let table = weight(&mut rng, GgmlType::Q8_0, vocab, d);
    let wf = weight(&mut rng, GgmlType::F32, n_kv * hd, d);
    for w in [&wq, &wk, &wv, &wo, &wg, &wu, &wd, &table, &wf] {
        p.both(|b| b.prepare_weight(w));
    }
    let rope = RopeTable::new(hd, 10_000.0, 1.0, 256, RopeStyle::Neox);
    let rope_i = RopeTable::new(hd / 2, 1_000_000.0, 1.0, 256, RopeStyle::Interleaved);
    // LoRA factors: rank 8 on Q and V, rank 4 on K.
    let half = |v: Vec<f32>| -> Vec<f16> { v.into_iter().map(f16::from_f32).collect() };
    let (qa, qb) = (half(values(&mut rng, 8 * d, 0.1)), half(values(&mut rng, 8 * n_head * hd, 0.1)));
    let (ka, kb) = (half(values(&mut rng, 4 * d, 0.1)), half(values(&mut rng, 4 * n_kv * hd, 0.1)));
    let (va, vb) = (half(values(&mut rng, 8 * d, 0.1)), half(values(&mut rng, 8 * n_kv * hd, 0.1)));
    let shape = AttnShape { n_head, n_kv_head: n_kv, head_dim: hd, scale: 1.0 / 16.0, softcap: None };

    // One layer of a forward pass over `n` tokens at `pos0`, each step compared.
    let mut caches: Vec<(LayerCache, LayerCache)> = Vec::new();
    for _ in 0..3 {
        caches.push((p.cpu.new_layer_cache(64, n_kv * hd, KvType::F16), p.gpu.new_layer_cache(64, n_kv * hd, KvType::F16)));
    }
    let masks = [
        (AttentionMask::Causal, None, &rope),
        (AttentionMask::Causal, Some(5), &rope_i),
        (AttentionMask::Bidirectional, None, &rope),
        (AttentionMask::BlockCausal { block: 4 }, None, &rope),
    ];
    for (pass, (pos0, n)) in [(0usize, 9usize), (9, 1), (10, 1), (11, 6)].into_iter().enumerate() {
        for (mi, &(mask, window, table_r)) in masks.iter().enumerate() {
            // Bidirectional and block-causal passes run on their own caches (one chunk each).
            let ci = match mi {
                0 | 1 => 0,
                2 => 1,
                _ => 2,
            };
            if mi == 1 && pass > 0 {
                continue;
            }
            if mi >= 2 && pass != 0 {
                continue;
            }
            let tag = format!("pass {pass} (pos {pos0}, {n} tokens, {mask:?}, window {window:?})");
            println!("{tag}");
            let x = values(&mut rng, n * d, 1.0);
            p.write(Buf::X, &x);
            p.both(|b| b.rms_norm(Buf::X, Buf::Xn, &w_in, eps, n));
            p.check("rms_norm", Buf::Xn, n);
            p.both(|b| b.matmul_fused(&[&wq, &wk, &wv], Buf::Xn, &[Buf::Q, Buf::K, Buf::V], n));
            p.check("Q (Q5_0)", Buf::Q, n);
            p.check("K (Q4_0)", Buf::K, n);
            p.check("V (Q8_0)", Buf::V, n);
            let mut terms = LowRankTerms::default();
            terms.push((0, LowRank { rank: 8, d_in: d, d_out: n_head * hd, a: &qa, bt: &qb, id: 11 }, 0.5));
            terms.push((1, LowRank { rank: 4, d_in: d, d_out: n_kv * hd, a: &ka, bt: &kb, id: 12 }, 2.0));
            terms.push((2, LowRank { rank: 8, d_in: d, d_out: n_kv * hd, a: &va, bt: &vb, id: 13 }, 1.0));
            p.both(|b| b.add_low_rank(&terms, Buf::Xn, &[Buf::Q, Buf::K, Buf::V], n));
            p.check("Q + LoRA", Buf::Q, n);
            p.check("V + LoRA", Buf::V, n);
            let (cc, gc) = &mut caches[ci];
            let span = Span { mask, window };
            let norms = QkNorms { q: Some(&w_q), k: Some(&w_k), eps };
            p.cpu.segment_attention(norms, table_r, cc, shape, span, 0, pos0, n);
            p.gpu.segment_attention(norms, table_r, gc, shape, span, 0, pos0, n);
            p.check("Q normed + RoPE", Buf::Q, n);
            p.check("attention", Buf::Attn, n);
            p.both(|b| b.matmul(&wo, Buf::Attn, Buf::Proj, n));
            p.check("attn_output (Q4_K)", Buf::Proj, n);
            p.both(|b| b.residual_norm(Some(&w_post), Some(&w_next), eps, n));
            p.check("residual X", Buf::X, n);
            p.check("residual Xn", Buf::Xn, n);
            p.both(|b| b.matmul(&wg, Buf::Xn, Buf::Gate, n));
            p.both(|b| b.matmul(&wu, Buf::Xn, Buf::Up, n));
            p.check("up (F16)", Buf::Up, n);
            let act = if pass % 2 == 0 { Activation::GeluTanh } else { Activation::Silu };
            p.both(|b| b.gated_activation(act, n));
            p.check(&format!("gate (Q5_0) {act:?} · up"), Buf::Gate, n);
            p.both(|b| b.matmul(&wd, Buf::Gate, Buf::Proj, n));
            p.check("ffn_down (Q6_K)", Buf::Proj, n);
            p.both(|b| b.matmul(&wf, Buf::Xn, Buf::V, n));
            p.check("F32 product", Buf::V, n);
        }
    }
    println!("embedding and LM head");
    let tokens: Vec<u32> = (0..7).map(|i| (i * 577 + 3) % vocab as u32).collect();
    let repl: Vec<f32> = values(&mut rng, d, 1.0);
    p.both(|b| b.embed(&table, &tokens, Some(25.298_221), Some((tokens[2], &repl))));
    p.check("embed (Q8_0, scaled, one row replaced)", Buf::X, tokens.len());
    let rows: Vec<usize> = vec![0, 3, 6];
    let c = p.cpu.lm_head(&table, &w_out, eps, None, &rows).to_vec();
    let g = p.gpu.lm_head(&table, &w_out, eps, None, &rows).to_vec();
    p.report("LM head logits (3 rows)", &c, &g);
    p.both(|b| b.lm_head_deferred(&table, &w_out, eps, None, &[4]));
    let pick_c = ruvllm_core::sampling::argmax(&p.cpu.logits()[..vocab]);
    let pick_g = p.gpu.argmax();
    println!("  greedy pick: CPU {pick_c} GPU {pick_g:?}");
    if pick_g.is_some_and(|g| g != pick_c) {
        p.failed.push("greedy pick".into());
    }
    // Embedding tables of every type the reference mode takes (K-quant rows need a width that is
    // a multiple of 256: a 512-wide model).
    println!("embeddings by table type (d_model 512)");
    let w512 = BufWidths { d_model: 512, ..widths };
    p.both(|b| b.reserve(w512, max_batch));
    // All alive at once: the GPU keeps uploads by the bytes' address, which a freed table's
    // successor could reuse (a model's weights live as long as the model).
    let tables: Vec<QWeight> = [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::F16, GgmlType::F32, GgmlType::Q8_0]
        .into_iter()
        .map(|ty| weight(&mut rng, ty, 300, 512))
        .collect();
    for t in &tables {
        p.both(|b| b.prepare_weight(t));
        let toks: Vec<u32> = vec![0, 299, 17, 150];
        p.both(|b| b.embed(t, &toks, Some(22.627_417), None));
        p.check(&format!("embed ({})", t.ty.name()), Buf::X, toks.len());
    }
    if fast {
        let differ = p.failed.len();
        println!("CONTROL (fast kernels): {differ} of {} comparisons differ from the scalar CPU path", p.checks + 1);
        std::process::exit(if differ > 0 { 0 } else { 1 });
    }
    if p.failed.is_empty() {
        println!("EXACT OPS: PASS");
    } else {
        println!("EXACT OPS: FAIL ({})", p.failed.join("; "));
        std::process::exit(1);
    }
}
