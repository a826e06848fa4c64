//! GGUF reader/writer: round trips, every kind of corrupt input, and the real model.

use ruvllm_core::backend::cpu::GgmlType;
use ruvllm_core::gguf::writer::GgufWriter;
use ruvllm_core::gguf::{GgufFile, MetadataValue as V};
use ruvllm_core::Error;

/// A small valid file: a few metadata entries and two tensors.
fn small_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", V::String("llama".into()))
        .add_metadata("llama.block_count", V::U32(2))
        .add_metadata("tokenizer.ggml.tokens", V::Array(vec![V::String("a".into()), V::String("bc".into())]))
        .add_metadata("tokenizer.ggml.scores", V::Array(vec![V::F32(-1.0), V::F32(-2.0)]))
        .add_f32("tok.weight", &[4, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
        .add_f32("norm.weight", &[3], &[0.5, 0.25, 0.125]);
    w
}

fn parse(bytes: Vec<u8>) -> Result<GgufFile, Error> {
    GgufFile::from_bytes(bytes, "test.gguf")
}

/// Parses `bytes`, expects ERR_GGUF_INVALID, and returns the message.
fn invalid(bytes: Vec<u8>) -> String {
    let err = parse(bytes).expect_err("expected the file to be rejected");
    assert_eq!(err.code(), "ERR_GGUF_INVALID", "{err}");
    let msg = err.to_string();
    assert!(msg.contains("test.gguf"), "message should name the file: {msg}");
    msg
}

fn assert_contains(msg: &str, needle: &str) {
    assert!(msg.contains(needle), "expected {needle:?} in: {msg}");
}

/// Byte position of the first occurrence of `needle`.
fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).position(|w| w == needle).expect("needle in file")
}

