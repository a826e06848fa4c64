//! Fuzzing the GGUF reader, and what loading does with a parsed header before any weight is
//! used (the model config, the tokenizer, the chat template), in-process. The seed corpus is
//! built here by code: synthetic headers with every value type and nested arrays, small Llama,
//! Qwen2 (byte-level BPE) and Gemma 3 headers with tokenizers, templates and tensors, and the
//! real model's metadata when it is on disk. A seeded generator mutates them (bit flips,
//! boundary values over integers, truncations, chunk duplication, deletion and splicing between
//! seeds, length and count fields pushed past the end). Every execution must return (a panic
//! fails), within a second, and any error must carry a known code that is not ERR_INTERNAL.
//!
//! CI runs a short deterministic campaign; the full one (a million executions) is
//! `RUVLLM_FUZZ_EXECS=1000000 cargo test --release -p ruvllm-core --test fuzz_gguf -- --nocapture`.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use ruvllm_core::backend::cpu::GgmlType;
use ruvllm_core::chat::ChatTemplate;
use ruvllm_core::gguf::writer::GgufWriter;
use ruvllm_core::gguf::{GgufFile, MetadataValue as V};
use ruvllm_core::models::config_from_gguf;
use ruvllm_core::tokenizer::Tokenizer;
use ruvllm_core::Error;

/// Executions of the CI campaign.
const CI_EXECS: usize = 20_000;
/// The slowest execution allowed on a synthetic header, and on the real one (its 262,144-token
/// tokenizer takes most of a second to build on a busy machine).
const SLOW: Duration = Duration::from_secs(1);
const SLOW_REAL: Duration = Duration::from_secs(10);
/// Codes a bad header may give.
const CODES: &[&str] = &["ERR_GGUF_INVALID", "ERR_MODEL_UNSUPPORTED", "ERR_TOKENIZER", "ERR_CHAT_TEMPLATE", "ERR_INVALID_ARG"];

/// xorshift64*: the campaign is the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn strings(v: &[&str]) -> V {
    V::Array(v.iter().map(|s| V::String((*s).into())).collect())
}

