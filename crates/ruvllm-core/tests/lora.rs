//! LoRA adapters on the real Gemma 3 270M: a random rank-8 adapter on all seven projections of
//! every block, written here as a llama.cpp LoRA GGUF and as a PEFT safetensors copy. The two
//! give the same tokens, the adapter changes the greedy continuation, a zero scale is the base
//! model exactly, the prefix cache never mixes adapter sets, and bad files are
//! `ERR_ADAPTER_INVALID`. (llama.cpp applying the same GGUF is checked in the JS suite.)

mod common;
use common::{config, model_path, Rng};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ruvllm_core::engine::{Engine, GenerateParams, LoadOptions, Prompt};
use ruvllm_core::gguf::writer::GgufWriter;
use ruvllm_core::gguf::{GgufFile, MetadataValue as V};
use ruvllm_core::models::TransformerConfig;
use ruvllm_core::nn::{AdapterSet, Proj};
use ruvllm_core::sampling::SamplingParams;

const PROMPTS: &[&str] = &[
    "The capital of France is Paris. The capital of Germany is",
    "def fibonacci(n):",
    "The quick brown fox",
    "Water boils at a temperature of",
    "Monday, Tuesday, Wednesday,",
];

/// (layer, projection, A `r × in`, B `out × r`) for every projection of every block.
type Factors = Vec<(usize, Proj, Vec<f32>, Vec<f32>)>;

fn random_factors(cfg: &TransformerConfig, rank: usize, b_scale: f32, seed: u64) -> Factors {
    let mut rng = Rng(seed);
    let mut out = Vec::new();
    for l in 0..cfg.n_layer {
        for p in Proj::ALL {
            let (o, i) = p.shape(cfg);
            let a_scale = 1.0 / (i as f32).sqrt();
            let a = (0..rank * i).map(|_| rng.uniform() * a_scale).collect();
            let b = (0..o * rank).map(|_| rng.uniform() * b_scale).collect();
            out.push((l, p, a, b));
        }
    }
    out
}

fn write_gguf(path: &Path, arch: &str, alpha: f32, rank: usize, f: &Factors) {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", V::String(arch.into()))
        .add_metadata("general.type", V::String("adapter".into()))
        .add_metadata("adapter.type", V::String("lora".into()))
        .add_metadata("adapter.lora.alpha", V::F32(alpha));
    for (l, p, a, b) in f {
        let base = format!("blk.{l}.{}.weight", p.gguf_name());
        let (o, i) = (b.len() / rank, a.len() / rank);
        w.add_f32(&format!("{base}.lora_a"), &[i as u64, rank as u64], a);
        w.add_f32(&format!("{base}.lora_b"), &[rank as u64, o as u64], b);
    }
    w.write(path).expect("write adapter gguf");
}

fn write_peft(dir: &Path, alpha: f32, rank: usize, f: &Factors) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let config = serde_json::json!({
        "peft_type": "LORA", "r": rank, "lora_alpha": alpha,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    });
    std::fs::write(dir.join("adapter_config.json"), config.to_string()).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (l, p, a, b) in f {
        let parent = if matches!(p, Proj::Q | Proj::K | Proj::V | Proj::O) { "self_attn" } else { "mlp" };
        let base = format!("base_model.model.model.layers.{l}.{parent}.{}", p.hf_name());
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let (o, i) = (b.len() / rank, a.len() / rank);
        tensors.push((format!("{base}.lora_A.weight"), vec![rank, i], bytes(a)));
        tensors.push((format!("{base}.lora_B.weight"), vec![o, rank], bytes(b)));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> =
        tensors.iter().map(|(n, s, d)| (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), d).unwrap())).collect();
    let path = dir.join("adapter_model.safetensors");
    safetensors::serialize_to_file(views, None, &path).unwrap();
    path
}

fn engine(adapters: Vec<(PathBuf, f32)>) -> Result<Engine, ruvllm_core::Error> {
    Engine::load(&model_path(), LoadOptions { context_size: Some(256), threads: Some(2), seed: None, adapters, ..Default::default() })
}

fn greedy(e: &Engine, prompt: &str, adapters: Option<AdapterSet>) -> Vec<u32> {
    let params =
        GenerateParams { max_tokens: 16, sampling: SamplingParams::greedy(), stop: vec![], chat_template: None, diffusion: None, ..Default::default() };
    e.generate_blocking_with(Prompt::Text(prompt.into()), params, adapters).expect("generate").tokens
}

const RANK: usize = 8;
const ALPHA: f32 = 16.0;
const B_SCALE: f32 = 0.05;

