//! Writes GGUF v3 files: used by tests to build tiny synthetic models, never committed blobs.
//! OWNER: gguf helper.

use super::MetadataValue;
use crate::kernels::GgmlType;

/// Builds a GGUF v3 file in memory.
#[derive(Default)]
pub struct GgufWriter {
    pub metadata: Vec<(String, MetadataValue)>,
    /// (name, dims in ggml order, type, raw bytes)
    pub tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
    pub alignment: u64,
}

impl GgufWriter {
    pub fn new() -> Self { Self { alignment: 32, ..Default::default() } }
    pub fn add_metadata(&mut self, key: &str, value: MetadataValue) -> &mut Self { todo!() }
    pub fn add_tensor(&mut self, name: &str, dims: &[u64], dtype: GgmlType, bytes: Vec<u8>) -> &mut Self { todo!() }
    /// Convenience: an F32 tensor.
    pub fn add_f32(&mut self, name: &str, dims: &[u64], data: &[f32]) -> &mut Self { todo!() }
    pub fn to_bytes(&self) -> Vec<u8> { todo!() }
    /// Writes atomically (temp file + rename).
    pub fn write(&self, path: &std::path::Path) -> std::io::Result<()> { todo!() }
}