/// A header with every value type, nested arrays and two tensors.
fn values_seed() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", V::String("llama".into()))
        .add_metadata("general.alignment", V::U32(32))
        .add_metadata("a.u8", V::U8(7))
        .add_metadata("a.i8", V::I8(-7))
        .add_metadata("a.u16", V::U16(700))
        .add_metadata("a.i16", V::I16(-700))
        .add_metadata("a.u32", V::U32(70_000))
        .add_metadata("a.i32", V::I32(-70_000))
        .add_metadata("a.u64", V::U64(1 << 40))
        .add_metadata("a.i64", V::I64(-(1 << 40)))
        .add_metadata("a.f32", V::F32(0.5))
        .add_metadata("a.f64", V::F64(-0.25))
        .add_metadata("a.bool", V::Bool(true))
        .add_metadata("a.str", V::String("héllo".into()))
        .add_metadata("a.nested", V::Array(vec![V::Array(vec![V::U8(1), V::U8(2)]), V::Array(vec![V::String("x".into())])]))
        .add_f32("tok.weight", &[4, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
        .add_tensor("q.weight", &[32, 1], GgmlType::Q8_0, vec![0u8; 34]);
    w.to_bytes()
}

/// An SPM ("llama") vocabulary: control tokens, byte tokens and a few pieces.
fn spm(w: &mut GgufWriter) {
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    tokens.extend((0..8).map(|b| format!("<0x{b:02X}>")));
    tokens.extend(["▁", "▁a", "▁b", "a", "b", "ab", "▁ab"].map(String::from));
    let n = tokens.len();
    let types: Vec<V> = (0..n)
        .map(|i| {
            V::I32(if i < 3 {
                3
            } else if i < 11 {
                6
            } else {
                1
            })
        })
        .collect();
    w.add_metadata("tokenizer.ggml.model", V::String("llama".into()))
        .add_metadata("tokenizer.ggml.tokens", V::Array(tokens.into_iter().map(V::String).collect()))
        .add_metadata("tokenizer.ggml.scores", V::Array((0..n).map(|i| V::F32(-(i as f32))).collect()))
        .add_metadata("tokenizer.ggml.token_type", V::Array(types))
        .add_metadata("tokenizer.ggml.bos_token_id", V::U32(1))
        .add_metadata("tokenizer.ggml.eos_token_id", V::U32(2))
        .add_metadata("tokenizer.ggml.add_bos_token", V::Bool(true));
}

/// A small decoder's header: `arch` keys, a tokenizer, a chat template and its tensors.
fn model_seed(arch: &str, bpe: bool) -> Vec<u8> {
    let (d, ff, vocab) = (8u64, 16u64, 18u64);
    let k = |s: &str| format!("{arch}.{s}");
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", V::String(arch.into()))
        .add_metadata("general.name", V::String("fuzz".into()))
        .add_metadata(&k("block_count"), V::U32(1))
        .add_metadata(&k("embedding_length"), V::U32(d as u32))
        .add_metadata(&k("feed_forward_length"), V::U32(ff as u32))
        .add_metadata(&k("attention.head_count"), V::U32(2))
        .add_metadata(&k("attention.head_count_kv"), V::U32(1))
        .add_metadata(&k("attention.layer_norm_rms_epsilon"), V::F32(1e-6))
        .add_metadata(&k("context_length"), V::U32(64))
        .add_metadata(&k("rope.freq_base"), V::F32(10_000.0));
    if arch == "gemma3" {
        w.add_metadata(&k("attention.sliding_window"), V::U32(16)).add_metadata(&k("attention.key_length"), V::U32(4));
    }
    if bpe {
        let tokens = ["a", "b", "c", "Ġ", "ab", "Ġa", "Ġab", "<|endoftext|>", "<|im_start|>", "<|im_end|>"];
        w.add_metadata("tokenizer.ggml.model", V::String("gpt2".into()))
            .add_metadata("tokenizer.ggml.pre", V::String("qwen2".into()))
            .add_metadata("tokenizer.ggml.tokens", strings(&tokens))
            .add_metadata("tokenizer.ggml.token_type", V::Array((0..tokens.len()).map(|i| V::I32(if i >= 7 { 3 } else { 1 })).collect()))
            .add_metadata("tokenizer.ggml.merges", strings(&["a b", "Ġ a", "Ġa b"]))
            .add_metadata("tokenizer.ggml.eos_token_id", V::U32(7));
    } else {
        spm(&mut w);
    }
    w.add_metadata(
        "tokenizer.chat_template",
        V::String("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}".into()),
    );
    let zeros = |n: u64| vec![0.5f32; n as usize];
    w.add_f32("token_embd.weight", &[d, vocab], &zeros(d * vocab))
        .add_f32("blk.0.attn_norm.weight", &[d], &zeros(d))
        .add_f32("blk.0.attn_q.weight", &[d, d], &zeros(d * d))
        .add_f32("blk.0.ffn_up.weight", &[d, ff], &zeros(d * ff))
        .add_f32("output_norm.weight", &[d], &zeros(d));
    w.to_bytes()
}

/// The real model's metadata (tokenizer and template included) without its tensors, when the
/// model is on disk.
fn real_seed() -> Option<Vec<u8>> {
    let path = ruvllm_models::real_test_model().ok()?;
    let file = GgufFile::open(&path).ok()?;
    let mut w = GgufWriter::new();
    let meta: &BTreeMap<String, V> = &file.metadata;
    for (key, value) in meta {
        w.add_metadata(key, value.clone());
    }
    Some(w.to_bytes())
}

/// Integers a length, count, type or offset field should survive.
fn boundary(rng: &mut Rng, len: usize) -> u64 {
    const FIXED: [u64; 12] = [0, 1, 2, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFF_FFFF, 0xFFFF_FFFF, 1 << 32, i64::MAX as u64, u64::MAX];
    match rng.below(3) {
        0 => FIXED[rng.below(FIXED.len())],
        1 => (len + rng.below(16)) as u64,
        _ => rng.below(64) as u64,
    }
}

/// One to four mutations of `seed` (`other` for splices).
fn mutate(rng: &mut Rng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        if b.is_empty() {
            break;
        }
        // Most headers' structure (counts, key lengths, type tags) sits in the first bytes.
        let at = if rng.below(2) == 0 { rng.below(b.len().min(256)) } else { rng.below(b.len()) };
        match rng.below(8) {
            0 => b[at] ^= 1 << rng.below(8),
            1 => b[at] = [0u8, 0xFF, 0x7F, 0x80, 1][rng.below(5)],
            2 | 3 => {
                let v = boundary(rng, b.len());
                let width = if rng.below(2) == 0 { 4 } else { 8 };
                let end = (at + width).min(b.len());
                b[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
            }
            4 => b.truncate(at),
            5 => {
                let n = rng.below(64).min(b.len() - at);
                let chunk = b[at..at + n].to_vec();
                let to = rng.below(b.len());
                b.splice(to..to, chunk);
            }
            6 => {
                let n = rng.below(64).min(b.len() - at);
                b.drain(at..at + n);
            }
            _ => {
                if !other.is_empty() {
                    let from = rng.below(other.len());
                    let n = rng.below(128).min(other.len() - from);
                    let end = (at + n).min(b.len());
                    b.splice(at..end, other[from..from + n].iter().copied());
                }
            }
        }
    }
    b
}

/// What one execution found.
#[derive(Default)]
struct Tally {
    execs: usize,
    parsed: usize,
    configs: usize,
    tokenizers: usize,
    codes: BTreeMap<&'static str, usize>,
    slowest: Duration,
    failures: Vec<String>,
}

impl Tally {
    fn error(&mut self, stage: &str, e: &Error) {
        let code = e.code();
        *self.codes.entry(code).or_insert(0) += 1;
        if !CODES.contains(&code) {
            self.failures.push(format!("{stage}: unexpected code {code}: {e}"));
        }
    }
}

/// Parses `bytes` and runs what loading runs on the header.
fn execute(bytes: Vec<u8>, t: &mut Tally) {
    let file = match GgufFile::from_bytes(bytes, "fuzz.gguf") {
        Ok(f) => f,
        Err(e) => return t.error("parse", &e),
    };
    t.parsed += 1;
    match config_from_gguf(&file) {
        Ok(_) => t.configs += 1,
        Err(e) => t.error("config", &e),
    }
    let tok = match Tokenizer::from_gguf(&file) {
        Ok(tok) => tok,
        Err(e) => return t.error("tokenizer", &e),
    };
    t.tokenizers += 1;
    if let Err(e) = tok.encode("ab a b\u{1F600}", true, true) {
        t.error("encode", &e);
    }
    if let Err(e) = ChatTemplate::from_gguf(&file, &tok) {
        t.error("template", &e);
    }
}

fn campaign(execs: usize) -> Tally {
    let mut seeds = vec![values_seed(), model_seed("llama", false), model_seed("qwen2", true), model_seed("gemma3", false)];
    let real = real_seed();
    let mut rng = Rng(0x5EED_6617);
    let mut t = Tally::default();
    // Every seed as it is parses.
    for s in &seeds {
        let mut one = Tally::default();
        execute(s.clone(), &mut one);
        assert_eq!(one.parsed, 1, "a seed does not parse: {:?}", one.codes);
    }
    for i in 0..execs {
        // The real header is megabytes (a 262,144-token vocabulary): one execution in 500.
        let on_real = real.is_some() && i % 500 == 0;
        let bytes = match &real {
            Some(r) if on_real => mutate(&mut rng, r, &seeds[0]),
            _ => {
                let a = rng.below(seeds.len());
                let b = rng.below(seeds.len());
                mutate(&mut rng, &seeds[a], &seeds[b])
            }
        };
        // Now and then a mutant joins the corpus, so mutations stack across executions.
        if i % 1000 == 999 && bytes.len() < 4096 && GgufFile::from_bytes(bytes.clone(), "fuzz.gguf").is_ok() {
            seeds.push(bytes.clone());
            if seeds.len() > 32 {
                seeds.remove(4);
            }
        }
        let start = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| execute(bytes.clone(), &mut t)));
        let took = start.elapsed();
        t.execs += 1;
        t.slowest = t.slowest.max(took);
        let failed = match (outcome.is_err(), took > SLOW) {
            (true, _) => Some(format!("panic on a {}-byte input", bytes.len())),
            (false, true) if !on_real || took > SLOW_REAL => Some(format!("{took:?} on a {}-byte input", bytes.len())),
            _ => None,
        };
        if let Some(what) = failed {
            // Kept for reproduction (the test's own folder under target/).
            let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-failures");
            let _ = std::fs::create_dir_all(&dir);
            let file = dir.join(format!("exec-{i}.gguf"));
            let _ = std::fs::write(&file, &bytes);
            t.failures.push(format!("execution {i}: {what} (saved as {})", file.display()));
        }
    }
    t
}