#[test]
fn gguf_and_peft_adapters_change_the_output_alike_and_scale_zero_is_the_base_model() {
    let cfg = config();
    let dir = tempfile::tempdir().unwrap();
    let f = random_factors(&cfg, RANK, B_SCALE, 7);
    let gguf = dir.path().join("adapter.gguf");
    write_gguf(&gguf, &cfg.architecture, ALPHA, RANK, &f);
    let peft = write_peft(&dir.path().join("peft"), ALPHA, RANK, &f);

    let e = engine(vec![]).unwrap();
    let a = e.load_adapter(&gguf).expect("load gguf adapter");
    assert_eq!(a.rank, RANK);
    assert_eq!(a.targets, Proj::ALL.to_vec());
    assert!((a.base_scale - ALPHA / RANK as f32).abs() < 1e-6);
    let p = e.load_adapter(&peft).expect("load peft adapter");
    let p_dir = e.load_adapter(peft.parent().unwrap()).expect("load peft folder");
    let set = |x: &Arc<ruvllm_core::nn::LoraAdapter>, s: f32| Some(AdapterSet::new(vec![(x.clone(), s)]));

    let mut changed = 0;
    for prompt in PROMPTS {
        let base = greedy(&e, prompt, None);
        let with_gguf = greedy(&e, prompt, set(&a, 1.0));
        let with_peft = greedy(&e, prompt, set(&p, 1.0));
        assert_eq!(with_gguf, with_peft, "{prompt:?}: the GGUF and PEFT copies differ");
        assert_eq!(greedy(&e, prompt, set(&p_dir, 1.0)), with_peft, "{prompt:?}: PEFT file and folder differ");
        if with_gguf != base {
            changed += 1;
        }
        // Scale 0 (and an empty set) is the base model exactly, and the prefix cache kept from
        // the adapter run above is not reused for it.
        assert_eq!(greedy(&e, prompt, set(&a, 0.0)), base, "{prompt:?}: scale 0");
        assert_eq!(greedy(&e, prompt, Some(AdapterSet::default())), base, "{prompt:?}: no adapters");
        // Same prompt again right after the base run: the adapter's tokens, not the cache's.
        assert_eq!(greedy(&e, prompt, set(&a, 1.0)), with_gguf, "{prompt:?}: after a base run");
        eprintln!("{prompt:?}\n  base    {:?}\n  adapter {:?}", e.detokenize(&base).unwrap(), e.detokenize(&with_gguf).unwrap());
    }
    assert!(changed >= 4, "the adapter changed only {changed}/{} greedy continuations", PROMPTS.len());

    // Load-time adapters apply to every request that names none; an empty set turns them off.
    let e2 = engine(vec![(gguf.clone(), 1.0)]).unwrap();
    assert_eq!(e2.default_adapters().entries().len(), 1);
    assert_eq!(greedy(&e2, PROMPTS[0], None), greedy(&e, PROMPTS[0], set(&a, 1.0)));
    assert_eq!(greedy(&e2, PROMPTS[0], Some(AdapterSet::default())), greedy(&e, PROMPTS[0], None));

    // Two adapters at once: the deltas add up (the same adapter twice at 0.5 is it once at 1).
    let half = Some(AdapterSet::new(vec![(a.clone(), 0.5), (p.clone(), 0.5)]));
    let once = greedy(&e, PROMPTS[1], set(&a, 1.0));
    assert_eq!(greedy(&e, PROMPTS[1], half), once);
}