/// Position just after the first length-prefixed string `s` (a key, value or tensor name).
fn after_str(bytes: &[u8], s: &str) -> usize {
    let mut needle = (s.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(s.as_bytes());
    find(bytes, &needle) + needle.len()
}

fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Offset of the type id of tensor "norm.weight" (1 dim).
fn norm_type_at(bytes: &[u8]) -> usize {
    after_str(bytes, "norm.weight") + 4 + 8
}

#[test]
fn round_trip_all_value_types() {
    let values = vec![
        ("k.u8", V::U8(200)),
        ("k.i8", V::I8(-100)),
        ("k.u16", V::U16(60000)),
        ("k.i16", V::I16(-30000)),
        ("k.u32", V::U32(4_000_000_000)),
        ("k.i32", V::I32(-2_000_000_000)),
        ("k.u64", V::U64(u64::MAX)),
        ("k.i64", V::I64(i64::MIN)),
        ("k.f32", V::F32(1.5)),
        ("k.f64", V::F64(-2.25e300)),
        ("k.bool", V::Bool(true)),
        ("k.string", V::String("héllo ✓".into())),
        ("k.empty_string", V::String(String::new())),
        ("k.strings", V::Array(vec![V::String("x".into()), V::String("".into()), V::String("yz".into())])),
        ("k.f32s", V::Array(vec![V::F32(0.5), V::F32(-1.0)])),
        ("k.i32s", V::Array(vec![V::I32(-1), V::I32(7)])),
        ("k.bools", V::Array(vec![V::Bool(false), V::Bool(true)])),
        ("k.empty", V::Array(vec![])),
        ("k.nested", V::Array(vec![V::Array(vec![V::U8(1), V::U8(2)]), V::Array(vec![V::String("s".into())])])),
    ];
    let mut w = GgufWriter::new();
    for (k, v) in &values {
        w.add_metadata(k, v.clone());
    }
    w.add_f32("a", &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    w.add_tensor("b", &[32], GgmlType::Q8_0, (0..34u8).collect());
    w.add_f32("c", &[1], &[9.0]);
    let f = parse(w.to_bytes()).expect("valid file");
    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, 32);
    assert_eq!(f.metadata.len(), values.len());
    for (k, v) in &values {
        assert_eq!(f.get(k), Some(v), "key {k}");
    }
    assert_eq!(f.tensors.len(), 3);
    let a = f.tensor("a").expect("tensor a");
    assert_eq!((a.dims.clone(), a.dtype, a.size, a.n_elements()), (vec![2, 3], GgmlType::F32, 24, 6));
    let floats: Vec<f32> = f.tensor_bytes(a).chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(floats, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = f.tensor("b").expect("tensor b");
    assert_eq!(b.dtype, GgmlType::Q8_0);
    assert_eq!(f.tensor_bytes(b), (0..34u8).collect::<Vec<_>>().as_slice());
    assert_eq!(f.tensor_bytes(f.tensor("c").unwrap()), 9.0f32.to_le_bytes());
    for t in &f.tensors {
        assert_eq!(t.offset % 32, 0, "{} aligned", t.name);
        assert!(t.offset >= f.data_offset);
    }
    assert!(f.tensor("missing").is_none());
}

#[test]
fn accessors_and_json() {
    assert_eq!(V::U8(3).as_u64(), Some(3));
    assert_eq!(V::I32(-3).as_u64(), None);
    assert_eq!(V::I32(-3).as_i64(), Some(-3));
    assert_eq!(V::U64(u64::MAX).as_i64(), None);
    assert_eq!(V::U64(u64::MAX).as_u64(), Some(u64::MAX));
    assert_eq!(V::F32(0.5).as_f64(), Some(0.5));
    assert_eq!(V::U16(7).as_f64(), Some(7.0));
    assert_eq!(V::String("x".into()).as_u64(), None);
    assert_eq!(V::String("x".into()).as_str(), Some("x"));
    assert_eq!(V::Bool(true).as_bool(), Some(true));
    assert_eq!(V::Bool(true).as_u64(), None);
    assert_eq!(V::Array(vec![V::U8(1)]).as_array().map(|a| a.len()), Some(1));
    let json = V::Array(vec![V::U64(u64::MAX), V::I64(-5), V::F32(f32::NAN), V::String("s".into())]).to_json();
    assert_eq!(json, serde_json::json!([u64::MAX, -5, null, "s"]));

    let f = parse(small_writer().to_bytes()).unwrap();
    assert_eq!(f.architecture(), Some("llama"));
    assert_eq!(f.get_u64("llama.block_count").unwrap(), 2);
    assert_eq!(f.get_f64("llama.block_count").unwrap(), 2.0);
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    let missing = f.get_u64("llama.nope").unwrap_err();
    assert_eq!(missing.code(), "ERR_GGUF_INVALID");
    assert_contains(&missing.to_string(), "missing metadata key 'llama.nope'");
    let wrong = f.get_u64("general.architecture").unwrap_err();
    assert_contains(&wrong.to_string(), "metadata key 'general.architecture' has type string");
    assert_contains(&f.get_str("llama.block_count").unwrap_err().to_string(), "'llama.block_count' has type u32");
    let json = f.metadata_json();
    assert_eq!(json["general.architecture"], "llama");
    assert_eq!(json["llama.block_count"], 2);
    assert_eq!(json["tokenizer.ggml.tokens"], serde_json::json!(["a", "bc"]));
    assert_eq!(json["tokenizer.ggml.scores"], serde_json::json!([-1.0, -2.0]));

    // Large arrays can leave the parsed metadata (the engine does so once the tokenizer is
    // built); the JSON still has them, read again from the bytes.
    let mut f = f;
    f.drop_large_arrays(1);
    assert!(f.get("tokenizer.ggml.tokens").is_none());
    assert_eq!(f.get_u64("llama.block_count").unwrap(), 2);
    assert_eq!(f.metadata_json(), json);
}

#[test]
fn custom_alignment_and_atomic_write() {
    let mut w = small_writer();
    w.alignment = 64;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    w.write(&path).unwrap();
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, [std::ffi::OsString::from("m.gguf")], "no temp file left behind");
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.alignment, 64);
    assert_eq!(f.get("general.alignment"), Some(&V::U32(64)));
    assert_eq!(f.data_offset % 64, 0);
    assert!(f.tensors.iter().all(|t| t.offset % 64 == 0));
    let t = f.tensor("norm.weight").unwrap();
    assert_eq!(f.tensor_bytes(t), [0.5f32, 0.25, 0.125].map(f32::to_le_bytes).concat());
    assert_eq!(f.storage().len() as u64, std::fs::metadata(&path).unwrap().len());
}

#[test]
fn bad_alignment() {
    let mut w = small_writer();
    w.add_metadata("general.alignment", V::U32(48));
    assert_contains(&invalid(w.to_bytes()), "general.alignment is 48, which is not a power of two");
    let mut w = small_writer();
    w.add_metadata("general.alignment", V::U64(32));
    assert_contains(&invalid(w.to_bytes()), "general.alignment must be a u32, but it is u64");
}

