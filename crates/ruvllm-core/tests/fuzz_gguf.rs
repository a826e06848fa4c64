//! In-process fuzzing of everything that reads an untrusted GGUF before any weight is used: the
//! header parser (`GgufFile::from_bytes`) and what `Engine::load` runs next on the parsed file
//! (`config_from_gguf`, `Tokenizer::from_gguf`, `ChatTemplate::from_gguf`, the BOS text).
//!
//! The seed corpus is code, not blobs: synthetic headers written by `GgufWriter` (every value
//! type, nested arrays, alignments, tiny Gemma 3 / Llama / Qwen2 models with tokenizers and chat
//! templates) plus two seeds cut from the real model at run time (its raw header, megabytes of
//! vocabulary; and the same header with every array trimmed, so that execution is cheap and
//! reaches the tokenizer). Each execution takes one seed, applies a few seeded mutations aimed
//! mostly at structure (counts, lengths, type tags, dims, offsets) and runs the load path.
//!
//! Checks per execution: no panic, every error has a code the load path may return and names
//! the file, bounded time, and no single allocation above a limit (a counting allocator). At
//! the end the peak RSS (`VmHWM`) is checked too. Every execution is a pure function of
//! (seed, index), so any failure reproduces with `RUVLLM_FUZZ_ONLY=<index>`.
//!
//! CI runs a short campaign; the full one is
//! `RUVLLM_FUZZ_EXECS=1000000 cargo test -p ruvllm-core --release --test fuzz_gguf -- --nocapture`.
//! Knobs: `RUVLLM_FUZZ_SEED` (default 1), `RUVLLM_FUZZ_THREADS` (default 1),
//! `RUVLLM_FUZZ_SLOW_MS` (default 1000), `RUVLLM_FUZZ_ONLY` (run one execution).

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ruvllm_core::backend::cpu::GgmlType;
use ruvllm_core::chat::ChatTemplate;
use ruvllm_core::gguf::writer::GgufWriter;
use ruvllm_core::gguf::{GgufFile, MetadataValue as V};
use ruvllm_core::models::config_from_gguf;
use ruvllm_core::tokenizer::Tokenizer;
use ruvllm_core::Error;

// ---------------------------------------------------------------------------------------------
// Allocation tracking: the largest single allocation of the current execution, per thread. A
// parser that sizes a buffer from an untrusted count shows up here long before it exhausts RAM.
// ---------------------------------------------------------------------------------------------

struct Counting;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note_alloc(size: usize) {
    // `try_with`: allocations during thread teardown must not touch a destroyed slot.
    let _ = LARGEST.try_with(|l| {
        if size > l.get() {
            l.set(size);
        }
    });
}

// SAFETY: every call is forwarded unchanged to the system allocator; the bookkeeping only reads
// the requested size and never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: AllocLayout) -> *mut u8 {
        note_alloc(layout.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: AllocLayout) -> *mut u8 {
        note_alloc(layout.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: AllocLayout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: AllocLayout, new_size: usize) -> *mut u8 {
        note_alloc(new_size);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

// ---------------------------------------------------------------------------------------------
// Deterministic randomness.
// ---------------------------------------------------------------------------------------------

/// xorshift64*, seeded through splitmix64 so that neighbouring indexes give unrelated streams.
struct Rng(u64);

impl Rng {
    fn for_exec(seed: u64, index: u64) -> Self {
        let mut z = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        (!items.is_empty()).then(|| &items[self.below(items.len())])
    }
}

// ---------------------------------------------------------------------------------------------
// Structure of a seed: where the fields a mutation should aim at lie.
// ---------------------------------------------------------------------------------------------

/// Field classes. Mutations pick a class first, then a field of it, so that the real header's
/// 262,144 token-length fields do not drown its dozen counts and type tags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Version, tensor count, metadata count.
    Preamble,
    KeyLen,
    ValueType,
    ArrayType,
    ArrayLen,
    StrLen,
    ElemStrLen,
    IntValue,
    NameLen,
    NDims,
    Dim,
    TensorType,
    TensorOffset,
}

const KINDS: [Kind; 13] = [
    Kind::Preamble,
    Kind::KeyLen,
    Kind::ValueType,
    Kind::ArrayType,
    Kind::ArrayLen,
    Kind::StrLen,
    Kind::ElemStrLen,
    Kind::IntValue,
    Kind::NameLen,
    Kind::NDims,
    Kind::Dim,
    Kind::TensorType,
    Kind::TensorOffset,
];

#[derive(Clone, Copy, Debug)]
struct Spot {
    at: usize,
    width: usize,
}

/// A top-level metadata entry; `cut` is where its array value's first `keep` elements end.
struct Entry {
    range: Range<usize>,
    array: Option<ArrayCut>,
}

struct ArrayCut {
    len_at: usize,
    len: u64,
    cut: usize,
}

#[derive(Default)]
struct Layout {
    spots: Vec<Vec<Spot>>,
    /// Metadata entries and tensor entries, as byte ranges (for duplication, deletion, splices).
    kvs: Vec<Entry>,
    tensors: Vec<Range<usize>>,
    /// Contents of strings (for UTF-8 damage), at most a few thousand.
    strings: Vec<Range<usize>>,
    /// Where the tensor entries start and end (the end is the unpadded data offset).
    tensor_infos: Range<usize>,
}

impl Layout {
    fn of(&self, kind: Kind) -> &[Spot] {
        &self.spots[kind as usize]
    }
}

/// Walks a GGUF header the way the parser does, recording every field, and stops quietly at the
/// first thing that does not parse (a seed is valid, so that only happens for foreign bytes).
/// Arrays at the top level remember where their first `keep` elements end.
fn walk(bytes: &[u8], keep: u64) -> Layout {
    let mut w = Walker { b: bytes, pos: 0, keep, layout: Layout { spots: vec![Vec::new(); KINDS.len()], ..Default::default() } };
    let _ = w.header();
    w.layout
}

struct Walker<'a> {
    b: &'a [u8],
    pos: usize,
    keep: u64,
    layout: Layout,
}