fn peak_rss_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb / 1024)
}

#[test]
fn mutated_headers_never_crash_hang_or_give_uncoded_errors() {
    let execs = std::env::var("RUVLLM_FUZZ_EXECS").ok().and_then(|v| v.parse().ok()).unwrap_or(CI_EXECS);
    // A panic is caught and counted; keep the default hook from printing each one.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let start = Instant::now();
    let t = campaign(execs);
    std::panic::set_hook(hook);
    let secs = start.elapsed().as_secs_f64();
    println!(
        "fuzz_gguf: {} executions in {secs:.1} s ({:.0}/s), {} parsed, {} configs, {} tokenizers; slowest {:?}; peak RSS {} MiB; failures {}",
        t.execs,
        t.execs as f64 / secs,
        t.parsed,
        t.configs,
        t.tokenizers,
        t.slowest,
        peak_rss_mib().map_or("?".into(), |m| m.to_string()),
        t.failures.len()
    );
    println!("fuzz_gguf: error codes {:?}", t.codes);
    assert!(t.failures.is_empty(), "{} failures, the first: {:#?}", t.failures.len(), &t.failures[..t.failures.len().min(10)]);
    // The campaign reached past the reader.
    assert!(t.parsed > execs / 20 && t.tokenizers > 0, "too few mutants parse: {} of {}", t.parsed, t.execs);
}

