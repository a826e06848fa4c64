//! GGUF v2/v3 reader (memory-mapped, validated before use) and a writer used by tests and tools.
//! Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use crate::backend::cpu::GgmlType;
use crate::{Error, Result};

mod reader;
pub mod writer;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<MetadataValue>),
}

impl MetadataValue {
    /// Any integer type that fits, else None.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// Any integer type that fits, else None.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|v| i64::try_from(v).ok())
    }

    /// Any float or integer, as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(f64::from(v)),
            Self::F64(v) => Some(v),
            _ => self.as_i128().map(|v| v as f64),
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// The bool, if this is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The elements, if this is an array.
    pub fn as_array(&self) -> Option<&[MetadataValue]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }

    /// JSON form (arrays as JSON arrays, u64/i64 as numbers). Non-finite floats become `null`.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Self::U64(v) => J::from(*v),
            Self::I64(v) => J::from(*v),
            Self::F32(v) => float_json(f64::from(*v)),
            Self::F64(v) => float_json(*v),
            Self::Bool(b) => J::Bool(*b),
            Self::String(s) => J::String(s.clone()),
            Self::Array(a) => J::Array(a.iter().map(Self::to_json).collect()),
            other => other.as_i64().map_or(J::Null, J::from),
        }
    }

    /// The GGUF name of this value's type, for error messages ("u32", "string", "array"...).
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::U8(_) => "u8",
            Self::I8(_) => "i8",
            Self::U16(_) => "u16",
            Self::I16(_) => "i16",
            Self::U32(_) => "u32",
            Self::I32(_) => "i32",
            Self::U64(_) => "u64",
            Self::I64(_) => "i64",
            Self::F32(_) => "f32",
            Self::F64(_) => "f64",
            Self::Bool(_) => "bool",
            Self::String(_) => "string",
            Self::Array(_) => "array",
        }
    }

    /// Any integer type, widened to i128.
    fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Self::U8(v) => v.into(),
            Self::I8(v) => v.into(),
            Self::U16(v) => v.into(),
            Self::I16(v) => v.into(),
            Self::U32(v) => v.into(),
            Self::I32(v) => v.into(),
            Self::U64(v) => v.into(),
            Self::I64(v) => v.into(),
            _ => return None,
        })
    }
}

/// A float as JSON (`null` when not finite).
fn float_json(v: f64) -> serde_json::Value {
    serde_json::Number::from_f64(v).map_or(serde_json::Value::Null, serde_json::Value::Number)
}

/// A tensor's header entry, validated: `offset..offset+size` lies inside the file.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the innermost (row length), `dims[1]` the number of rows.
    pub dims: Vec<u64>,
    pub dtype: GgmlType,
    /// Absolute byte offset in the file.
    pub offset: u64,
    /// Byte size, from dims and dtype.
    pub size: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// Bytes of the file, memory-mapped (or owned, for files built in memory by tests).
pub enum Storage {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    /// Tells the OS that bytes `offset..offset + len` are not needed for now: mapped file pages
    /// leave the process's memory and are read back from the file on the next access (the
    /// mapping is read-only, so no data is lost). Owned bytes are kept.
    pub fn release(&self, offset: usize, len: usize) {
        #[cfg(unix)]
        if let Storage::Mmap(m) = self {
            if offset.checked_add(len).is_some_and(|e| e <= m.len()) {
                // SAFETY: the map is a read-only file mapping that nobody writes, so dropping its
                // pages cannot change what a later read sees. Failure only means the pages stay.
                let _ = unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len) };
            }
        }
        #[cfg(not(unix))]
        let _ = (offset, len);
    }
}

impl std::ops::Deref for Storage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// An open, validated GGUF file.
pub struct GgufFile {
    /// Where it was opened from (used in error messages).
    pub path: PathBuf,
    /// GGUF version: 2 or 3.
    pub version: u32,
    /// Key order is sorted (BTreeMap) for stable output.
    pub metadata: BTreeMap<String, MetadataValue>,
    /// Tensors in file order.
    pub tensors: Vec<TensorInfo>,
    /// Alignment of tensor data (`general.alignment`, default 32).
    pub alignment: u64,
    /// Absolute offset of the tensor data section.
    pub data_offset: u64,
    /// Whether [`Self::drop_large_arrays`] took arrays out of `metadata`.
    trimmed: bool,
    storage: Arc<Storage>,
}

