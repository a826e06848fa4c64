//! GGUF v2/v3 reader (memory-mapped, validated before use) and a writer used by tests and tools.
//! Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
//!
//! OWNER: gguf helper. Interface below is fixed; fill in the bodies.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::kernels::GgmlType;
use crate::{Error, Result};

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
    pub fn as_u64(&self) -> Option<u64> { todo!() }
    pub fn as_i64(&self) -> Option<i64> { todo!() }
    /// Any float or integer, as f64.
    pub fn as_f64(&self) -> Option<f64> { todo!() }
    pub fn as_str(&self) -> Option<&str> { todo!() }
    pub fn as_bool(&self) -> Option<bool> { todo!() }
    pub fn as_array(&self) -> Option<&[MetadataValue]> { todo!() }
    /// JSON form (arrays as JSON arrays, u64/i64 as numbers).
    pub fn to_json(&self) -> serde_json::Value { todo!() }
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
    pub fn n_elements(&self) -> u64 { self.dims.iter().product() }
}

/// Bytes of the file, memory-mapped (or owned, for files built in memory by tests).
pub enum Storage {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
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
    pub path: PathBuf,
    pub version: u32,
    /// Key order is sorted (BTreeMap) for stable output.
    pub metadata: BTreeMap<String, MetadataValue>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the tensor data section.
    pub data_offset: u64,
    storage: Arc<Storage>,
}

impl GgufFile {
    /// Opens and validates a file. Every failure is `Error::GgufInvalid` naming the file and the
    /// problem (or `Error::Io`/`ModelNotFound` when it cannot be opened). Never panics.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> { todo!() }
    /// Parses bytes already in memory (tests); `path` is only used in error messages.
    pub fn from_bytes(bytes: Vec<u8>, path: impl Into<PathBuf>) -> Result<Self> { todo!() }
    pub fn get(&self, key: &str) -> Option<&MetadataValue> { self.metadata.get(key) }
    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> { self.get("general.architecture").and_then(|v| v.as_str()) }
    /// Typed getters: missing key or wrong type -> `Error::GgufInvalid` naming the key.
    pub fn get_u64(&self, key: &str) -> Result<u64> { todo!() }
    pub fn get_f64(&self, key: &str) -> Result<f64> { todo!() }
    pub fn get_str(&self, key: &str) -> Result<&str> { todo!() }
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> { todo!() }
    /// The tensor's bytes (validated at open, so this cannot go out of bounds).
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] { todo!() }
    /// Shared handle to the whole file's bytes, so weights can borrow them without copying.
    pub fn storage(&self) -> Arc<Storage> { self.storage.clone() }
    /// All metadata as a JSON object.
    pub fn metadata_json(&self) -> serde_json::Value { todo!() }
}
