//! The Llama-family forward pass against candle-transformers' quantized llama / qwen2 on tiny
//! synthetic GGUFs that this test writes itself: same file, same tokens, logits compared after
//! a prefill and after one decode step, for several weight types.

use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use candle_transformers::models::{quantized_llama, quantized_qwen2};
use ruvllm_core::backend::cpu::{quant, GgmlType};
use ruvllm_core::backend::{cpu::CpuBackend, Backend};
use ruvllm_core::gguf::writer::GgufWriter;
use ruvllm_core::gguf::{GgufFile, MetadataValue};
use ruvllm_core::kv::KvType;
use ruvllm_core::models::{config_from_gguf, Transformer, WeightLoader};

const VOCAB: usize = 128;
const FF: usize = 512;
const LAYERS: usize = 2;
const PROMPT: [u32; 7] = [1, 17, 42, 99, 5, 63, 127];

/// Width, attention heads and prompt of a synthetic model.
struct Shape {
    d: usize,
    heads: usize,
    kv_heads: usize,
    prompt: Vec<u32>,
}

/// The shape of most tests: 4 query heads on 2 KV heads, a 7-token prompt.
fn small() -> Shape {
    Shape { d: 256, heads: 4, kv_heads: 2, prompt: PROMPT.to_vec() }
}

/// Deterministic pseudo-random weights (xorshift), scaled.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

fn build(arch: &str, ty: GgmlType, tied: bool, sh: &Shape) -> Vec<u8> {
    let (d, heads, kv_heads) = (sh.d, sh.heads, sh.kv_heads);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut w = GgufWriter::new();
    let key = |k: &str| format!("{arch}.{k}");
    w.add_metadata("general.architecture", MetadataValue::String(arch.into()));
    w.add_metadata(&key("context_length"), MetadataValue::U32(256));
    w.add_metadata(&key("embedding_length"), MetadataValue::U32(d as u32));
    w.add_metadata(&key("block_count"), MetadataValue::U32(LAYERS as u32));
    w.add_metadata(&key("feed_forward_length"), MetadataValue::U32(FF as u32));
    w.add_metadata(&key("attention.head_count"), MetadataValue::U32(heads as u32));
    w.add_metadata(&key("attention.head_count_kv"), MetadataValue::U32(kv_heads as u32));
    w.add_metadata(&key("rope.dimension_count"), MetadataValue::U32((d / heads) as u32));
    w.add_metadata(&key("rope.freq_base"), MetadataValue::F32(10000.0));
    w.add_metadata(&key("attention.layer_norm_rms_epsilon"), MetadataValue::F32(1e-5));
    let mut matrix = |w: &mut GgufWriter, name: &str, rows: usize, cols: usize, t: GgmlType| {
        let data = rng.vec(rows * cols, 1.0 / (cols as f32).sqrt() * 1.7);
        let bytes = if t == GgmlType::F32 { data.iter().flat_map(|v| v.to_le_bytes()).collect() } else { quant::quantize(t, &data) };
        w.add_tensor(name, &[cols as u64, rows as u64], t, bytes);
    };
    matrix(&mut w, "token_embd.weight", VOCAB, d, ty);
    if !tied {
        matrix(&mut w, "output.weight", VOCAB, d, ty);
    }
    let hd = d / heads;
    for l in 0..LAYERS {
        let p = |n: &str| format!("blk.{l}.{n}");
        matrix(&mut w, &p("attn_q.weight"), heads * hd, d, ty);
        matrix(&mut w, &p("attn_k.weight"), kv_heads * hd, d, ty);
        matrix(&mut w, &p("attn_v.weight"), kv_heads * hd, d, ty);
        matrix(&mut w, &p("attn_output.weight"), d, heads * hd, ty);
        matrix(&mut w, &p("ffn_gate.weight"), FF, d, ty);
        matrix(&mut w, &p("ffn_up.weight"), FF, d, ty);
        // ffn_down's rows are FF long: fine for every block size.
        matrix(&mut w, &p("ffn_down.weight"), d, FF, ty);
        let mut r2 = Rng(l as u64 * 7919 + 13);
        let norm: Vec<f32> = (0..d).map(|_| 1.0 + 0.2 * r2.next()).collect();
        w.add_f32(&p("attn_norm.weight"), &[d as u64], &norm);
        w.add_f32(&p("ffn_norm.weight"), &[d as u64], &norm);
        if arch == "qwen2" {
            w.add_f32(&p("attn_q.bias"), &[(heads * hd) as u64], &r2.vec(heads * hd, 0.3));
            w.add_f32(&p("attn_k.bias"), &[(kv_heads * hd) as u64], &r2.vec(kv_heads * hd, 0.3));
            w.add_f32(&p("attn_v.bias"), &[(kv_heads * hd) as u64], &r2.vec(kv_heads * hd, 0.3));
        }
    }
    w.add_f32("output_norm.weight", &[d as u64], &vec![1.1; d]);
    w.to_bytes()
}

