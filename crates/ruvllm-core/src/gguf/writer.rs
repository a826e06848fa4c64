//! Writes GGUF v3 files: used by tests to build tiny synthetic models, never committed blobs.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::reader::{align_up, value_type, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC, WRITE_VERSION};
use super::MetadataValue;
use crate::backend::cpu::GgmlType;

/// Builds a GGUF v3 file in memory.
#[derive(Default)]
pub struct GgufWriter {
    /// Metadata in the order it is written.
    pub metadata: Vec<(String, MetadataValue)>,
    /// (name, dims in ggml order, type, raw bytes)
    pub tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
    /// Alignment of tensor data (a power of two; 0 means the default, 32). When it is not 32 and
    /// the metadata has no `general.alignment`, that key is written automatically.
    pub alignment: u64,
}

impl GgufWriter {
    /// An empty writer with the default alignment.
    pub fn new() -> Self {
        Self { alignment: 32, ..Default::default() }
    }

    /// Adds a metadata entry (written in insertion order; duplicates are written as given, which
    /// lets tests build invalid files).
    ///
    /// # Panics
    /// If `value` is an array whose elements are not all of one type (GGUF cannot encode it).
    pub fn add_metadata(&mut self, key: &str, value: MetadataValue) -> &mut Self {
        assert!(is_homogeneous(&value), "GGUF array for key '{key}' mixes element types");
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Adds a tensor with raw bytes as stored in the file (not checked against dims and type,
    /// so tests can build invalid files).
    pub fn add_tensor(&mut self, name: &str, dims: &[u64], dtype: GgmlType, bytes: Vec<u8>) -> &mut Self {
        self.tensors.push((name.to_string(), dims.to_vec(), dtype, bytes));
        self
    }

    /// Convenience: an F32 tensor.
    pub fn add_f32(&mut self, name: &str, dims: &[u64], data: &[f32]) -> &mut Self {
        let bytes = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.add_tensor(name, dims, GgmlType::F32, bytes)
    }

    /// The whole file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = self.effective_alignment();
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        put_u32(&mut out, WRITE_VERSION);
        put_u64(&mut out, self.tensors.len() as u64);
        let extra_alignment_key = align != DEFAULT_ALIGNMENT && !self.has_alignment_key();
        put_u64(&mut out, self.metadata.len() as u64 + u64::from(extra_alignment_key));
        if extra_alignment_key {
            put_kv(&mut out, ALIGNMENT_KEY, &MetadataValue::U32(align as u32));
        }
        for (key, value) in &self.metadata {
            put_kv(&mut out, key, value);
        }
        self.put_tensor_infos(&mut out, align);
        self.put_tensor_data(&mut out, align);
        out
    }

    /// Writes atomically (temp file + rename).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        write_atomic(path, &self.to_bytes())
    }

    /// The alignment used for layout (0 means the default).
    fn effective_alignment(&self) -> u64 {
        match self.alignment {
            0 => DEFAULT_ALIGNMENT,
            a => a,
        }
    }

    fn has_alignment_key(&self) -> bool {
        self.metadata.iter().any(|(k, _)| k == ALIGNMENT_KEY)
    }

    /// Tensor entries, with offsets relative to the (aligned) data section.
    fn put_tensor_infos(&self, out: &mut Vec<u8>, align: u64) {
        let mut offset = 0u64;
        for (name, dims, dtype, bytes) in &self.tensors {
            put_str(out, name);
            put_u32(out, dims.len() as u32);
            dims.iter().for_each(|&d| put_u64(out, d));
            put_u32(out, dtype.id());
            put_u64(out, offset);
            offset = align_up(offset + bytes.len() as u64, align).unwrap_or(u64::MAX);
        }
    }

    /// Padding to the data section, then each tensor padded to the alignment.
    fn put_tensor_data(&self, out: &mut Vec<u8>, align: u64) {
        pad_to(out, align);
        for (_, _, _, bytes) in &self.tensors {
            out.extend_from_slice(bytes);
            pad_to(out, align);
        }
    }
}

/// Whether every element of an array (at this level) has the same type.
fn is_homogeneous(value: &MetadataValue) -> bool {
    match value.as_array() {
        Some([first, rest @ ..]) => rest.iter().all(|v| type_id(v) == type_id(first)),
        _ => true,
    }
}

/// The GGUF value type id of `value`.
fn type_id(value: &MetadataValue) -> u32 {
    use value_type::*;
    match value {
        MetadataValue::U8(_) => U8,
        MetadataValue::I8(_) => I8,
        MetadataValue::U16(_) => U16,
        MetadataValue::I16(_) => I16,
        MetadataValue::U32(_) => U32,
        MetadataValue::I32(_) => I32,
        MetadataValue::U64(_) => U64,
        MetadataValue::I64(_) => I64,
        MetadataValue::F32(_) => F32,
        MetadataValue::F64(_) => F64,
        MetadataValue::Bool(_) => BOOL,
        MetadataValue::String(_) => STRING,
        MetadataValue::Array(_) => ARRAY,
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn put_kv(out: &mut Vec<u8>, key: &str, value: &MetadataValue) {
    put_str(out, key);
    put_u32(out, type_id(value));
    put_value(out, value);
}

/// A value without its type id. An empty array is written with element type u8.
fn put_value(out: &mut Vec<u8>, value: &MetadataValue) {
    match value {
        MetadataValue::U8(v) => out.push(*v),
        MetadataValue::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetadataValue::Bool(v) => out.push(u8::from(*v)),
        MetadataValue::String(s) => put_str(out, s),
        MetadataValue::Array(items) => {
            put_u32(out, items.first().map_or(value_type::U8, type_id));
            put_u64(out, items.len() as u64);
            items.iter().for_each(|v| put_value(out, v));
        }
    }
}

/// Zero bytes up to the next multiple of `align`.
fn pad_to(out: &mut Vec<u8>, align: u64) {
    let target = align_up(out.len() as u64, align).unwrap_or(out.len() as u64);
    out.resize(target as usize, 0);
}

/// Writes `bytes` to `path` atomically: a uniquely named temporary file beside it (`.name.PID-N.tmp`,
/// so concurrent writers never share one), fsync, rename, then an fsync of the folder so the
/// rename itself survives a crash. A reader sees the old file or the new one, never a part.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = temp_path(path);
    let result = write_synced(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return result;
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// A unique temporary name next to `path`, so the final rename stays on one file system.
fn temp_path(path: &Path) -> std::path::PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.{}-{n}.tmp", std::process::id()))
}

/// Writes `bytes` to `path` and flushes them to disk.
fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}