impl GgufFile {
    /// Opens and validates a file. Every failure is `Error::GgufInvalid` naming the file and the
    /// problem (or `Error::Io`/`ModelNotFound` when it cannot be opened). Never panics.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let storage = map_file(path)?;
        Self::parse(Storage::Mmap(storage), path.to_path_buf())
    }

    /// Parses bytes already in memory (tests); `path` is only used in error messages.
    pub fn from_bytes(bytes: Vec<u8>, path: impl Into<PathBuf>) -> Result<Self> {
        Self::parse(Storage::Owned(bytes), path.into())
    }

    /// Validates the header of `storage` and builds the file.
    fn parse(storage: Storage, path: PathBuf) -> Result<Self> {
        let header = reader::parse(&storage).map_err(|msg| Error::gguf(&path, msg))?;
        Ok(Self {
            path,
            version: header.version,
            metadata: header.metadata,
            tensors: header.tensors,
            alignment: header.alignment,
            data_offset: header.data_offset,
            trimmed: false,
            storage: Arc::new(storage),
        })
    }

    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.metadata.get(key)
    }
    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(|v| v.as_str())
    }
    /// Typed getters: missing key or wrong type -> `Error::GgufInvalid` naming the key.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.typed(key, "an unsigned integer", MetadataValue::as_u64)
    }

    /// A number (float or integer) as f64.
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        self.typed(key, "a number", MetadataValue::as_f64)
    }

    /// A string.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.typed(key, "a string", MetadataValue::as_str)
    }

    /// Looks `key` up and converts it, with an error naming the key when missing or mistyped.
    fn typed<'a, T>(&'a self, key: &str, expected: &str, convert: impl FnOnce(&'a MetadataValue) -> Option<T>) -> Result<T> {
        let value = self.get(key).ok_or_else(|| Error::gguf(&self.path, format!("missing metadata key '{key}'")))?;
        convert(value).ok_or_else(|| Error::gguf(&self.path, format!("metadata key '{key}' has type {}, expected {expected}", value.type_name())))
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The tensor's bytes (validated at open, so this cannot go out of bounds). A `TensorInfo`
    /// that did not come from this file and lies outside it gives an empty slice.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        let start = usize::try_from(info.offset).ok();
        let end = start.zip(usize::try_from(info.size).ok()).and_then(|(s, n)| s.checked_add(n));
        match (start, end) {
            (Some(s), Some(e)) => self.storage.get(s..e).unwrap_or(&[]),
            _ => &[],
        }
    }
    /// Shared handle to the whole file's bytes, so weights can borrow them without copying.
    pub fn storage(&self) -> Arc<Storage> {
        self.storage.clone()
    }
    /// All metadata as a JSON object (read again from the file's bytes where
    /// [`Self::drop_large_arrays`] took some out).
    pub fn metadata_json(&self) -> serde_json::Value {
        let reread = if self.trimmed { reader::parse(&self.storage).ok().map(|h| h.metadata) } else { None };
        let metadata = reread.as_ref().unwrap_or(&self.metadata);
        let map = metadata.iter().map(|(k, v)| (k.clone(), v.to_json())).collect();
        serde_json::Value::Object(map)
    }

    /// Takes the metadata arrays of more than `max_len` elements out of `metadata` (a large
    /// vocabulary's tokens, scores and types: 33 MB parsed for Gemma 3's 262,144 tokens), once
    /// what needs them (the tokenizer) is built; [`Self::metadata_json`] still gives them, read
    /// again from the file.
    pub fn drop_large_arrays(&mut self, max_len: usize) {
        let before = self.metadata.len();
        self.metadata.retain(|_, v| !matches!(v, MetadataValue::Array(a) if a.len() > max_len));
        self.trimmed |= self.metadata.len() != before;
    }
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

/// Opens and memory-maps `path`: `ModelNotFound` when it does not exist, `Io` on other failures.
fn map_file(path: &Path) -> Result<memmap2::Mmap> {
    let io_err = |source: std::io::Error| Error::Io { path: path.to_path_buf(), source };
    let file = std::fs::File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::ModelNotFound(path.display().to_string()),
        _ => io_err(e),
    })?;
    let meta = file.metadata().map_err(io_err)?;
    if !meta.is_file() {
        return Err(Error::gguf(path, "not a regular file"));
    }
    if meta.len() == 0 {
        return Err(Error::gguf(path, "the file is empty (0 bytes)"));
    }
    // SAFETY: the map is read-only; like every mmap-based model loader we assume the file is
    // not truncated or rewritten by another process while it is open.
    unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)
}
