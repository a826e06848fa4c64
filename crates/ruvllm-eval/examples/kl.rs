//! Our side of the KL-divergence oracle (benches/kl.mjs): reads a reference in llama.cpp's
//! `--kl-divergence-base` format (benches/kl_reference.py writes the f32 one), evaluates the same
//! chunks with our kernels (whichever path `RUVLLM_*` leaves: AVX-512, AVX2, scalar) and prints
//! the statistics `llama-perplexity --kl-divergence` prints, computed the same way (its
//! `log_softmax` against the base's 16-bit log-probabilities, its percentile interpolation), as
//! one JSON line.
//!
//! `cargo run --release -p ruvllm-eval --example kl -- MODEL.gguf REF.kld [threads]`
use ruvllm_core::models::Outputs;
use std::fs::File;
use std::io::{BufReader, Read};
use std::time::Instant;

use ruvllm_core::backend::cpu::CpuBackend;
use ruvllm_core::gguf::GgufFile;
use ruvllm_core::models::{config_from_gguf, Transformer, WeightLoader};
use ruvllm_core::nn::AttentionMask;
use ruvllm_core::tokenizer::Tokenizer;

fn read_u32(r: &mut impl Read) -> u32 {
    let mut b = [0u8; 4];
    r.read_exact(&mut b).expect("the reference file is cut short");
    u32::from_le_bytes(b)
}

/// llama.cpp's sums over the scored positions.
#[derive(Default)]
struct Stats {
    nll: f64,
    nll2: f64,
    nll_base: f64,
    nll_base2: f64,
    nll_nll_base: f64,
    kld: f64,
    kld2: f64,
    same_top: usize,
    count: usize,
    klds: Vec<f32>,
}

impl Stats {
    /// One position: `logits` ours, `base` the reference's row (f32 scale, f32 min, then u16s).
    fn add(&mut self, logits: &[f32], base: &[u16], tok: usize) {
        let (mut imax, mut max_logit) = (0, logits[0]);
        for (i, &l) in logits.iter().enumerate().skip(1) {
            if l > max_logit {
                max_logit = l;
                imax = i;
            }
        }
        let sum_exp: f64 = logits.iter().map(|&l| (l - max_logit).exp() as f64).sum();
        let log_sum_exp = sum_exp.ln() as f32;
        let scale = f32::from_bits(base[0] as u32 | (base[1] as u32) << 16);
        let min_log_prob = f32::from_bits(base[2] as u32 | (base[3] as u32) << 16);
        let base = &base[4..];
        let nll = max_logit + log_sum_exp - logits[tok];
        let nll_base = -(scale * base[tok] as f32 + min_log_prob);
        self.nll += nll as f64;
        self.nll2 += (nll * nll) as f64;
        self.nll_base += nll_base as f64;
        self.nll_base2 += (nll_base * nll_base) as f64;
        self.nll_nll_base += (nll * nll_base) as f64;
        let norm = max_logit + log_sum_exp;
        let (mut sum, mut imax_base, mut best) = (0.0f64, 0, 0.0f32);
        for (i, (&b, &l)) in base.iter().zip(logits).enumerate() {
            let p_log_base = scale * b as f32 + min_log_prob;
            if i == 0 || p_log_base > best {
                best = p_log_base;
                imax_base = i;
            }
            if p_log_base > -16.0 {
                sum += (p_log_base.exp() * (p_log_base - l + norm)) as f64;
            }
        }
        self.kld += sum;
        self.kld2 += sum * sum;
        self.klds.push(sum as f32);
        self.count += 1;
        self.same_top += (imax == imax_base) as usize;
    }
}

fn mean_unc(sum: f64, sum2: f64, n: usize) -> (f64, f64) {
    let f = sum / n as f64;
    let df = sum2 / n as f64 - f * f;
    (f, if df > 0.0 && n > 10 { (df / (n - 1) as f64).sqrt() } else { 0.0 })
}