#[test]
fn bad_adapter_files_are_adapter_invalid() {
    let cfg = config();
    let e = engine(vec![]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let f = random_factors(&cfg, 4, 0.01, 3);
    let expect_invalid = |path: &Path, what: &str, needle: &str| {
        let err = e.load_adapter(path).expect_err(what);
        assert_eq!(err.code(), "ERR_ADAPTER_INVALID", "{what}: {err}");
        assert!(err.to_string().contains(needle), "{what}: {err}");
    };
    let one = |l: usize, p: Proj| -> Factors { f.iter().filter(|x| x.0 == l && x.1 == p).cloned().collect() };

    let path = dir.path().join("arch.gguf");
    write_gguf(&path, "llama", 8.0, 4, &one(0, Proj::Q));
    expect_invalid(&path, "another architecture", "architecture");

    // A tensor whose base is not a projection of the model.
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", V::String(cfg.architecture.clone()))
        .add_metadata("general.type", V::String("adapter".into()))
        .add_metadata("adapter.type", V::String("lora".into()))
        .add_f32("blk.0.attn_norm.weight.lora_a", &[640, 4], &vec![0.0; 640 * 4])
        .add_f32("blk.0.attn_norm.weight.lora_b", &[4, 640], &vec![0.0; 640 * 4]);
    let path = dir.path().join("names.gguf");
    w.write(&path).unwrap();
    expect_invalid(&path, "unknown base tensor", "matches no projection");

    // Out-of-range layer, wrong shape, rank 0, a lone lora_a.
    for (name, a_dims, b_dims, needle) in [
        ("blk.99.attn_q.weight", [640u64, 4], [4u64, 1024], "matches no projection"),
        ("blk.0.attn_q.weight", [512, 4], [4, 1024], "expected [640, r]"),
        ("blk.0.attn_q.weight", [640, 0], [0, 1024], "is 0"),
    ] {
        let mut w = GgufWriter::new();
        w.add_metadata("general.architecture", V::String(cfg.architecture.clone()))
            .add_metadata("general.type", V::String("adapter".into()))
            .add_metadata("adapter.type", V::String("lora".into()))
            .add_f32(&format!("{name}.lora_a"), &a_dims, &vec![0.0; (a_dims[0] * a_dims[1]) as usize])
            .add_f32(&format!("{name}.lora_b"), &b_dims, &vec![0.0; (b_dims[0] * b_dims[1]) as usize]);
        let path = dir.path().join("bad.gguf");
        w.write(&path).unwrap();
        expect_invalid(&path, name, needle);
    }
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", V::String(cfg.architecture.clone()))
        .add_metadata("general.type", V::String("adapter".into()))
        .add_metadata("adapter.type", V::String("lora".into()))
        .add_f32("blk.0.attn_q.weight.lora_a", &[640, 4], &vec![0.0; 640 * 4]);
    let path = dir.path().join("lone.gguf");
    w.write(&path).unwrap();
    expect_invalid(&path, "lone lora_a", "no matching .lora_b");

    // The model itself is not an adapter; nor is a text file.
    expect_invalid(&model_path(), "a model file", "general.type");
    let path = dir.path().join("garbage.safetensors");
    std::fs::write(&path, b"not an adapter at all").unwrap();
    expect_invalid(&path, "garbage", "adapter_config.json");
    std::fs::write(dir.path().join("adapter_config.json"), r#"{"r": 4, "lora_alpha": 8}"#).unwrap();
    expect_invalid(&path, "garbage with a config", "not a valid safetensors");

    // PEFT: r in the config that does not match the tensors.
    let peft = write_peft(&dir.path().join("peft"), 8.0, 4, &one(1, Proj::Down));
    std::fs::write(peft.with_file_name("adapter_config.json"), r#"{"r": 8, "lora_alpha": 8}"#).unwrap();
    expect_invalid(&peft, "r mismatch", "expected [8, 2048]");

    // Missing file.
    let err = e.load_adapter(&dir.path().join("nope.gguf")).unwrap_err();
    assert_eq!(err.code(), "ERR_MODEL_NOT_FOUND");
    // A bad load-time adapter fails the load.
    let err = engine(vec![(dir.path().join("arch.gguf"), 1.0)]).err().expect("load must fail");
    assert_eq!(err.code(), "ERR_ADAPTER_INVALID");
}

#[test]
fn adapter_logits_do_not_depend_on_the_thread_count() {
    // Prefill (tokens split over the threads) and decode (output columns split) with two
    // adapters on every projection give bit-identical logits on 1, 2 and 3 threads.
    use ruvllm_core::backend::{cpu::CpuBackend, Backend};
    use ruvllm_core::models::{Transformer, WeightLoader};
    let cfg = config();
    let dir = tempfile::tempdir().unwrap();
    let (p1, p2) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
    write_gguf(&p1, &cfg.architecture, ALPHA, RANK, &random_factors(&cfg, RANK, B_SCALE, 11));
    write_gguf(&p2, &cfg.architecture, 4.0, 4, &random_factors(&cfg, 4, B_SCALE, 12));
    let e = engine(vec![]).unwrap();
    let set = AdapterSet::new(vec![(e.load_adapter(&p1).unwrap(), 1.0), (e.load_adapter(&p2).unwrap(), 0.5)]);
    let file = GgufFile::open(model_path()).unwrap();
    let model = Transformer::load(&WeightLoader { file: &file }, cfg, 128).unwrap();
    let tokens: Vec<u32> = [2u32].into_iter().chain((0..20u32).map(|i| 100 + (i * 7919) % 20000)).collect();
    let run = |threads: usize| {
        let mut be = CpuBackend::new(threads);
        model.prepare(&mut be, 512);
        let mut cache = model.new_cache(&be, 128, 64);
        cache.adapters = set.clone();
        model.reserve(&mut be, 64);
        model.forward(&tokens, 0, &mut cache, &mut be).unwrap();
        let mut out = vec![be.logits().to_vec()];
        for i in 0..3u32 {
            model.forward(&[300 + i], tokens.len() + i as usize, &mut cache, &mut be).unwrap();
            out.push(be.logits().to_vec());
        }
        out
    };
    let one = run(1);
    for threads in [2, 3] {
        let other = run(threads);
        for (step, (a, b)) in one.iter().zip(&other).enumerate() {
            assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "{threads} threads, step {step}");
        }
    }
}