/// Logits after the prompt and after one more token, from our engine on `threads` threads.
fn ours(bytes: &[u8], prompt: &[u32], threads: usize) -> (Vec<f32>, Vec<f32>) {
    let file = GgufFile::from_bytes(bytes.to_vec(), "synthetic.gguf").expect("our reader accepts the file");
    let cfg = config_from_gguf(&file).expect("config");
    let model = Transformer::load(&WeightLoader { file: &file }, cfg, 128).expect("load");
    // candle keeps keys and values in f32: compare with our exact f32 cache (the default f16
    // cache is checked against llama.cpp, which uses f16 too: tests/gemma3_real.rs).
    let mut be = CpuBackend::new(threads);
    model.reserve(&mut be, prompt.len());
    let mut cache = model.new_cache_typed(&be, 128, prompt.len(), KvType::F32);
    model.forward(prompt, 0, &mut cache, &mut be).expect("prefill");
    let first = be.logits().to_vec();
    model.forward(&[33], prompt.len(), &mut cache, &mut be).expect("decode");
    (first, be.logits().to_vec())
}

/// The same from candle-transformers.
fn candle(arch: &str, bytes: &[u8], prompt: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let dev = Device::Cpu;
    let mut cursor = std::io::Cursor::new(bytes.to_vec());
    let content = gguf_file::Content::read(&mut cursor).expect("candle reads our file");
    let p = Tensor::new(prompt, &dev).unwrap().unsqueeze(0).unwrap();
    let next = Tensor::new(&[[33u32]], &dev).unwrap();
    let flat = |t: Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    if arch == "qwen2" {
        let mut m = quantized_qwen2::ModelWeights::from_gguf(content, &mut cursor, &dev).expect("candle qwen2");
        let a = flat(m.forward(&p, 0).unwrap());
        let b = flat(m.forward(&next, prompt.len()).unwrap());
        (a, b)
    } else {
        let mut m = quantized_llama::ModelWeights::from_gguf(content, &mut cursor, &dev).expect("candle llama");
        let a = flat(m.forward(&p, 0).unwrap());
        let b = flat(m.forward(&next, prompt.len()).unwrap());
        (a, b)
    }
}

fn argmax(v: &[f32]) -> usize {
    v.iter().enumerate().fold(0, |best, (i, &x)| if x > v[best] { i } else { best })
}

fn check(arch: &str, ty: GgmlType, tied: bool, rel_tol: f32) {
    check_shape(arch, ty, tied, rel_tol, &small());
}

fn check_shape(arch: &str, ty: GgmlType, tied: bool, rel_tol: f32, sh: &Shape) {
    let bytes = build(arch, ty, tied, sh);
    let (a1, a2) = ours(&bytes, &sh.prompt, 2);
    let (b1, b2) = candle(arch, &bytes, &sh.prompt);
    compare(arch, ty, rel_tol, (a1, a2), (b1, b2));
}

/// The same file with every tensor dequantized to F32, after checking that our dequantization
/// equals candle's bit for bit.
fn dequantized(bytes: &[u8]) -> Vec<u8> {
    use candle_core::quantized::{GgmlDType, QStorage, QTensor};
    let f = GgufFile::from_bytes(bytes.to_vec(), "synthetic.gguf").unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata.iter() {
        w.add_metadata(k, v.clone());
    }
    for t in f.tensors.iter() {
        let mut vals = vec![0f32; t.n_elements() as usize];
        quant::dequantize(t.dtype, f.tensor_bytes(t), &mut vals);
        let cty = match t.dtype {
            GgmlType::F32 => GgmlDType::F32,
            GgmlType::Q8_0 => GgmlDType::Q8_0,
            other => panic!("add {} to the candle type map", other.name()),
        };
        let storage = QStorage::from_data(std::borrow::Cow::Borrowed(f.tensor_bytes(t)), &Device::Cpu, cty).unwrap();
        let theirs = QTensor::new(storage, (t.n_elements() as usize,)).unwrap();
        let theirs = theirs.dequantize(&Device::Cpu).unwrap().to_vec1::<f32>().unwrap();
        assert!(vals == theirs, "{}: our {} dequantization differs from candle's", t.name, t.dtype.name());
        w.add_f32(&t.name, &t.dims, &vals);
    }
    w.to_bytes()
}

