//! Integration tests with the real all-MiniLM-L6-v2 model (from `RUVLLM_EMBEDDER` or the model
//! cache, which the first use fills; CI fills it with `npx ruvllm models download all-minilm-l6-v2`).

use std::sync::Arc;

use ruvllm_embed::{cosine, discover_model_dir, Adapter, BertEmbedder, BertOptions, Embedder, WeightFormat};

/// all-MiniLM-L6-v2 as published (`embed()`'s space).
fn embedder() -> Arc<dyn Embedder> {
    ruvllm_embed::default_embedder().unwrap_or_else(|e| {
        panic!("the embedding model is required for these tests: {e}\n(get it with `npx ruvllm models download all-minilm-l6-v2` or set RUVLLM_EMBEDDER)")
    })
}

#[test]
fn embeddings_are_unit_length_and_batching_does_not_change_them() {
    let e = embedder();
    assert_eq!(e.dim(), 384);
    let texts = ["fix the login bug", "a much longer sentence about deploying the API service to a Kubernetes cluster with Helm", "hi"];
    let batch = e.embed(&texts).expect("embed");
    for (t, v) in texts.iter().zip(&batch) {
        let n: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((n - 1.0).abs() < 1e-4, "norm {n}");
        // Padding in the batch must not leak into the pooled vector (attention-mask pooling).
        let one = e.embed(&[t]).expect("embed one").pop().expect("one");
        let d = v.iter().zip(&one).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(d < 1e-4, "batch vs single differ by {d} for {t:?}");
    }
}

/// How far f16-stored weights may move an embedding coordinate (unit-norm vectors; measured on
/// the 104 test tasks: see BENCHMARKS.md, routing).
const F16_VS_F32: f32 = 2e-3;
/// The same for bf16 products (weights and layer inputs rounded to bf16): measured 1.2e-3 max,
/// cosine >= 0.99998 on the 104 test tasks.
const BF16_VS_F32: f32 = 3e-3;

/// candle's `BertModel` over given weights with the model's tokenizer (padding off): the
/// reference our forward is checked against.
struct CandleBert {
    model: candle_transformers::models::bert::BertModel,
    tok: tokenizers::Tokenizer,
}

impl CandleBert {
    fn new(dir: &std::path::Path, vb: candle_nn::VarBuilder) -> CandleBert {
        let config: candle_transformers::models::bert::Config = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
        let mut tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
        tok.with_padding(None);
        CandleBert { model: candle_transformers::models::bert::BertModel::load(vb, &config).unwrap(), tok }
    }

    /// Mean over the text's tokens of the last hidden states, L2-normalised.
    fn embed(&self, text: &str) -> Vec<f32> {
        use candle_core::{Device, Tensor};
        let enc = self.tok.encode(text, true).unwrap();
        let ids = Tensor::new(enc.get_ids(), &Device::Cpu).unwrap().unsqueeze(0).unwrap();
        let h = self.model.forward(&ids, &ids.zeros_like().unwrap(), None).unwrap(); // (1, n, 384)
        ruvllm_embed::l2_normalized(h.mean(1).unwrap().squeeze(0).unwrap().to_vec1().unwrap())
    }
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max)
}