#[test]
fn nonexistent_path_is_model_not_found() {
    let err = GgufFile::open("/nonexistent/dir/model.gguf").unwrap_err();
    assert_eq!(err.code(), "ERR_MODEL_NOT_FOUND");
}

#[test]
fn directory_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let err = GgufFile::open(dir.path()).unwrap_err();
    assert_eq!(err.code(), "ERR_GGUF_INVALID");
}

#[test]
fn empty_file() {
    assert_contains(&invalid(vec![]), "the file is empty (0 bytes)");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.gguf");
    std::fs::write(&path, b"").unwrap();
    let err = GgufFile::open(&path).unwrap_err();
    assert_eq!(err.code(), "ERR_GGUF_INVALID");
    assert_contains(&err.to_string(), "empty");
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = small_writer().to_bytes();
    let norm = parse(bytes.clone()).unwrap().tensor("norm.weight").cloned().unwrap();
    let end = (norm.offset + norm.size) as usize; // padding after the last tensor is optional
    for len in 0..end {
        let result = std::panic::catch_unwind(|| parse(bytes[..len].to_vec()));
        let err = result.unwrap_or_else(|_| panic!("parser panicked on a {len}-byte prefix"));
        let err = err.expect_err(&format!("{len}-byte prefix accepted"));
        assert_eq!(err.code(), "ERR_GGUF_INVALID", "prefix {len}: {err}");
    }
    for len in end..=bytes.len() {
        assert!(parse(bytes[..len].to_vec()).is_ok(), "{len}-byte prefix keeps all tensor data");
    }
}

#[test]
fn truncation_messages() {
    let bytes = small_writer().to_bytes();
    assert_contains(&invalid(bytes[..6].to_vec()), "truncated: the version needs 4 bytes at offset 4");
    let data = parse(bytes.clone()).unwrap().tensor("norm.weight").unwrap().offset as usize;
    assert_contains(
        &invalid(bytes[..data + 4].to_vec()),
        &format!("tensor 'norm.weight' data (offset {data}, 12 bytes) extends past the end of the file ({} bytes)", data + 4),
    );
}

#[test]
fn wrong_magic() {
    let mut bytes = small_writer().to_bytes();
    bytes[..4].copy_from_slice(b"GGML");
    assert_contains(&invalid(bytes), "not a GGUF file: the first bytes are 47 47 4d 4c");
    assert_contains(&invalid(b"GG".to_vec()), "not a GGUF file");
}

#[test]
fn unsupported_versions() {
    let mut bytes = small_writer().to_bytes();
    put_u32(&mut bytes, 4, 1);
    assert_contains(&invalid(bytes.clone()), "GGUF version 1 is not supported");
    put_u32(&mut bytes, 4, 99);
    assert_contains(&invalid(bytes.clone()), "unsupported GGUF version 99 (supported: 2 and 3)");
    put_u32(&mut bytes, 4, 3u32.swap_bytes());
    assert_contains(&invalid(bytes.clone()), "big-endian");
    put_u32(&mut bytes, 4, 2);
    assert_eq!(parse(bytes).unwrap().version, 2, "v2 has the same layout as v3");
}

#[test]
fn absurd_counts() {
    let mut bytes = small_writer().to_bytes();
    put_u64(&mut bytes, 8, 1 << 60);
    assert_contains(&invalid(bytes), "tensor count 1152921504606846976 is impossible");
    let mut bytes = small_writer().to_bytes();
    put_u64(&mut bytes, 16, u64::MAX);
    assert_contains(&invalid(bytes), &format!("metadata count {} is impossible", u64::MAX));
    let mut bytes = small_writer().to_bytes();
    let len = bytes.len() as u64;
    put_u64(&mut bytes, 8, len / 40);
    put_u64(&mut bytes, 16, len / 20);
    assert_contains(&invalid(bytes), "cannot fit in a file of");
}

#[test]
fn absurd_string_length() {
    let mut bytes = small_writer().to_bytes();
    put_u64(&mut bytes, 24, 1 << 60); // length of the first key
    assert_contains(&invalid(bytes), "metadata entry 0: a metadata key at offset 24 has length 1152921504606846976");
    let mut bytes = small_writer().to_bytes();
    let at = after_str(&bytes, "llama") - 5 - 8; // length of the architecture string value
    put_u64(&mut bytes, at, u64::MAX);
    assert_contains(&invalid(bytes), "metadata key 'general.architecture': a string value at offset");
    let mut bytes = small_writer().to_bytes();
    let at = after_str(&bytes, "tok.weight") - 10 - 8;
    put_u64(&mut bytes, at, 1 << 62);
    assert_contains(&invalid(bytes), "tensor entry 0: a tensor name at offset");
}

