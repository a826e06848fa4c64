//! Times prefill and decode of the forward pass alone (no tokenizer, no sampling), for
//! profiling: `cargo run --release -p ruvllm-eval --example forward -- MODEL.gguf [threads] [prompt] [reps]`.
use std::time::Instant;

use ruvllm_core::backend::{cpu::CpuBackend, Backend};
use ruvllm_core::gguf::GgufFile;
use ruvllm_core::models::{config_from_gguf, Segment, Transformer, WeightLoader};
use ruvllm_core::nn::AttentionMask;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).expect("usage: forward MODEL.gguf [threads] [prompt] [reps]");
    let threads: usize = args.get(2).map_or(2, |s| s.parse().unwrap());
    let prompt: usize = args.get(3).map_or(128, |s| s.parse().unwrap());
    let reps: usize = args.get(4).map_or(3, |s| s.parse().unwrap());
    let file = GgufFile::open(path).unwrap();
    let cfg = config_from_gguf(&file).unwrap();
    // Room for the prompt (prefilled in chunks of 512, as the engine does) and the decode.
    let ctx = (prompt + 64).max(1024);
    let model = Transformer::load(&WeightLoader { file: &file }, cfg, ctx).unwrap();
    let mut be = CpuBackend::new(threads);
    let t = Instant::now();
    model.prepare(&mut be, 512);
    println!("prepare (pack for the prefill GEMM): {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let mut cache = model.new_cache(&be, ctx, 512);
    let tokens: Vec<u32> = (0..prompt as u32).map(|i| 2 + (i * 7919) % 20000).collect();
    for r in 0..reps {
        let t = Instant::now();
        let mut chunks = Vec::new();
        for (c, chunk) in tokens.chunks(512).enumerate() {
            let t = Instant::now();
            model.forward(chunk, c * 512, &mut cache, &mut be).unwrap();
            chunks.push(format!("{:.0}", t.elapsed().as_secs_f64() * 1e3));
        }
        if chunks.len() > 1 {
            println!("ms per 512-token chunk: {}", chunks.join(" "));
        }
        let pre = t.elapsed().as_secs_f64();
        if r == 0 {
            // A fingerprint of the prefill logits, to check that a change leaves them identical.
            let bits = be.logits().iter().fold(0u64, |h, v| h.wrapping_mul(0x100000001b3) ^ v.to_bits() as u64);
            println!("prefill logits fingerprint {bits:016x}");
        }
        let t = Instant::now();
        let n_dec = if std::env::var_os("PREFILL_ONLY").is_some() { 1 } else { std::env::var("DECODE_TOKENS").ok().and_then(|s| s.parse().ok()).unwrap_or(32) };
        // GREEDY=1: greedy decoding as the engine runs it (the LM head's exact screening where
        // the backend has it, `Transformer::head_argmax`), each pick the next token.
        let greedy = std::env::var("GREEDY").is_ok_and(|v| v == "1");
        let mut next = 100u32;
        for i in 0..n_dec {
            if greedy {
                let mut segs = [Segment { tokens: &[next], pos0: prompt + i as usize, cache: &mut cache }];
                model.forward_segments(&mut segs, AttentionMask::Causal, &mut be).unwrap();
                next = match model.head_argmax(&mut be, 0) {
                    Some(id) => id,
                    None => {
                        model.head_deferred(&mut be, 0);
                        ruvllm_core::sampling::argmax(&be.logits()[..model.cfg.vocab_size])
                    }
                };
            } else {
                model.forward(&[100 + i], prompt + i as usize, &mut cache, &mut be).unwrap();
            }
        }
        let dec = t.elapsed().as_secs_f64() / n_dec as f64;
        if r == 0 && greedy {
            println!("last greedy pick {next}");
        } else if r == 0 {
            let bits = be.logits().iter().fold(0u64, |h, v| h.wrapping_mul(0x100000001b3) ^ v.to_bits() as u64);
            println!("last decoded token's logits fingerprint {bits:016x}");
        }
        let huge = std::fs::read_to_string("/proc/self/smaps_rollup")
            .ok()
            .and_then(|t| t.lines().find(|l| l.starts_with("AnonHugePages")).map(|l| l.split_whitespace().nth(1).unwrap_or("?").to_string()))
            .unwrap_or_default();
        println!(
            "rep {r}: huge pages {huge} kB; prefill {prompt} tokens {:.1} ms ({:.1} tok/s); decode {:.2} ms/token ({:.1} tok/s)",
            pre * 1e3,
            prompt as f64 / pre,
            dec * 1e3,
            1.0 / dec
        );
    }
}