impl Walker<'_> {
    fn note(&mut self, kind: Kind, width: usize) {
        self.layout.spots[kind as usize].push(Spot { at: self.pos, width });
    }
    fn skip(&mut self, n: u64) -> Option<()> {
        let end = (self.pos as u64).checked_add(n).filter(|&e| e <= self.b.len() as u64)?;
        self.pos = end as usize;
        Some(())
    }
    fn u32(&mut self) -> Option<u32> {
        let v = u32::from_le_bytes(self.b.get(self.pos..self.pos + 4)?.try_into().ok()?);
        self.pos += 4;
        Some(v)
    }
    fn u64(&mut self) -> Option<u64> {
        let v = u64::from_le_bytes(self.b.get(self.pos..self.pos + 8)?.try_into().ok()?);
        self.pos += 8;
        Some(v)
    }
    fn string(&mut self, kind: Kind) -> Option<()> {
        self.note(kind, 8);
        let n = self.u64()?;
        let start = self.pos;
        self.skip(n)?;
        if self.layout.strings.len() < 4096 && n > 0 {
            self.layout.strings.push(start..self.pos);
        }
        Some(())
    }
    fn header(&mut self) -> Option<()> {
        self.skip(4)?;
        for width in [4, 8, 8] {
            self.note(Kind::Preamble, width);
            self.skip(width as u64)?;
        }
        let n_tensors = u64::from_le_bytes(self.b.get(8..16)?.try_into().ok()?);
        let n_kv = u64::from_le_bytes(self.b.get(16..24)?.try_into().ok()?);
        for _ in 0..n_kv {
            let start = self.pos;
            self.string(Kind::KeyLen)?;
            self.note(Kind::ValueType, 4);
            let ty = self.u32()?;
            let array = self.value(ty, 0)?;
            self.layout.kvs.push(Entry { range: start..self.pos, array });
        }
        self.layout.tensor_infos = self.pos..self.pos;
        for _ in 0..n_tensors {
            let start = self.pos;
            self.string(Kind::NameLen)?;
            self.note(Kind::NDims, 4);
            let n_dims = self.u32()?;
            for _ in 0..n_dims.min(8) {
                self.note(Kind::Dim, 8);
                self.u64()?;
            }
            self.note(Kind::TensorType, 4);
            self.u32()?;
            self.note(Kind::TensorOffset, 8);
            self.u64()?;
            self.layout.tensors.push(start..self.pos);
            self.layout.tensor_infos.end = self.pos;
        }
        Some(())
    }
    /// Skips one value; for a top-level array, returns where its first `keep` elements end.
    fn value(&mut self, ty: u32, depth: usize) -> Option<Option<ArrayCut>> {
        let scalar = |w: &mut Self, width: usize, int: bool| {
            if int && depth == 0 {
                w.note(Kind::IntValue, width);
            }
            w.skip(width as u64)
        };
        match ty {
            0 | 1 => scalar(self, 1, true)?,
            7 => scalar(self, 1, false)?,
            2 | 3 => scalar(self, 2, true)?,
            4 | 5 => scalar(self, 4, true)?,
            6 => scalar(self, 4, false)?,
            10 | 11 => scalar(self, 8, true)?,
            12 => scalar(self, 8, false)?,
            8 => self.string(if depth == 0 { Kind::StrLen } else { Kind::ElemStrLen })?,
            9 if depth < 8 => {
                self.note(Kind::ArrayType, 4);
                let elem = self.u32()?;
                let len_at = self.pos;
                self.note(Kind::ArrayLen, 8);
                let len = self.u64()?;
                let mut cut = None;
                for i in 0..len {
                    if i == self.keep {
                        cut = Some(self.pos);
                    }
                    self.value(elem, depth + 1)?;
                }
                if depth == 0 {
                    return Some(Some(ArrayCut { len_at, len, cut: cut.unwrap_or(self.pos) }));
                }
            }
            _ => return None,
        }
        Some(None)
    }
}

// ---------------------------------------------------------------------------------------------
// The seed corpus, written by code.
// ---------------------------------------------------------------------------------------------

struct Seed {
    name: String,
    bytes: Vec<u8>,
    layout: Layout,
    /// Zero bytes appended at run time, standing in for a tensor data section that is not copied
    /// (the real model's 250 MB: `vec![0; n]` maps zero pages that are never touched).
    pad: usize,
    /// The share of executions (per mille) that use this seed.
    per_mille: u32,
    /// Run the load path past the parser only on every `deep_every`-th execution of this seed
    /// (the raw real header holds 262,144 tokens: building its tokenizer costs a second).
    deep_every: u64,
}

fn strings(items: &[&str]) -> V {
    V::Array(items.iter().map(|s| V::String((*s).to_string())).collect())
}

/// Zeroed bytes for a tensor of `dims` and `dtype` (the parser only checks sizes).
fn zeros(dims: &[u64], dtype: GgmlType) -> Vec<u8> {
    let n: u64 = dims.iter().product();
    vec![0; dtype.bytes_for(n).unwrap_or(0) as usize]
}

fn add_zero_tensor(w: &mut GgufWriter, name: &str, dims: &[u64], dtype: GgmlType) {
    w.add_tensor(name, dims, dtype, zeros(dims, dtype));
}

/// `general.architecture` and the `{arch}.*` keys of a model.
fn arch_keys(w: &mut GgufWriter, arch: &str, keys: &[(&str, V)]) {
    w.add_metadata("general.architecture", V::String(arch.into()));
    for (k, v) in keys {
        w.add_metadata(&format!("{arch}.{k}"), v.clone());
    }
}