/// Our own BERT forward against candle's `BertModel` (masked mean pooling) on the same weights:
/// with f32 panels to f32 rounding, with f16 panels within F16_VS_F32, with the default (bf16
/// products where the CPU has AVX512-BF16, else f16) within the bound of what it runs.
#[test]
fn own_forward_matches_candle_bert() {
    use candle_core::{DType, Device};
    let dir = discover_model_dir().expect("model");
    // SAFETY: read-only mmap of a file nobody modifies during the test.
    let vb = unsafe { candle_nn::VarBuilder::from_mmaped_safetensors(&[dir.join("model.safetensors")], DType::F32, &Device::Cpu) }.unwrap();
    let reference = CandleBert::new(&dir, vb);
    let plain = |weights| BertOptions { weights, ..BertOptions::default() };
    let f32_embedder = BertEmbedder::load(&dir, plain(WeightFormat::F32)).expect("load f32");
    let f16_embedder = BertEmbedder::load(&dir, plain(WeightFormat::F16)).expect("load f16");
    let e = BertEmbedder::load(&dir, plain(WeightFormat::default())).expect("load default");
    let (bound, min_cos) = if ruvllm_embed::bf16_tiles() { (BF16_VS_F32, 0.9999) } else { (F16_VS_F32, 0.99999) };
    for text in ["fix the login bug", "Design a rate limiter for the public API that survives restarts across regions", "hi"] {
        let want = reference.embed(text);
        let max_diff = |got: &[f32]| max_abs_diff(got, &want);
        let d = max_diff(&f32_embedder.embed(&[text]).unwrap()[0]);
        assert!(d < 2e-5, "{text:?}: max |ours (f32) - candle| = {d}");
        let got = f16_embedder.embed(&[text]).unwrap().pop().unwrap();
        let d = max_diff(&got);
        assert!(d < F16_VS_F32, "{text:?}: max |ours (f16 weights) - candle| = {d}");
        assert!(cosine(&got, &want) > 0.99999, "{text:?}: f16 cosine {}", cosine(&got, &want));
        let got = e.embed(&[text]).unwrap().pop().unwrap();
        let d = max_diff(&got);
        assert!(d < bound, "{text:?}: max |ours (default) - candle| = {d}");
        assert!(cosine(&got, &want) > min_cos, "{text:?}: default cosine {}", cosine(&got, &want));
    }
}

/// The routing adapter: our forward over the weights with the adapter added at load time against
/// candle's `BertModel` over the same weights merged here (W + B A), f32 both; and the adapter
/// really changes the embedding against `Adapter::Off`.
#[test]
fn routing_adapter_matches_candle_on_merged_weights() {
    use candle_core::{DType, Device};
    let dir = discover_model_dir().expect("model");
    let mut weights = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
    let adapter_file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/minilm-routing-adapter.safetensors");
    let adapter = candle_core::safetensors::load(&adapter_file, &Device::Cpu).unwrap();
    let mut merged = 0;
    for (name, a) in &adapter {
        let Some(w) = name.strip_suffix(".lora_a") else { continue };
        let b = &adapter[&format!("{w}.lora_b")];
        let key = if weights.contains_key(w) { w.to_string() } else { format!("bert.{w}") };
        let base = weights[&key].to_dtype(DType::F32).unwrap();
        weights.insert(key, (base + b.matmul(a).unwrap()).unwrap());
        merged += 1;
    }
    assert!(merged >= 12, "adapter has {merged} adapted weights");
    let reference = CandleBert::new(&dir, candle_nn::VarBuilder::from_tensors(weights, DType::F32, &Device::Cpu));
    let adapted = BertEmbedder::load(&dir, BertOptions { weights: WeightFormat::F32, adapter: Adapter::Routing, ..BertOptions::default() }).expect("load");
    let off = BertEmbedder::load(&dir, BertOptions { weights: WeightFormat::F32, ..BertOptions::default() }).expect("load");
    assert!(adapted.adapted() && !off.adapted());
    assert_ne!(adapted.id(), off.id(), "a router saved with one must not be loaded with the other");
    for text in ["plan the next sprint", "Write integration tests for the checkout flow", "hi"] {
        let want = reference.embed(text);
        let got = adapted.embed(&[text]).unwrap().pop().unwrap();
        let d = max_abs_diff(&got, &want);
        assert!(d < 2e-5, "{text:?}: max |ours (adapter) - candle (merged)| = {d}");
        let plain = off.embed(&[text]).unwrap().pop().unwrap();
        assert!(cosine(&plain, &got) < 0.999, "{text:?}: the adapter changes nothing ({})", cosine(&plain, &got));
    }
}