/// For weight types where candle-core 0.11's CPU matmul does not follow ggml's activation
/// quantization (Q8_0: on one 64×256 matmul candle and we differ by 7e-3 while Q4_0/Q4_K agree
/// to 4e-7, and ours is the closer of the two to the f32 product): our quantized forward
/// against candle's forward on the dequantized f32 file. The gap is then our own 8-bit
/// activation error (about 1.5% of the largest logit here), hence the looser tolerance; the
/// dequantization itself is checked to be bit-equal to candle's.
fn check_against_dequantized(arch: &str, ty: GgmlType, tied: bool, rel_tol: f32) {
    let sh = small();
    let bytes = build(arch, ty, tied, &sh);
    let (a1, a2) = ours(&bytes, &sh.prompt, 2);
    let (b1, b2) = candle(arch, &dequantized(&bytes), &sh.prompt);
    compare(arch, ty, rel_tol, (a1, a2), (b1, b2));
}

fn compare(arch: &str, ty: GgmlType, rel_tol: f32, (a1, a2): (Vec<f32>, Vec<f32>), (b1, b2): (Vec<f32>, Vec<f32>)) {
    for (step, a, b) in [("prefill", &a1, &b1), ("decode", &a2, &b2)] {
        assert_eq!(a.len(), VOCAB);
        assert_eq!(b.len(), VOCAB);
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = a.iter().zip(b.iter()).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(scale > 0.1, "{arch} {ty:?}: degenerate logits");
        assert!(diff <= rel_tol * scale, "{arch} {} {step}: max |ours - candle| = {diff} > {rel_tol} × max|logit| {scale}", ty.name());
        assert_eq!(argmax(a), argmax(b), "{arch} {} {step}: argmax differs", ty.name());
    }
}

#[test]
fn llama_f32_matches_candle() {
    check("llama", GgmlType::F32, false, 1e-4);
}

/// Five query heads on one KV head (the attention kernels take four heads per pass, so one
/// chunk of four and one of one) and an 80-token prompt, so decode on two threads takes the
/// split attention path (span >= 64, one KV head): against candle, and decode on one thread
/// (the grouped path) bit for bit.
#[test]
fn llama_five_heads_on_one_kv_head_long_prompt_matches_candle() {
    let sh = Shape { d: 320, heads: 5, kv_heads: 1, prompt: (0..80u32).map(|i| (i * 37 + 11) % VOCAB as u32).collect() };
    check_shape("llama", GgmlType::F32, false, 1e-4, &sh);
    let bytes = build("llama", GgmlType::F32, false, &sh);
    assert_eq!(ours(&bytes, &sh.prompt, 1), ours(&bytes, &sh.prompt, 2), "1 vs 2 threads");
}

#[test]
fn llama_q8_0_matches_candle() {
    check_against_dequantized("llama", GgmlType::Q8_0, false, 3e-2);
}

#[test]
fn llama_q4_0_matches_candle() {
    check("llama", GgmlType::Q4_0, true, 1e-3);
}

#[test]
fn llama_q5_0_matches_candle() {
    check("llama", GgmlType::Q5_0, false, 1e-3);
}

#[test]
fn llama_q4_k_matches_candle() {
    check("llama", GgmlType::Q4_K, false, 1e-2);
}

#[test]
fn llama_q5_k_matches_candle() {
    check("llama", GgmlType::Q5_K, false, 1e-3);
}

#[test]
fn llama_q6_k_matches_candle() {
    check("llama", GgmlType::Q6_K, true, 1e-3);
}

#[test]
fn qwen2_f32_tied_matches_candle() {
    check("qwen2", GgmlType::F32, true, 1e-4);
}

#[test]
fn qwen2_q8_0_matches_candle() {
    check_against_dequantized("qwen2", GgmlType::Q8_0, false, 3e-2);
}