#[test]
fn absurd_array_length() {
    let mut bytes = small_writer().to_bytes();
    let at = after_str(&bytes, "tokenizer.ggml.tokens") + 4 + 4; // value type, element type
    put_u64(&mut bytes, at, 1 << 60);
    let msg = invalid(bytes);
    assert_contains(&msg, "metadata key 'tokenizer.ggml.tokens': array at offset");
    assert_contains(&msg, "claims 1152921504606846976 elements of type 8");
}

#[test]
fn deeply_nested_arrays() {
    let mut v = V::U8(1);
    for _ in 0..9 {
        v = V::Array(vec![v]);
    }
    let mut w = GgufWriter::new();
    w.add_metadata("deep", v);
    assert_contains(&invalid(w.to_bytes()), "nested more than 8 levels");
    let mut v = V::U8(1);
    for _ in 0..8 {
        v = V::Array(vec![v]);
    }
    let mut w = GgufWriter::new();
    w.add_metadata("ok", v.clone());
    assert_eq!(parse(w.to_bytes()).unwrap().get("ok"), Some(&v));
}

#[test]
fn unknown_value_types() {
    let mut bytes = small_writer().to_bytes();
    let at = after_str(&bytes, "llama.block_count");
    put_u32(&mut bytes, at, 13);
    assert_contains(&invalid(bytes), "metadata key 'llama.block_count': unknown value type 13");
    let mut bytes = small_writer().to_bytes();
    let at = after_str(&bytes, "tokenizer.ggml.tokens") + 4;
    put_u32(&mut bytes, at, 77);
    assert_contains(&invalid(bytes), "has unknown element type 77");
}

#[test]
fn bad_bool_and_utf8() {
    let mut w = GgufWriter::new();
    w.add_metadata("flag", V::Bool(true));
    let mut bytes = w.to_bytes();
    let at = after_str(&bytes, "flag") + 4;
    bytes[at] = 2;
    assert_contains(&invalid(bytes), "metadata key 'flag': bool value at offset");
    let mut bytes = small_writer().to_bytes();
    let at = after_str(&bytes, "llama") - 5;
    bytes[at] = 0xff;
    assert_contains(&invalid(bytes), "is not valid UTF-8");
}

#[test]
fn tensor_offset_outside_file() {
    let mut bytes = small_writer().to_bytes();
    let at = norm_type_at(&bytes) + 4;
    put_u64(&mut bytes, at, 1 << 20);
    assert_contains(&invalid(bytes), "tensor 'norm.weight' data (offset");
    let mut bytes = small_writer().to_bytes();
    put_u64(&mut bytes, at, u64::MAX - 31); // aligned, overflows when added to the data offset
    assert_contains(&invalid(bytes), "extends past the end of the file");
}

#[test]
fn misaligned_offset() {
    let mut bytes = small_writer().to_bytes();
    let at = norm_type_at(&bytes) + 4;
    put_u64(&mut bytes, at, 36);
    assert_contains(&invalid(bytes), "tensor 'norm.weight' offset 36 is not a multiple of the alignment 32");
}

#[test]
fn unknown_tensor_type() {
    let mut bytes = small_writer().to_bytes();
    let at = norm_type_at(&bytes);
    put_u32(&mut bytes, at, 99);
    assert_contains(&invalid(bytes), "tensor 'norm.weight' has unknown ggml type id 99");
}

#[test]
fn bad_dims() {
    let dims_at = |bytes: &[u8]| after_str(bytes, "tok.weight");
    let mut bytes = small_writer().to_bytes();
    let at = dims_at(&bytes);
    put_u64(&mut bytes, at + 4, 1 << 40);
    put_u64(&mut bytes, at + 12, 1 << 40);
    assert_contains(&invalid(bytes), "tensor 'tok.weight' element count overflows (dims [1099511627776, 1099511627776])");
    let mut bytes = small_writer().to_bytes();
    put_u64(&mut bytes, at + 12, 0);
    assert_contains(&invalid(bytes), "tensor 'tok.weight' dimension 1 is 0");
    let mut bytes = small_writer().to_bytes();
    put_u32(&mut bytes, at, 5);
    assert_contains(&invalid(bytes), "tensor 'tok.weight' has 5 dimensions (must be 1 to 4)");
    let mut bytes = small_writer().to_bytes();
    put_u32(&mut bytes, at, 0);
    assert_contains(&invalid(bytes), "tensor 'tok.weight' has 0 dimensions");
}