/// A SentencePiece vocabulary like Gemma's: specials, byte tokens, pieces and their merges.
fn spm_tokenizer(w: &mut GgufWriter, with_template: Option<&str>) -> usize {
    let mut tokens: Vec<String> = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<mask>"].iter().map(|s| s.to_string()).collect();
    let mut types = vec![3i32, 3, 3, 2, 3, 3, 4];
    for b in [0x0Au8, 0x20, 0x41, 0xC3, 0xE2] {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    for p in ["▁", "h", "e", "l", "o", "he", "ll", "hell", "hello", "▁hello", "w", "r", "d", "▁w", "or", "ld", "world", "▁world", "é", ""] {
        tokens.push(p.to_string());
        types.push(1);
    }
    let n = tokens.len();
    w.add_metadata("tokenizer.ggml.model", V::String("llama".into()));
    w.add_metadata("tokenizer.ggml.tokens", V::Array(tokens.into_iter().map(V::String).collect()));
    w.add_metadata("tokenizer.ggml.scores", V::Array((0..n).map(|i| V::F32(-(i as f32) / 4.0)).collect()));
    w.add_metadata("tokenizer.ggml.token_type", V::Array(types.into_iter().map(V::I32).collect()));
    w.add_metadata("tokenizer.ggml.bos_token_id", V::U32(2));
    w.add_metadata("tokenizer.ggml.eos_token_id", V::U32(1));
    w.add_metadata("tokenizer.ggml.unknown_token_id", V::U32(3));
    w.add_metadata("tokenizer.ggml.padding_token_id", V::U32(0));
    w.add_metadata("tokenizer.ggml.eot_token_id", V::I32(5));
    w.add_metadata("tokenizer.ggml.add_bos_token", V::Bool(true));
    w.add_metadata("tokenizer.ggml.add_eos_token", V::Bool(false));
    w.add_metadata("tokenizer.ggml.add_space_prefix", V::U8(0));
    if let Some(t) = with_template {
        w.add_metadata("tokenizer.chat_template", V::String(t.into()));
    }
    n
}

const GEMMA_TEMPLATE: &str = "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}{% set role = 'model' %}\
{% else %}{% set role = m['role'] %}{% endif %}<start_of_turn>{{ role }}\n{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}\
{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}";

const CHATML_TEMPLATE: &str = "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\
{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/// Tiny model headers and files with every kind of metadata and tensor entry.
fn synthetic_seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();

    // Every value type, nested and empty arrays, odd strings, every tensor type.
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", V::String("llama".into()))
        .add_metadata("t.u8", V::U8(7))
        .add_metadata("t.i8", V::I8(-7))
        .add_metadata("t.u16", V::U16(65535))
        .add_metadata("t.i16", V::I16(-2))
        .add_metadata("t.u32", V::U32(4_000_000_000))
        .add_metadata("t.i32", V::I32(-1))
        .add_metadata("t.u64", V::U64(u64::MAX))
        .add_metadata("t.i64", V::I64(i64::MIN))
        .add_metadata("t.f32", V::F32(f32::NAN))
        .add_metadata("t.f64", V::F64(-0.0))
        .add_metadata("t.bool", V::Bool(true))
        .add_metadata("t.str", V::String("héllo ▁ \u{0}".into()))
        .add_metadata("t.empty_str", V::String(String::new()))
        .add_metadata("t.empty_arr", V::Array(vec![]))
        .add_metadata("t.bools", V::Array(vec![V::Bool(false), V::Bool(true)]))
        .add_metadata("t.u16s", V::Array(vec![V::U16(1), V::U16(2), V::U16(3)]))
        .add_metadata("t.f64s", V::Array(vec![V::F64(1.5), V::F64(f64::INFINITY)]))
        .add_metadata("t.strs", strings(&["a", "", "ßç"]))
        .add_metadata("t.nested", V::Array(vec![V::Array(vec![V::I64(1), V::I64(2)]), V::Array(vec![V::I64(3)])]))
        .add_metadata("t.deep", V::Array(vec![V::Array(vec![V::Array(vec![strings(&["x", "y"])])])]));
    for (i, (dtype, dims)) in [
        (GgmlType::F32, vec![4u64, 2]),
        (GgmlType::F16, vec![8]),
        (GgmlType::BF16, vec![2, 2, 2, 2]),
        (GgmlType::Q4_0, vec![32, 2]),
        (GgmlType::Q4_1, vec![32]),
        (GgmlType::Q5_0, vec![32]),
        (GgmlType::Q5_1, vec![64, 1, 1]),
        (GgmlType::Q8_0, vec![32, 3]),
        (GgmlType::Q8_1, vec![32]),
        (GgmlType::Q2_K, vec![256]),
        (GgmlType::Q3_K, vec![256]),
        (GgmlType::Q4_K, vec![256, 2]),
        (GgmlType::Q5_K, vec![256]),
        (GgmlType::Q6_K, vec![256]),
        (GgmlType::Q8_K, vec![256]),
        (GgmlType::IQ4_NL, vec![32, 2]),
        (GgmlType::IQ4_XS, vec![256]),
    ]
    .into_iter()
    .enumerate()
    {
        add_zero_tensor(&mut w, &format!("t{i}.{}", dtype.name()), &dims, dtype);
    }
    out.push(("all-types".to_string(), w.to_bytes()));

    // Alignments other than the default.
    for align in [1u64, 64, 4096] {
        let mut w = GgufWriter::new();
        w.alignment = align;
        w.add_metadata("general.name", V::String(format!("aligned {align}")));
        w.add_f32("a", &[3], &[1.0, 2.0, 3.0]).add_f32("b", &[1, 5], &[0.0; 5]);
        add_zero_tensor(&mut w, "c", &[32, 4], GgmlType::Q8_0);
        out.push((format!("align-{align}"), w.to_bytes()));
    }

    // A tiny Gemma 3: config keys, SentencePiece tokenizer, chat template.
    let mut w = GgufWriter::new();
    arch_keys(
        &mut w,
        "gemma3",
        &[
            ("block_count", V::U32(2)),
            ("embedding_length", V::U32(64)),
            ("feed_forward_length", V::U32(128)),
            ("attention.head_count", V::U32(2)),
            ("attention.head_count_kv", V::U32(1)),
            ("attention.key_length", V::U32(32)),
            ("attention.value_length", V::U32(32)),
            ("attention.sliding_window", V::U32(16)),
            ("attention.layer_norm_rms_epsilon", V::F32(1e-6)),
            ("context_length", V::U64(256)),
            ("rope.freq_base", V::F32(1e6)),
            ("rope.scaling.type", V::String("linear".into())),
            ("rope.scaling.factor", V::F32(8.0)),
        ],
    );
    w.add_metadata("general.name", V::String("tiny gemma".into()));
    w.add_metadata("general.file_type", V::U32(15));
    let vocab = spm_tokenizer(&mut w, Some(GEMMA_TEMPLATE)) as u64;
    add_zero_tensor(&mut w, "token_embd.weight", &[64, vocab], GgmlType::Q8_0);
    add_zero_tensor(&mut w, "output_norm.weight", &[64], GgmlType::F32);
    add_zero_tensor(&mut w, "blk.0.attn_q.weight", &[256, 64], GgmlType::Q4_K);
    out.push(("gemma3-tiny".to_string(), w.to_bytes()));

    // A tiny Llama with SentencePiece and no template.
    let mut w = GgufWriter::new();
    arch_keys(
        &mut w,
        "llama",
        &[
            ("block_count", V::U64(1)),
            ("embedding_length", V::U64(32)),
            ("feed_forward_length", V::U64(64)),
            ("attention.head_count", V::U64(4)),
            ("rope.dimension_count", V::U64(8)),
            ("context_length", V::U32(128)),
            ("rope.freq_base", V::F64(500000.0)),
        ],
    );
    let vocab = spm_tokenizer(&mut w, None) as u64;
    add_zero_tensor(&mut w, "token_embd.weight", &[32, vocab], GgmlType::F16);
    add_zero_tensor(&mut w, "output.weight", &[32, vocab], GgmlType::Q8_0);
    out.push(("llama-tiny".to_string(), w.to_bytes()));

    // A tiny Qwen2 with a byte-level BPE tokenizer, merges and a ChatML template.
    let mut w = GgufWriter::new();
    arch_keys(
        &mut w,
        "qwen2",
        &[
            ("block_count", V::U32(1)),
            ("embedding_length", V::U32(32)),
            ("feed_forward_length", V::U32(96)),
            ("attention.head_count", V::U32(2)),
            ("attention.head_count_kv", V::U32(2)),
            ("context_length", V::U32(512)),
        ],
    );
    let toks = [
        "!",
        "h",
        "e",
        "l",
        "o",
        "Ġ",
        "w",
        "r",
        "d",
        "he",
        "ll",
        "hell",
        "hello",
        "Ġw",
        "or",
        "Ġwor",
        "ld",
        "Ġworld",
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
    ];
    let mut types = vec![1i32; toks.len()];
    types[toks.len() - 3..].iter_mut().for_each(|t| *t = 3);
    w.add_metadata("tokenizer.ggml.model", V::String("gpt2".into()));
    w.add_metadata("tokenizer.ggml.pre", V::String("qwen2".into()));
    w.add_metadata("tokenizer.ggml.tokens", strings(&toks));
    w.add_metadata("tokenizer.ggml.token_type", V::Array(types.into_iter().map(V::I32).collect()));
    w.add_metadata("tokenizer.ggml.merges", strings(&["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "bad"]));
    w.add_metadata("tokenizer.ggml.bos_token_id", V::I32(-1));
    w.add_metadata("tokenizer.ggml.eos_token_id", V::U32(20));
    w.add_metadata("tokenizer.ggml.padding_token_id", V::U32(20));
    w.add_metadata("tokenizer.ggml.add_bos_token", V::Bool(false));
    w.add_metadata("tokenizer.chat_template", V::String(CHATML_TEMPLATE.into()));
    add_zero_tensor(&mut w, "token_embd.weight", &[32, toks.len() as u64], GgmlType::BF16);
    add_zero_tensor(&mut w, "blk.0.attn_q.bias", &[32], GgmlType::F32);
    out.push(("qwen2-tiny".to_string(), w.to_bytes()));

    // Version 2 (same layout, older version number), and an empty file of each version.
    let mut v2 = out[0].1.clone();
    v2[4..8].copy_from_slice(&2u32.to_le_bytes());
    out.push(("version-2".to_string(), v2));
    out.push(("empty".to_string(), GgufWriter::new().to_bytes()));
    out
}

/// The real model's raw header (everything before the tensor data) and the same header with
/// every array cut to its first `KEEP` elements; both padded at run time to the real file size.
fn real_seeds() -> Vec<Seed> {
    const KEEP: u64 = 512;
    let path = ruvllm_models::real_test_model().unwrap_or_else(|e| panic!("{e}"));
    let (data_offset, file_len) = {
        let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or_else(|e| panic!("{e}"));
        (f.data_offset as usize, len as usize)
    };
    let mut raw = vec![0u8; data_offset];
    {
        use std::io::Read;
        let mut file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{e}"));
        file.read_exact(&mut raw).unwrap_or_else(|e| panic!("{e}"));
    }
    let pad = file_len - data_offset;
    let layout = walk(&raw, KEEP);
    assert!(!layout.tensors.is_empty(), "the walker understood the real header");

    // Trimmed: the preamble, each metadata entry (arrays cut), the tensor entries verbatim.
    let mut trimmed = raw[..24].to_vec();
    for e in &layout.kvs {
        match &e.array {
            Some(a) if a.len > KEEP => {
                trimmed.extend_from_slice(&raw[e.range.start..a.len_at]);
                trimmed.extend_from_slice(&KEEP.to_le_bytes());
                trimmed.extend_from_slice(&raw[a.len_at + 8..a.cut]);
            }
            _ => trimmed.extend_from_slice(&raw[e.range.clone()]),
        }
    }
    trimmed.extend_from_slice(&raw[layout.tensor_infos.clone()]);
    let trimmed_layout = walk(&trimmed, KEEP);
    vec![
        Seed { name: "real-header".into(), bytes: raw, layout, pad, per_mille: 2, deep_every: 25 },
        Seed { name: "real-trimmed".into(), bytes: trimmed, layout: trimmed_layout, pad, per_mille: 150, deep_every: 1 },
    ]
}

fn all_seeds() -> Vec<Seed> {
    let mut seeds = real_seeds();
    let synthetic = synthetic_seeds();
    let left = 1000 - seeds.iter().map(|s| s.per_mille).sum::<u32>();
    let each = left / synthetic.len() as u32;
    let n = synthetic.len();
    for (i, (name, bytes)) in synthetic.into_iter().enumerate() {
        // The last seed takes the rounding remainder so that the shares add up to 1000.
        let per_mille = if i + 1 == n { left - each * (n as u32 - 1) } else { each };
        let layout = walk(&bytes, u64::MAX);
        seeds.push(Seed { name, bytes, layout, pad: 0, per_mille, deep_every: 1 });
    }
    seeds
}

// ---------------------------------------------------------------------------------------------
// Mutations.
// ---------------------------------------------------------------------------------------------

/// Values that break length and count checks: zero, one, sign and width boundaries, sizes around
/// the end of the input, and the field's own value nudged.
fn boundary_value(rng: &mut Rng, old: u64, at: usize, len: usize) -> u64 {
    let left = len.saturating_sub(at) as u64;
    let candidates = [
        0,
        1,
        2,
        3,
        4,
        7,
        8,
        13,
        31,
        32,
        62,
        64,
        255,
        256,
        0x7FFF_FFFF,
        0x8000_0000,
        u32::MAX as u64,
        u32::MAX as u64 + 1,
        i64::MAX as u64,
        1 << 63,
        u64::MAX,
        u64::MAX - 7,
        old.wrapping_add(1),
        old.wrapping_sub(1),
        old.wrapping_mul(2),
        old / 2,
        old.wrapping_add(1 << 32),
        left,
        left + 1,
        left / 8,
        left / 8 + 1,
        len as u64,
        len as u64 + 1,
        rng.next(),
        rng.next() % 1024,
    ];
    candidates[rng.below(candidates.len())]
}

fn read_le(bytes: &[u8], at: usize, width: usize) -> u64 {
    let mut b = [0u8; 8];
    let end = (at + width).min(bytes.len());
    if at < end {
        b[..end - at].copy_from_slice(&bytes[at..end]);
    }
    u64::from_le_bytes(b)
}

fn write_le(bytes: &mut [u8], at: usize, width: usize, v: u64) {
    for (i, b) in v.to_le_bytes().iter().take(width).enumerate() {
        if let Some(slot) = bytes.get_mut(at + i) {
            *slot = *b;
        }
    }
}

/// A field of the seed, chosen by class first.
fn pick_spot(rng: &mut Rng, layout: &Layout) -> Option<Spot> {
    let kind = KINDS[rng.below(KINDS.len())];
    let spots = layout.of(kind);
    if spots.is_empty() {
        // Fall back to any class that has fields.
        let nonempty: Vec<&Vec<Spot>> = layout.spots.iter().filter(|s| !s.is_empty()).collect();
        return rng.pick(&nonempty).and_then(|s| rng.pick(s)).copied();
    }
    rng.pick(spots).copied()
}

/// Applies one mutation; returns its name (for failure reports).
fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>, layout: &Layout, pad: usize, others: &[Seed]) -> &'static str {
    let len = bytes.len();
    // Lengths just past the end: of the header, or of the whole input where data follows it.
    let end = if pad > 0 && rng.chance(50) { len + pad } else { len };
    match rng.below(16) {
        0..=3 => {
            let Some(s) = pick_spot(rng, layout) else { return "none" };
            let old = read_le(bytes, s.at, s.width);
            let v = boundary_value(rng, old, s.at, end);
            write_le(bytes, s.at, s.width, v);
            "field boundary"
        }
        4 => {
            // Type tags: neighbours, unknown ids and all-ones.
            let kind = *rng.pick(&[Kind::ValueType, Kind::ArrayType, Kind::TensorType]).unwrap_or(&Kind::ValueType);
            let Some(s) = rng.pick(layout.of(kind)).copied() else { return "none" };
            let v = match rng.below(4) {
                0 => rng.below(14) as u64,
                1 => rng.below(40) as u64,
                2 => read_le(bytes, s.at, 4) ^ 1,
                _ => u32::MAX as u64,
            };
            write_le(bytes, s.at, 4, v);
            "type tag"
        }
        5 => {
            // Small integers in metadata values: the config's layer, head and size counts.
            let Some(s) = rng.pick(layout.of(Kind::IntValue)).copied() else { return "none" };
            let v = if rng.chance(70) { rng.below(70) as u64 } else { boundary_value(rng, read_le(bytes, s.at, s.width), s.at, end) };
            write_le(bytes, s.at, s.width, v);
            "int value"
        }
        6 => {
            // Tensor placement: misaligned offsets and dims whose product overflows.
            if rng.chance(50) {
                let Some(s) = rng.pick(layout.of(Kind::TensorOffset)).copied() else { return "none" };
                let old = read_le(bytes, s.at, 8);
                let v = match rng.below(3) {
                    0 => old + 1 + rng.below(31) as u64,
                    1 => old.wrapping_sub(rng.below(64) as u64 + 1),
                    _ => u64::MAX - rng.below(4096) as u64,
                };
                write_le(bytes, s.at, 8, v);
                "tensor offset"
            } else {
                let Some(s) = rng.pick(layout.of(Kind::Dim)).copied() else { return "none" };
                let v = *rng.pick(&[0, 1 << 32, 1 << 31, 1 << 62, i64::MAX as u64, u64::MAX, 3, 255, 257]).unwrap_or(&0);
                write_le(bytes, s.at, 8, v);
                "dims"
            }
        }
        7 => {
            // Bit flips, half of the time next to a field.
            let base = if rng.chance(50) { pick_spot(rng, layout).map_or(0, |s| s.at) } else { rng.below(len.max(1)) };
            for _ in 0..1 + rng.below(4) {
                let at = (base + rng.below(16)).min(len.saturating_sub(1));
                if let Some(b) = bytes.get_mut(at) {
                    *b ^= 1 << rng.below(8);
                }
            }
            "bit flip"
        }
        8 => {
            let at = rng.below(len.max(1));
            let v = *rng.pick(&[0x00u8, 0xFF, 0x7F, 0x80, 0x01]).unwrap_or(&0);
            let n = 1 + rng.below(8);
            for b in bytes.iter_mut().skip(at).take(n) {
                *b = v;
            }
            "byte overwrite"
        }
        9 => {
            // Truncation inside a field, at an entry boundary, or anywhere.
            let at = match rng.below(3) {
                0 => pick_spot(rng, layout).map_or(0, |s| s.at + rng.below(s.width + 1)),
                1 => rng.pick(&layout.kvs).map_or(0, |e| e.range.end),
                _ => rng.below(len + 1),
            };
            bytes.truncate(at);
            "truncate"
        }
        10 | 11 => {
            // Duplicate an entry (or a random chunk) in place; half of the time bump its count.
            let (range, count_at) = match rng.below(3) {
                0 => (rng.pick(&layout.kvs).map(|e| e.range.clone()), 16),
                1 => (rng.pick(&layout.tensors).cloned(), 8),
                _ => {
                    let a = rng.below(len.max(1));
                    (Some(a..(a + 1 + rng.below(64)).min(len)), 16)
                }
            };
            let Some(r) = range.filter(|r| r.end <= len) else { return "none" };
            let chunk = bytes[r.clone()].to_vec();
            bytes.splice(r.end..r.end, chunk);
            if rng.chance(50) {
                let c = read_le(bytes, count_at, 8);
                write_le(bytes, count_at, 8, c + 1);
            }
            "duplicate"
        }
        12 => {
            // Delete an entry; half of the time also lower the count.
            let (range, count_at) = if rng.chance(60) { (rng.pick(&layout.kvs).map(|e| e.range.clone()), 16) } else { (rng.pick(&layout.tensors).cloned(), 8) };
            let Some(r) = range.filter(|r| r.end <= len) else { return "none" };
            bytes.drain(r);
            if rng.chance(50) {
                let c = read_le(bytes, count_at, 8);
                write_le(bytes, count_at, 8, c.wrapping_sub(1));
            }
            "delete"
        }
        13 => {
            // Splice a chunk of another seed over or into this one.
            let Some(other) = rng.pick(others) else { return "none" };
            let src = &other.bytes;
            if src.is_empty() {
                return "none";
            }
            let a = match rng.pick(&other.layout.kvs) {
                Some(e) if rng.chance(50) => e.range.clone(),
                _ => {
                    let a = rng.below(src.len());
                    a..(a + 1 + rng.below(128)).min(src.len())
                }
            };
            let chunk = src[a].to_vec();
            let at = rng.below(len + 1);
            if rng.chance(50) {
                bytes.splice(at..at, chunk);
            } else {
                let end = (at + chunk.len()).min(len);
                bytes.splice(at..end, chunk);
            }
            "splice"
        }
        14 => {
            // Invalid UTF-8 in a key, a name or a string value.
            let Some(r) = rng.pick(&layout.strings).cloned() else { return "none" };
            let at = r.start + rng.below(r.len().max(1));
            if let Some(b) = bytes.get_mut(at) {
                *b = *rng.pick(&[0xFFu8, 0xC0, 0x80, 0xED]).unwrap_or(&0xFF);
            }
            "utf-8"
        }
        _ => {
            let at = rng.below(len + 1);
            let n = 1 + rng.below(16);
            let junk: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            bytes.splice(at..at, junk);
            "insert"
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One execution.
// ---------------------------------------------------------------------------------------------

const FILE_NAME: &str = "fuzz.gguf";

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Stage {
    Parse,
    Config,
    Tokenizer,
    Template,
}

/// Codes each stage may return for a bad file.
fn allowed(stage: Stage) -> &'static [&'static str] {
    match stage {
        Stage::Parse => &["ERR_GGUF_INVALID"],
        Stage::Config | Stage::Tokenizer => &["ERR_GGUF_INVALID", "ERR_MODEL_UNSUPPORTED"],
        Stage::Template => &["ERR_GGUF_INVALID", "ERR_CHAT_TEMPLATE"],
    }
}

/// What one execution did: (stage, "ok" or the error code), and anything wrong with its errors.
#[derive(Default)]
struct Outcome {
    results: Vec<(Stage, &'static str)>,
    problems: Vec<String>,
    /// The largest single allocation and the stage that made it.
    largest: (usize, Option<Stage>),
}

impl Outcome {
    fn record<T>(&mut self, stage: Stage, r: &Result<T, Error>) {
        let largest = LARGEST.with(|l| l.replace(0));
        if largest > self.largest.0 {
            self.largest = (largest, Some(stage));
        }
        match r {
            Ok(_) => self.results.push((stage, "ok")),
            Err(e) => {
                let code = e.code();
                self.results.push((stage, code));
                if !allowed(stage).contains(&code) {
                    self.problems.push(format!("{stage:?} returned {code}, which it should not: {e}"));
                }
                let msg = e.to_string();
                if matches!(e, Error::GgufInvalid { .. } | Error::Unsupported { .. }) && !msg.contains(FILE_NAME) {
                    self.problems.push(format!("{stage:?}: the message does not name the file: {msg}"));
                }
            }
        }
    }
}

/// The load path of `Engine::load` up to the weights, each stage run even when the previous one
/// failed (as long as the file parsed), so that a bad config does not hide the tokenizer.
fn load_path(bytes: Vec<u8>, deep: bool) -> Outcome {
    let mut out = Outcome::default();
    let file = GgufFile::from_bytes(bytes, FILE_NAME);
    out.record(Stage::Parse, &file);
    let Ok(file) = file else { return out };
    let cfg = config_from_gguf(&file);
    out.record(Stage::Config, &cfg);
    if !deep {
        return out;
    }
    if file.tensors.len() < 64 {
        // What `ruvllm inspect` and the server's model listing print (skipped for the megabyte
        // vocabulary of the raw real header: it is the same walk over the same values).
        let _ = file.metadata_json();
    }
    let tok = Tokenizer::from_gguf(&file);
    out.record(Stage::Tokenizer, &tok);
    let Ok(tok) = tok else { return out };
    let template = ChatTemplate::from_gguf(&file, &tok);
    out.record(Stage::Template, &template);
    // Engine::load: the BOS text, then (after the weights) prompts are encoded.
    let _ = tok.bos_id().and_then(|b| tok.decode(&[b], false).ok());
    let _ = tok.encode("hello <start_of_turn>wörld\n<|im_end|>", true, true);
    out
}

/// The bytes an execution runs on, and how it was made.
struct Input {
    seed: usize,
    bytes: Vec<u8>,
    ops: Vec<&'static str>,
    deep: bool,
    /// Append the seed's zero padding (not for the truncation sweep: there the file ends).
    pad: bool,
}

fn make_input(seeds: &[Seed], base_seed: u64, index: u64) -> Input {
    let mut rng = Rng::for_exec(base_seed, index);
    let mut roll = rng.below(1000) as u32;
    let mut seed = 0;
    for (i, s) in seeds.iter().enumerate() {
        if roll < s.per_mille {
            seed = i;
            break;
        }
        roll -= s.per_mille;
    }
    let s = &seeds[seed];
    let mut bytes = s.bytes.clone();
    let mut ops = Vec::new();
    // One to four mutations, fewer more often.
    let n = [1, 1, 1, 1, 2, 2, 3, 4][rng.below(8)];
    for _ in 0..n {
        ops.push(mutate(&mut rng, &mut bytes, &s.layout, s.pad, seeds));
    }
    let deep = index.is_multiple_of(s.deep_every);
    Input { seed, bytes, ops, deep, pad: true }
}

/// Executions numbered from here on are the truncation sweep, not random mutations.
const SWEEP: u64 = 1 << 48;

/// Where the sweep cuts each seed: every prefix of the small seeds; for the raw real header
/// (a parse costs tens of milliseconds there) the metadata entry boundaries and every 8th tensor
/// entry, each also one byte either side, and only with `full`.
fn sweep_cuts(seeds: &[Seed], full: bool) -> Vec<(usize, usize)> {
    let mut cuts = Vec::new();
    for (i, s) in seeds.iter().enumerate() {
        if s.name != "real-header" {
            cuts.extend((0..=s.bytes.len()).map(|n| (i, n)));
        } else if full {
            let mut at: Vec<usize> = s.layout.kvs.iter().map(|e| e.range.end).collect();
            at.extend(s.layout.tensors.iter().step_by(8).map(|t| t.end));
            for a in at {
                cuts.extend([a - 1, a, a + 1].into_iter().filter(|&n| n <= s.bytes.len()).map(|n| (i, n)));
            }
        }
    }
    cuts
}

fn sweep_input(seeds: &[Seed], cuts: &[(usize, usize)], id: u64) -> Input {
    let (seed, n) = cuts[(id - SWEEP) as usize];
    Input { seed, bytes: seeds[seed].bytes[..n].to_vec(), ops: vec!["truncate (sweep)"], deep: true, pad: false }
}

/// The header followed by `pad` zero bytes (zero pages: only the header is ever touched).
fn padded(header: &[u8], pad: usize) -> Vec<u8> {
    if pad == 0 {
        return header.to_vec();
    }
    let total = header.len().div_ceil(4096) * 4096 + pad;
    let mut v = vec![0u8; total];
    v[..header.len()].copy_from_slice(header);
    v
}

// ---------------------------------------------------------------------------------------------
// The campaign.
// ---------------------------------------------------------------------------------------------

fn env_u64(key: &str, default: u64) -> u64 {
    std::env::var(key).ok().and_then(|v| v.trim().replace('_', "").parse().ok()).unwrap_or(default)
}

struct Failure {
    index: u64,
    seed: String,
    ops: Vec<&'static str>,
    what: String,
}

#[derive(Default)]
struct Stats {
    execs: u64,
    sweep_execs: u64,
    panics: u64,
    histogram: BTreeMap<(Stage, &'static str), u64>,
    per_seed: BTreeMap<String, u64>,
    slowest: (Duration, u64, String),
    /// The slowest execution of a small seed (everything but the raw real header).
    slowest_small: (Duration, u64, String),
    largest_alloc: (usize, u64, String),
    failures: Vec<Failure>,
}

impl Stats {
    fn merge(&mut self, o: Stats) {
        self.execs += o.execs;
        self.sweep_execs += o.sweep_execs;
        self.panics += o.panics;
        for (k, v) in o.histogram {
            *self.histogram.entry(k).or_default() += v;
        }
        for (k, v) in o.per_seed {
            *self.per_seed.entry(k).or_default() += v;
        }
        if o.slowest.0 > self.slowest.0 {
            self.slowest = o.slowest;
        }
        if o.slowest_small.0 > self.slowest_small.0 {
            self.slowest_small = o.slowest_small;
        }
        if o.largest_alloc.0 > self.largest_alloc.0 {
            self.largest_alloc = o.largest_alloc;
        }
        self.failures.extend(o.failures);
    }
}

thread_local! {
    static LAST_PANIC: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Per worker: the index being executed and when it started (ms since the campaign began), for
/// the watchdog that turns a hang into a reproducible report instead of a silent CI timeout.
struct Slot {
    index: AtomicU64,
    started_ms: AtomicU64,
}

const IDLE: u64 = u64::MAX;

fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).unwrap_or(0)
}

fn run_worker(seeds: &[Seed], inputs: impl Iterator<Item = (u64, Input)>, slot: &Slot, t0: Instant, limits: &Limits) -> Stats {
    let mut st = Stats::default();
    for (index, input) in inputs {
        let seed = &seeds[input.seed];
        let buf = padded(&input.bytes, if input.pad { seed.pad } else { 0 });
        slot.started_ms.store(t0.elapsed().as_millis() as u64, Ordering::Relaxed);
        slot.index.store(index, Ordering::Relaxed);
        LARGEST.with(|l| l.set(0));
        let start = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| load_path(buf, input.deep)));
        let took = start.elapsed();
        slot.index.store(IDLE, Ordering::Relaxed);
        // Allocations after the last stage (dropping, the encode check) count as the last stage's.
        let mut largest = (LARGEST.with(|l| l.get()), None);

        st.execs += 1;
        st.sweep_execs += u64::from(index >= SWEEP);
        *st.per_seed.entry(seed.name.clone()).or_default() += 1;
        if took > st.slowest.0 {
            st.slowest = (took, index, seed.name.clone());
        }
        if seed.name != "real-header" && took > st.slowest_small.0 {
            st.slowest_small = (took, index, seed.name.clone());
        }
        let mut problems = Vec::new();
        match result {
            Ok(outcome) => {
                if outcome.largest.0 >= largest.0 {
                    largest = outcome.largest;
                }
                for r in outcome.results {
                    *st.histogram.entry(r).or_default() += 1;
                }
                problems = outcome.problems;
            }
            Err(payload) => {
                st.panics += 1;
                let at = LAST_PANIC.with(|p| p.borrow().clone());
                problems.push(format!("panic: {} ({at})", Error::from_panic(payload)));
            }
        }
        if took > limits.slow(input.seed) {
            problems.push(format!("took {took:?} (limit {:?})", limits.slow(input.seed)));
        }
        if largest.0 > st.largest_alloc.0 {
            st.largest_alloc = (largest.0, index, format!("{} in {:?}", seed.name, largest.1));
        }
        let alloc_limit = limits.alloc(seed);
        if largest.0 > alloc_limit {
            problems.push(format!("allocated {} bytes at once in {:?} (limit {alloc_limit})", largest.0, largest.1));
        }
        if !problems.is_empty() {
            st.failures.push(Failure { index, seed: seed.name.clone(), ops: input.ops.clone(), what: problems.join("; ") });
            save_input(index, &input.bytes);
        }
    }
    st
}

/// Writes a failing input (its header; the zero padding is implied) next to the test binary.
fn save_input(index: u64, bytes: &[u8]) {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz_gguf");
    if std::fs::create_dir_all(&dir).is_ok() {
        let _ = std::fs::write(dir.join(format!("exec-{index}.gguf")), bytes);
    }
}

struct Limits {
    slow: Duration,
    /// Per seed: how long the unmutated seed takes through the whole load path.
    baseline: Vec<Duration>,
}

impl Limits {
    /// The longest an execution may take: `RUVLLM_FUZZ_SLOW_MS`, or four times the unmutated
    /// seed where that is longer (building the real 262,144-token tokenizer takes about a second).
    fn slow(&self, seed: usize) -> Duration {
        self.slow.max(4 * self.baseline[seed])
    }

    /// The largest single allocation an execution may make: twice the input, or 64 MiB for small
    /// inputs. A string may be as long as the file and a parsed array takes a few times its bytes
    /// in the file (up to the parser's element budget); a buffer sized from a count or a length
    /// that the file does not back breaks this.
    fn alloc(&self, seed: &Seed) -> usize {
        (64 << 20).max(2 * (seed.bytes.len() + seed.pad))
    }
}

fn campaign(execs: u64, only: Option<u64>) {
    let base_seed = env_u64("RUVLLM_FUZZ_SEED", 1);
    let threads = env_u64("RUVLLM_FUZZ_THREADS", 1).max(1);
    let hang = Duration::from_secs(env_u64("RUVLLM_FUZZ_HANG_S", 30));

    let seeds = all_seeds();
    eprintln!("seeds (unmutated, the whole load path):");
    let mut baseline = Vec::new();
    for s in &seeds {
        let start = Instant::now();
        let out = load_path(padded(&s.bytes, s.pad), true);
        baseline.push(start.elapsed());
        assert!(out.problems.is_empty(), "{}: {:?}", s.name, out.problems);
        eprintln!(
            "  {:<14} {:>9} bytes (+{} zero bytes of data)  {:>3}‰ of executions  {:>10.3?}",
            s.name,
            s.bytes.len(),
            s.pad,
            s.per_mille,
            baseline[baseline.len() - 1]
        );
    }
    let limits = Limits { slow: Duration::from_millis(env_u64("RUVLLM_FUZZ_SLOW_MS", 1000)), baseline };
    let previous_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        let at = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
        LAST_PANIC.with(|p| *p.borrow_mut() = at);
    }));

    // The full campaign also cuts the raw real header at its entry boundaries.
    let cuts = sweep_cuts(&seeds, execs >= 100_000);
    let slots: Vec<Slot> = (0..threads).map(|_| Slot { index: AtomicU64::new(IDLE), started_ms: AtomicU64::new(0) }).collect();
    let done = AtomicBool::new(false);
    let t0 = Instant::now();
    let total = Mutex::new(Stats::default());
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                for slot in &slots {
                    let index = slot.index.load(Ordering::Relaxed);
                    let since =
                        Duration::from_millis(t0.elapsed().as_millis() as u64 - slot.started_ms.load(Ordering::Relaxed).min(t0.elapsed().as_millis() as u64));
                    if index != IDLE && since > hang {
                        eprintln!("execution {index} has run for {since:?}: a hang. Reproduce with RUVLLM_FUZZ_ONLY={index} RUVLLM_FUZZ_SEED={base_seed} RUVLLM_FUZZ_EXECS={execs}");
                        std::process::abort();
                    }
                }
            }
        });
        let workers: Vec<_> = (0..threads)
            .map(|w| {
                let (seeds, slot, limits, total, cuts) = (&seeds, &slots[w as usize], &limits, &total, &cuts);
                s.spawn(move || {
                    let input = |i: u64| (i, if i >= SWEEP { sweep_input(seeds, cuts, i) } else { make_input(seeds, base_seed, i) });
                    let st = match only {
                        Some(i) => run_worker(seeds, std::iter::once(i).filter(|_| w == 0).map(input), slot, t0, limits),
                        None => {
                            let sweep = (SWEEP + w..SWEEP + cuts.len() as u64).step_by(threads as usize);
                            run_worker(seeds, sweep.chain((w..execs).step_by(threads as usize)).map(input), slot, t0, limits)
                        }
                    };
                    total.lock().unwrap_or_else(|e| e.into_inner()).merge(st);
                })
            })
            .collect();
        for h in workers {
            let _ = h.join();
        }
        done.store(true, Ordering::Relaxed);
    });
    std::panic::set_hook(previous_hook);
    let wall = t0.elapsed();
    let st = total.into_inner().unwrap_or_else(|e| e.into_inner());
    let rss = peak_rss_kib();

    eprintln!(
        "\n{} executions ({} mutated, {} truncation sweep) in {:.1} s ({:.0}/s, {threads} thread(s), seed {base_seed}); panics: {}; failures: {}",
        st.execs,
        st.execs - st.sweep_execs,
        st.sweep_execs,
        wall.as_secs_f64(),
        st.execs as f64 / wall.as_secs_f64(),
        st.panics,
        st.failures.len()
    );
    eprintln!("slowest execution: {:?} (#{} on {})", st.slowest.0, st.slowest.1, st.slowest.2);
    eprintln!("slowest execution of a small seed: {:?} (#{} on {})", st.slowest_small.0, st.slowest_small.1, st.slowest_small.2);
    eprintln!("largest single allocation: {:.1} MiB (#{} on {})", st.largest_alloc.0 as f64 / (1 << 20) as f64, st.largest_alloc.1, st.largest_alloc.2);
    eprintln!("peak RSS (VmHWM): {:.1} MiB", rss as f64 / 1024.0);
    eprintln!("executions per seed: {:?}", st.per_seed);
    eprintln!("results per stage:");
    for ((stage, code), n) in &st.histogram {
        eprintln!("  {:<10} {:<24} {n:>9}", format!("{stage:?}"), code);
    }
    for f in st.failures.iter().take(20) {
        eprintln!("FAIL #{} on {} after {:?}: {}", f.index, f.seed, f.ops, f.what);
    }
    if !st.failures.is_empty() {
        eprintln!("reproduce one with RUVLLM_FUZZ_ONLY=<#> RUVLLM_FUZZ_SEED={base_seed} RUVLLM_FUZZ_EXECS={execs}");
    }
    assert!(st.failures.is_empty(), "{} failing executions (inputs saved under {}/fuzz_gguf)", st.failures.len(), env!("CARGO_TARGET_TMPDIR"));
    assert!(rss < 2 << 20, "peak RSS {rss} KiB is over 2 GiB");
    if only.is_none() {
        assert_eq!(st.execs, execs + cuts.len() as u64);
        for stage in [Stage::Parse, Stage::Config, Stage::Tokenizer, Stage::Template] {
            assert!(st.histogram.contains_key(&(stage, "ok")), "no execution got through {stage:?}: the mutations are too destructive");
        }
    }
}