/// Replays one saved input with the time of each stage:
/// `RUVLLM_FUZZ_REPLAY=path cargo test --release -p ruvllm-core --test fuzz_gguf replay -- --ignored --nocapture`.
#[test]
#[ignore]
fn replay() {
    let Ok(path) = std::env::var("RUVLLM_FUZZ_REPLAY") else { return };
    let bytes = std::fs::read(&path).expect("read the input");
    let t0 = Instant::now();
    let file = GgufFile::from_bytes(bytes, "fuzz.gguf");
    println!("parse: {:?} {:?}", t0.elapsed(), file.as_ref().err().map(|e| e.to_string()));
    let Ok(file) = file else { return };
    let t1 = Instant::now();
    let cfg = config_from_gguf(&file);
    println!("config: {:?} {:?}", t1.elapsed(), cfg.err().map(|e| e.to_string()));
    let t2 = Instant::now();
    let tok = Tokenizer::from_gguf(&file);
    println!("tokenizer: {:?} {:?}", t2.elapsed(), tok.as_ref().err().map(|e| e.to_string()));
    let Ok(tok) = tok else { return };
    let t3 = Instant::now();
    let enc = tok.encode("ab a b\u{1F600}", true, true);
    println!("encode: {:?} {:?}", t3.elapsed(), enc.map(|v| v.len()));
    let t4 = Instant::now();
    let tpl = ChatTemplate::from_gguf(&file, &tok);
    println!("template: {:?} {:?}", t4.elapsed(), tpl.err().map(|e| e.to_string()));
}

/// Found by the campaign: a block count of 2^32 − 1 sized the per-layer tables (4 GiB, seconds)
/// before the dimensions were checked.
#[test]
fn a_huge_block_count_is_refused_before_anything_is_sized() {
    let mut bytes = model_seed("gemma3", false);
    let key = b"gemma3.block_count";
    let at = bytes.windows(key.len()).position(|w| w == key).expect("key") + key.len() + 4;
    bytes[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    let file = GgufFile::from_bytes(bytes, "fuzz.gguf").expect("parses");
    let start = Instant::now();
    let e = config_from_gguf(&file).expect_err("refused");
    assert_eq!(e.code(), "ERR_GGUF_INVALID");
    assert!(e.to_string().contains("block_count"), "{e}");
    assert!(start.elapsed() < Duration::from_millis(100));
}