#[test]
fn partial_block() {
    let mut w = GgufWriter::new();
    w.add_tensor("q", &[16, 2], GgmlType::Q8_0, vec![0; 34]);
    assert_contains(&invalid(w.to_bytes()), "tensor 'q' row length 16 is not a multiple of the Q8_0 block size 32");
}

#[test]
fn duplicate_names() {
    let mut w = small_writer();
    w.add_f32("norm.weight", &[1], &[1.0]);
    assert_contains(&invalid(w.to_bytes()), "duplicate tensor name 'norm.weight'");
    let mut w = small_writer();
    w.add_metadata("llama.block_count", V::U32(3));
    assert_contains(&invalid(w.to_bytes()), "duplicate metadata key 'llama.block_count'");
}

#[test]
fn no_tensors_is_valid() {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", V::String("x".into()));
    let f = parse(w.to_bytes()).unwrap();
    assert!(f.tensors.is_empty());
    assert_eq!(f.architecture(), Some("x"));
}

/// The real Gemma 3 270M model that CI installs.
#[test]
fn real_model() {
    let path = ruvllm_models::real_test_model().unwrap_or_else(|e| panic!("{e}"));
    let start = std::time::Instant::now();
    let f = GgufFile::open(&path).unwrap();
    let elapsed = start.elapsed();
    eprintln!("parsed {} in {elapsed:?}", path.display());
    assert_eq!(f.architecture(), Some("gemma3"));
    assert_eq!(f.tensors.len(), 236);
    assert_eq!(f.get_u64("gemma3.block_count").unwrap(), 18);
    let emb = f.tensor("token_embd.weight").expect("token_embd.weight");
    assert_eq!(emb.dims, [640, 262144]);
    assert_eq!(emb.dtype, GgmlType::Q8_0);
    assert_eq!(f.tensor_bytes(emb).len() as u64, 640 * 262144 / 32 * 34);
    let tokens = f.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()).expect("tokens array");
    assert_eq!(tokens.len(), 262144);
    assert!(tokens.iter().all(|t| t.as_str().is_some()));
    let json = f.metadata_json();
    assert_eq!(json["gemma3.block_count"], 18);
}

/// A file with no tensors and one metadata entry whose value bytes are given raw.
fn one_kv(key: &str, value_type: u32, value: &[u8]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&(key.len() as u64).to_le_bytes());
    b.extend_from_slice(key.as_bytes());
    b.extend_from_slice(&value_type.to_le_bytes());
    b.extend_from_slice(value);
    b
}

#[test]
fn key_and_tensor_name_limits() {
    // The format allows keys of up to 65,535 bytes and tensor names of up to 64: a corrupt length
    // that the rest of the file happens to cover must not become a huge key.
    let mut w = GgufWriter::new();
    w.add_metadata(&"k".repeat(65_535), V::U8(1)).add_f32(&"n".repeat(64), &[1], &[1.0]);
    assert!(parse(w.to_bytes()).is_ok());
    let mut w = GgufWriter::new();
    w.add_metadata(&"k".repeat(65_536), V::U8(1));
    assert_contains(&invalid(w.to_bytes()), "a metadata key at offset 24 has length 65536; the GGUF format allows at most 65535 bytes");
    let mut w = GgufWriter::new();
    w.add_f32(&"n".repeat(65), &[1], &[1.0]);
    assert_contains(&invalid(w.to_bytes()), "tensor entry 0: a tensor name at offset 24 has length 65; the GGUF format allows at most 64 bytes");
}

#[test]
fn array_element_budget() {
    // 2^23 + 1 one-byte elements: each would become a 32-byte value, so a file of small
    // elements would take 32 times its size in memory. Refused before anything is decoded.
    let n: u64 = (1 << 23) + 1;
    let mut value = 0u32.to_le_bytes().to_vec(); // element type u8
    value.extend_from_slice(&n.to_le_bytes());
    value.resize(value.len() + n as usize, 0);
    let msg = invalid(one_kv("big", 9, &value));
    assert_contains(&msg, "array at offset 39 has 8388609 elements, which takes the metadata past 8388608 array elements in all");
}