/// A short deterministic campaign (CI); `RUVLLM_FUZZ_EXECS` sets the length.
#[test]
fn fuzz_gguf_load_path() {
    let only = std::env::var("RUVLLM_FUZZ_ONLY").ok().and_then(|v| v.trim().parse().ok());
    campaign(env_u64("RUVLLM_FUZZ_EXECS", 20_000), only);
}

/// The seed corpus itself loads cleanly: mutations start from valid files.
#[test]
fn seeds_are_valid() {
    for s in all_seeds() {
        let start = Instant::now();
        let out = load_path(padded(&s.bytes, s.pad), true);
        eprintln!("{}: {:?} in {:?}", s.name, out.results, start.elapsed());
        assert!(out.problems.is_empty(), "{}: {:?}", s.name, out.problems);
        assert_eq!(out.results[0], (Stage::Parse, "ok"), "{}", s.name);
        if s.name.contains("tiny") || s.name.starts_with("real") {
            assert_eq!(out.results[1], (Stage::Config, "ok"), "{}", s.name);
        }
        if s.name.contains("tiny") || s.name == "real-trimmed" {
            assert!(out.results.iter().all(|r| r.1 == "ok"), "{}: {:?}", s.name, out.results);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Regressions: the smallest inputs for what the campaign found, written by code. The counting
// allocator above makes "no huge allocation" checkable.
// ---------------------------------------------------------------------------------------------

/// Runs `f` and returns its result with the largest single allocation it made.
fn largest_alloc<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(0));
    let out = f();
    (out, LARGEST.with(|l| l.get()))
}

/// A GGUF preamble with the given counts, then `body`, then `pad` zero bytes (zero pages that
/// are never touched unless parsed).
fn raw_file(n_tensors: u64, n_kv: u64, body: &[u8], pad: usize) -> Vec<u8> {
    let mut b = vec![0u8; 24 + body.len() + pad];
    b[..4].copy_from_slice(b"GGUF");
    b[4..8].copy_from_slice(&3u32.to_le_bytes());
    b[8..16].copy_from_slice(&n_tensors.to_le_bytes());
    b[16..24].copy_from_slice(&n_kv.to_le_bytes());
    b[24..24 + body.len()].copy_from_slice(body);
    b
}

fn expect_invalid(r: Result<GgufFile, Error>, needle: &str) {
    match r {
        Ok(_) => panic!("expected the file to be rejected ({needle})"),
        Err(e) => {
            assert_eq!(e.code(), "ERR_GGUF_INVALID", "{e}");
            assert!(e.to_string().contains(needle), "expected {needle:?} in: {e}");
        }
    }
}

#[test]
fn a_corrupt_count_reserves_no_memory() {
    // A string array claiming 2^22 elements, backed by 32 MiB of zero bytes, whose second
    // element's length is corrupt. The parser used to reserve a 32-byte value per claimed
    // element (128 MiB) before reading any; now it reserves at most 2^16 and grows.
    let mut body = Vec::new();
    body.extend_from_slice(&(3u64).to_le_bytes());
    body.extend_from_slice(b"arr");
    body.extend_from_slice(&9u32.to_le_bytes()); // array
    body.extend_from_slice(&8u32.to_le_bytes()); // of strings
    body.extend_from_slice(&(1u64 << 22).to_le_bytes());
    body.extend_from_slice(&1u64.to_le_bytes());
    body.push(b'a');
    body.extend_from_slice(&u64::MAX.to_le_bytes());
    let bytes = raw_file(0, 1, &body, 32 << 20);
    let (r, largest) = largest_alloc(|| GgufFile::from_bytes(bytes, "fuzz.gguf"));
    expect_invalid(r, "array element 1: a string value at offset 60 has length 18446744073709551615");
    assert!(largest < 4 << 20, "reserved {largest} bytes for a corrupt count");

    // The same for the tensor count: 2^20 entries claimed, 32 MiB of zeros (the first entry is
    // an empty name with 0 dimensions).
    let bytes = raw_file(1 << 20, 0, &[], 32 << 20);
    let (r, largest) = largest_alloc(|| GgufFile::from_bytes(bytes, "fuzz.gguf"));
    expect_invalid(r, "tensor '' has 0 dimensions");
    assert!(largest < 8 << 20, "reserved {largest} bytes for a corrupt count");
}

/// A tiny model header for `arch` with the given `arch.*` keys and a 2-D `token_embd.weight`.
fn tiny_model(arch: &str, keys: &[(&str, V)]) -> GgufFile {
    let mut w = GgufWriter::new();
    arch_keys(&mut w, arch, keys);
    add_zero_tensor(&mut w, "token_embd.weight", &[8, 4], GgmlType::F32);
    GgufFile::from_bytes(w.to_bytes(), FILE_NAME).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_huge_block_count_is_rejected_before_sizing_per_layer_tables() {
    // The per-layer sliding-window table was sized from `block_count` before the config was
    // validated: 2^40 layers asked for a terabyte (an abort, not an error), u64::MAX a panic.
    for arch in ["gemma3", "llama"] {
        for layers in [1u64 << 40, u64::MAX, 0] {
            let keys = [
                ("block_count", V::U64(layers)),
                ("embedding_length", V::U32(8)),
                ("feed_forward_length", V::U32(16)),
                ("attention.head_count", V::U32(2)),
                ("attention.sliding_window", V::U32(4)),
            ];
            let file = tiny_model(arch, &keys);
            let (r, largest) = largest_alloc(|| catch_unwind(AssertUnwindSafe(|| config_from_gguf(&file))));
            let err = r.unwrap_or_else(|_| panic!("{arch} with {layers} layers panicked")).expect_err("rejected");
            assert_eq!(err.code(), "ERR_GGUF_INVALID");
            assert!(err.to_string().contains(&format!("metadata key '{arch}.block_count' is {layers}, which is not a plausible model size")), "{err}");
            assert!(largest < 1 << 20, "{arch}: allocated {largest} bytes");
        }
    }
}

#[test]
fn gemma3_with_62_layers_and_no_heads_is_an_error() {
    // Gemma 3 27B (62 layers) scales queries by d_model / head_count: a head count of 0 divided
    // by zero before the config was validated.
    let keys = [("block_count", V::U32(62)), ("embedding_length", V::U32(8)), ("feed_forward_length", V::U32(16)), ("attention.head_count", V::U32(0))];
    let file = tiny_model("gemma3", &keys);
    let r = catch_unwind(AssertUnwindSafe(|| config_from_gguf(&file))).unwrap_or_else(|_| panic!("panicked"));
    let err = r.expect_err("rejected");
    assert_eq!(err.code(), "ERR_GGUF_INVALID");
    assert!(err.to_string().contains("'gemma3.attention.head_count' is 0"), "{err}");
}