/// llama.cpp's `percentile` (linear between neighbours of the sorted values).
fn percentile(v: &[f32], fraction: f32) -> f32 {
    let p = fraction * (v.len() - 1) as f32;
    let ip = p as usize;
    let p = p - ip as f32;
    (1.0 - p) * v[ip] + p * v[(ip + 1).min(v.len() - 1)]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(model_path), Some(ref_path)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: kl MODEL.gguf REF.kld [threads]");
        std::process::exit(2);
    };
    let threads: usize = args.get(3).map_or(2, |s| s.parse().expect("threads: an integer"));
    let file = GgufFile::open(model_path).expect("open the model");
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let cfg = config_from_gguf(&file).expect("config");
    let mut r = BufReader::with_capacity(1 << 22, File::open(ref_path).expect("open the reference"));
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic).expect("read the reference");
    assert_eq!(&magic, b"_logits_", "{ref_path} is not a llama.cpp log-probability file");
    let n_ctx = read_u32(&mut r) as usize;
    let n_vocab = read_u32(&mut r) as usize;
    let n_chunk = read_u32(&mut r) as usize;
    assert_eq!(n_vocab, cfg.vocab_size, "the reference's vocabulary is not the model's");
    let mut tokens = Vec::with_capacity(n_ctx * n_chunk);
    for _ in 0..n_ctx * n_chunk {
        tokens.push(read_u32(&mut r));
    }
    let model = Transformer::load(&WeightLoader { file: &file }, cfg, n_ctx).expect("load");
    let mut be = CpuBackend::new(threads);
    model.prepare(&mut be, n_ctx.min(512));
    let nv = 2 * n_vocab.div_ceil(2) + 4;
    let first = n_ctx / 2;
    let rows: Vec<usize> = (first..n_ctx - 1).collect();
    let mut base = vec![0u16; rows.len() * nv];
    let mut bytes = vec![0u8; base.len() * 2];
    let mut stats = Stats::default();
    let t0 = Instant::now();
    for c in 0..n_chunk {
        let mut ids = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        if tok.adds_bos() {
            ids[0] = tok.bos_id().expect("a model that adds BOS has one");
        }
        r.read_exact(&mut bytes).expect("the reference file is cut short");
        for (b, ch) in base.iter_mut().zip(bytes.chunks_exact(2)) {
            *b = u16::from_le_bytes([ch[0], ch[1]]);
        }
        let mut cache = model.new_cache(&be, n_ctx, n_ctx.min(512));
        let mut done = 0;
        // Whole chunks of at most 512 tokens per call; the rows to score are in the last ones.
        while done < n_ctx {
            let n = (n_ctx - done).min(512);
            let want: Vec<usize> = rows.iter().filter(|&&p| p >= done && p < done + n).map(|&p| p - done).collect();
            let slice = &ids[done..done + n];
            model
                .forward_each(slice, done, AttentionMask::Causal, &mut cache, &mut be, Outputs::LogitsOf(&want), &mut |i, logits| {
                    let pos = done + want[i];
                    let j = pos - first;
                    stats.add(logits, &base[j * nv..(j + 1) * nv], tokens[c * n_ctx + pos + 1] as usize);
                })
                .expect("forward");
            done += n;
        }
        eprintln!("kl: chunk {}/{n_chunk}, {:.1} s", c + 1, t0.elapsed().as_secs_f64());
    }
    let n = stats.count;
    let (ln_ppl, _) = mean_unc(stats.nll, stats.nll2, n);
    let (ln_ppl_base, _) = mean_unc(stats.nll_base, stats.nll_base2, n);
    let (kld, kld_unc) = mean_unc(stats.kld, stats.kld2, n);
    let mut klds = stats.klds;
    klds.sort_by(f32::total_cmp);
    let isa = ruvllm_core::backend::cpu::matmul::isa();
    println!(
        "{{\"path\":\"{isa}\",\"positions\":{n},\"mean_kld\":{kld:.6},\"mean_kld_unc\":{kld_unc:.6},\"p99_kld\":{:.6},\"median_kld\":{:.6},\"max_kld\":{:.6},\"same_top\":{:.4},\"ppl\":{:.4},\"ppl_base\":{:.4},\"seconds\":{:.1}}}",
        percentile(&klds, 0.99),
        percentile(&klds, 0.5),
        klds[klds.len() - 1],
        stats.same_top as f64 / n as f64,
        ln_ppl.exp(),
        ln_ppl_base.exp(),
        t0.elapsed().as_secs_f64()
    );
}
