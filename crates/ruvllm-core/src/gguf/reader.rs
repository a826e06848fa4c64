//! Parsing and validation of a GGUF header. Every read is bounds-checked, and every count or
//! length is checked against the bytes left in the file before anything is allocated, so a
//! corrupt or hostile file gives an error message, never a panic or a huge allocation.
//!
//! Errors are plain `String`s here; `GgufFile` turns them into `Error::GgufInvalid` with the path.

use std::collections::{BTreeMap, HashSet};

use super::{MetadataValue, TensorInfo};
use crate::backend::cpu::GgmlType;

/// The four magic bytes at the start of every GGUF file.
pub(super) const MAGIC: &[u8; 4] = b"GGUF";
/// The version the writer produces.
pub(super) const WRITE_VERSION: u32 = 3;
/// Alignment of tensor data when `general.alignment` is absent.
pub(super) const DEFAULT_ALIGNMENT: u64 = 32;
/// Metadata key that overrides the alignment.
pub(super) const ALIGNMENT_KEY: &str = "general.alignment";
/// ggml tensors have at most this many dimensions.
const MAX_DIMS: u32 = 4;
/// How deep arrays of arrays may nest.
const MAX_ARRAY_DEPTH: usize = 8;
/// Smallest possible metadata entry: key length (8) + value type (4) + a one-byte value.
const MIN_KV_BYTES: u64 = 13;
/// Smallest possible tensor entry: name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
const MIN_TENSOR_BYTES: u64 = 32;
/// Longest metadata key the GGUF format allows.
const MAX_KEY_LEN: u64 = 65_535;
/// Longest tensor name the GGUF format allows (ggml's `GGML_MAX_NAME`).
const MAX_TENSOR_NAME_LEN: u64 = 64;
/// Array elements in all the metadata. Each parsed element takes a `MetadataValue` (32 bytes)
/// however few bytes it has in the file (one, for a u8), so without a budget a large file of
/// small elements would take many times its size in memory. The largest vocabularies (Gemma 3:
/// 262,144 tokens, each with a score and a type, and byte-level BPE merges) stay far below it.
const MAX_ARRAY_VALUES: u64 = 1 << 23;
/// Vectors sized from a count read from the file start at most this large and grow as elements
/// actually parse: the count is checked against the bytes left, but each parsed element takes
/// more memory than its minimum size in the file, so trusting the count would let a corrupt
/// count reserve several times the file size before the first element fails to parse.
const MAX_PREALLOC: usize = 1 << 16;

/// GGUF metadata value type ids.
pub(super) mod value_type {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// The fewest bytes one value of type `ty` takes in a file; `None` for unknown types.
fn min_encoded_size(ty: u32) -> Option<u64> {
    use value_type::*;
    Some(match ty {
        U8 | I8 | BOOL => 1,
        U16 | I16 => 2,
        U32 | I32 | F32 => 4,
        U64 | I64 | F64 | STRING => 8,
        ARRAY => 12,
        _ => return None,
    })
}

/// A parsed and validated header.
pub(super) struct Header {
    pub version: u32,
    pub metadata: BTreeMap<String, MetadataValue>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    pub data_offset: u64,
}

/// A tensor entry as read, before validation against the file.
struct RawTensor {
    name: String,
    dims: Vec<u64>,
    type_id: u32,
    /// Relative to the start of the data section.
    offset: u64,
}

/// Parses and validates the whole header of `bytes`.
pub(super) fn parse(bytes: &[u8]) -> Result<Header, String> {
    let mut cur = Cursor { bytes, pos: 0, array_values_left: MAX_ARRAY_VALUES };
    let version = read_preamble(&mut cur)?;
    let (tensor_count, kv_count) = read_counts(&mut cur)?;
    let metadata = read_metadata(&mut cur, kv_count)?;
    let raw = read_tensor_infos(&mut cur, tensor_count)?;
    let alignment = alignment_of(&metadata)?;
    let data_offset = align_up(cur.pos as u64, alignment).ok_or_else(|| "the data section offset overflows".to_string())?;
    let tensors = validate_tensors(raw, data_offset, alignment, bytes.len() as u64)?;
    Ok(Header { version, metadata, tensors, alignment, data_offset })
}

/// Checks the magic and the version; returns the version.
fn read_preamble(cur: &mut Cursor<'_>) -> Result<u32, String> {
    let len = cur.bytes.len();
    if len == 0 {
        return Err("the file is empty (0 bytes)".into());
    }
    if len < 4 || &cur.bytes[..4] != MAGIC {
        let shown = &cur.bytes[..len.min(4)];
        return Err(format!(
            "not a GGUF file: the first bytes are {} ({}), expected 47 47 55 46 (\"GGUF\")",
            hex(shown),
            String::from_utf8_lossy(shown).escape_debug()
        ));
    }
    cur.pos = 4;
    let version = cur.u32("the version")?;
    check_version(version)?;
    Ok(version)
}

/// Accepts versions 2 and 3.
fn check_version(version: u32) -> Result<(), String> {
    match version {
        2 | 3 => Ok(()),
        1 => Err("GGUF version 1 is not supported (it is obsolete); re-convert the model with a \
                  current llama.cpp to get version 3"
            .into()),
        v if matches!(v.swap_bytes(), 2 | 3) => Err(format!(
            "GGUF version field reads {v}: this looks like a big-endian GGUF (version {}), \
             which is not supported",
            v.swap_bytes()
        )),
        v => Err(format!("unsupported GGUF version {v} (supported: 2 and 3)")),
    }
}

/// Reads tensor and metadata counts and checks that the file could possibly hold them.
fn read_counts(cur: &mut Cursor<'_>) -> Result<(u64, u64), String> {
    let tensor_count = cur.u64("the tensor count")?;
    let kv_count = cur.u64("the metadata count")?;
    let left = cur.remaining() as u64;
    let file = cur.bytes.len();
    if tensor_count > left / MIN_TENSOR_BYTES {
        return Err(format!(
            "tensor count {tensor_count} is impossible: the file has {file} bytes and each tensor \
             entry needs at least {MIN_TENSOR_BYTES}"
        ));
    }
    if kv_count > left / MIN_KV_BYTES {
        return Err(format!(
            "metadata count {kv_count} is impossible: the file has {file} bytes and each metadata \
             entry needs at least {MIN_KV_BYTES}"
        ));
    }
    let needed = u128::from(tensor_count) * u128::from(MIN_TENSOR_BYTES) + u128::from(kv_count) * u128::from(MIN_KV_BYTES);
    if needed > u128::from(left) {
        return Err(format!("{tensor_count} tensors and {kv_count} metadata entries cannot fit in a file of {file} bytes"));
    }
    Ok((tensor_count, kv_count))
}

/// Reads `count` key/value pairs, rejecting duplicate keys.
fn read_metadata(cur: &mut Cursor<'_>, count: u64) -> Result<BTreeMap<String, MetadataValue>, String> {
    let mut map = BTreeMap::new();
    for i in 0..count {
        let key = cur.string_max("a metadata key", MAX_KEY_LEN).map_err(|e| format!("metadata entry {i}: {e}"))?;
        let value = read_kv_value(cur).map_err(|e| format!("metadata key '{key}': {e}"))?;
        if map.contains_key(&key) {
            return Err(format!("duplicate metadata key '{key}'"));
        }
        map.insert(key, value);
    }
    Ok(map)
}

/// Reads a value type and the value.
fn read_kv_value(cur: &mut Cursor<'_>) -> Result<MetadataValue, String> {
    let ty = cur.u32("the value type")?;
    cur.value(ty, 0)
}

/// Reads `count` tensor entries (not yet validated against the file).
fn read_tensor_infos(cur: &mut Cursor<'_>, count: u64) -> Result<Vec<RawTensor>, String> {
    let mut out = Vec::with_capacity(prealloc(count));
    for i in 0..count {
        let name = cur.string_max("a tensor name", MAX_TENSOR_NAME_LEN).map_err(|e| format!("tensor entry {i}: {e}"))?;
        let (dims, type_id, offset) = read_tensor_fields(cur, &name)?;
        out.push(RawTensor { name, dims, type_id, offset });
    }
    Ok(out)
}

/// Reads the dims, type id and relative offset that follow a tensor's name.
fn read_tensor_fields(cur: &mut Cursor<'_>, name: &str) -> Result<(Vec<u64>, u32, u64), String> {
    let ctx = |e: String| format!("tensor '{name}': {e}");
    let n_dims = cur.u32("the number of dimensions").map_err(ctx)?;
    if !(1..=MAX_DIMS).contains(&n_dims) {
        return Err(format!("tensor '{name}' has {n_dims} dimensions (must be 1 to {MAX_DIMS})"));
    }
    let dims = (0..n_dims).map(|_| cur.u64("a dimension")).collect::<Result<Vec<_>, _>>().map_err(ctx)?;
    let type_id = cur.u32("the tensor type").map_err(ctx)?;
    let offset = cur.u64("the tensor offset").map_err(ctx)?;
    Ok((dims, type_id, offset))
}

/// `general.alignment` if present (must be a u32 power of two), else the default.
fn alignment_of(metadata: &BTreeMap<String, MetadataValue>) -> Result<u64, String> {
    match metadata.get(ALIGNMENT_KEY) {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(MetadataValue::U32(a)) if a.is_power_of_two() => Ok(u64::from(*a)),
        Some(MetadataValue::U32(a)) => Err(format!("{ALIGNMENT_KEY} is {a}, which is not a power of two")),
        Some(other) => Err(format!("{ALIGNMENT_KEY} must be a u32, but it is {}", other.type_name())),
    }
}

/// Validates every tensor against the file and rejects duplicate names.
fn validate_tensors(raw: Vec<RawTensor>, data_offset: u64, alignment: u64, file_len: u64) -> Result<Vec<TensorInfo>, String> {
    let mut seen = HashSet::with_capacity(raw.len());
    for t in &raw {
        if !seen.insert(t.name.as_str()) {
            return Err(format!("duplicate tensor name '{}'", t.name));
        }
    }
    raw.into_iter().map(|t| validate_tensor(t, data_offset, alignment, file_len)).collect()
}

/// Checks one tensor's dims, type, size and placement.
fn validate_tensor(t: RawTensor, data_offset: u64, alignment: u64, file_len: u64) -> Result<TensorInfo, String> {
    let name = &t.name;
    let n_elements = element_count(name, &t.dims)?;
    let dtype = GgmlType::from_id(t.type_id).ok_or_else(|| format!("tensor '{name}' has unknown ggml type id {}", t.type_id))?;
    let size = byte_size(name, &t.dims, n_elements, dtype)?;
    if !t.offset.is_multiple_of(alignment) {
        return Err(format!("tensor '{name}' offset {} is not a multiple of the alignment {alignment}", t.offset));
    }
    let offset = data_offset.checked_add(t.offset);
    let end = offset.and_then(|o| o.checked_add(size));
    match (offset, end) {
        (Some(offset), Some(end)) if end <= file_len => Ok(TensorInfo { name: t.name, dims: t.dims, dtype, offset, size }),
        _ => Err(format!(
            "tensor '{name}' data (offset {}, {size} bytes) extends past the end of the file ({file_len} bytes)",
            u128::from(data_offset) + u128::from(t.offset)
        )),
    }
}

/// Product of the dims; each must be at least 1 and the product must fit in an i64 (as in ggml).
fn element_count(name: &str, dims: &[u64]) -> Result<u64, String> {
    let mut n: u64 = 1;
    for (i, &d) in dims.iter().enumerate() {
        if d == 0 {
            return Err(format!("tensor '{name}' dimension {i} is 0 (dims {dims:?})"));
        }
        n = n.checked_mul(d).filter(|&n| n <= i64::MAX as u64).ok_or_else(|| format!("tensor '{name}' element count overflows (dims {dims:?})"))?;
    }
    Ok(n)
}

/// Bytes of the tensor; rows must be whole blocks of the type.
fn byte_size(name: &str, dims: &[u64], n_elements: u64, dtype: GgmlType) -> Result<u64, String> {
    let block = dtype.block_size() as u64;
    let row = dims.first().copied().unwrap_or(1);
    if !row.is_multiple_of(block) {
        return Err(format!("tensor '{name}' row length {row} is not a multiple of the {} block size {block}", dtype.name()));
    }
    dtype.bytes_for(n_elements).ok_or_else(|| format!("tensor '{name}' byte size overflows (dims {dims:?}, type {})", dtype.name()))
}

/// Initial capacity for `count` elements read from the file (see `MAX_PREALLOC`).
fn prealloc(count: u64) -> usize {
    usize::try_from(count).map_or(MAX_PREALLOC, |n| n.min(MAX_PREALLOC))
}

/// Rounds `n` up to a multiple of `align` (a power of two).
pub(super) fn align_up(n: u64, align: u64) -> Option<u64> {
    Some(n.checked_add(align - 1)? & !(align - 1))
}

/// Bytes as space-separated hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
}

/// A bounds-checked little-endian reader over the file.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// What is left of `MAX_ARRAY_VALUES`.
    array_values_left: u64,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// The next `n` bytes; `what` names the field for the error message.
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        if n > self.remaining() {
            return Err(format!("the file is truncated: {what} needs {n} bytes at offset {}, but the file ends at {}", self.pos, self.bytes.len()));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A u64 length then that many bytes of UTF-8; the length is checked before allocating.
    fn string(&mut self, what: &str) -> Result<String, String> {
        self.string_max(what, u64::MAX)
    }

    /// A string of at most `max` bytes (keys and tensor names have a limit in the format).
    fn string_max(&mut self, what: &str, max: u64) -> Result<String, String> {
        let at = self.pos;
        let len = self.u64(what)?;
        if len > max {
            return Err(format!("{what} at offset {at} has length {len}; the GGUF format allows at most {max} bytes"));
        }
        if len > self.remaining() as u64 {
            return Err(format!("{what} at offset {at} has length {len}, more than the {} bytes left in the file", self.remaining()));
        }
        let raw = self.take(len as usize, what)?;
        std::str::from_utf8(raw).map(str::to_owned).map_err(|e| format!("{what} at offset {at} is not valid UTF-8 ({e})"))
    }

    /// One value of type `ty`; `depth` is the current array nesting.
    fn value(&mut self, ty: u32, depth: usize) -> Result<MetadataValue, String> {
        use value_type::*;
        use MetadataValue as V;
        Ok(match ty {
            U8 => V::U8(u8::from_le_bytes(self.array("a u8 value")?)),
            I8 => V::I8(i8::from_le_bytes(self.array("an i8 value")?)),
            U16 => V::U16(u16::from_le_bytes(self.array("a u16 value")?)),
            I16 => V::I16(i16::from_le_bytes(self.array("an i16 value")?)),
            U32 => V::U32(u32::from_le_bytes(self.array("a u32 value")?)),
            I32 => V::I32(i32::from_le_bytes(self.array("an i32 value")?)),
            U64 => V::U64(u64::from_le_bytes(self.array("a u64 value")?)),
            I64 => V::I64(i64::from_le_bytes(self.array("an i64 value")?)),
            F32 => V::F32(f32::from_le_bytes(self.array("an f32 value")?)),
            F64 => V::F64(f64::from_le_bytes(self.array("an f64 value")?)),
            BOOL => V::Bool(self.bool()?),
            STRING => V::String(self.string("a string value")?),
            ARRAY => V::Array(self.array_value(depth)?),
            other => return Err(format!("unknown value type {other}")),
        })
    }

    /// A bool byte, which must be 0 or 1.
    fn bool(&mut self) -> Result<bool, String> {
        let at = self.pos;
        match self.array::<1>("a bool value")? {
            [0] => Ok(false),
            [1] => Ok(true),
            [b] => Err(format!("bool value at offset {at} is {b}, expected 0 or 1")),
        }
    }

    /// Element type, length, then the elements; the length is checked before allocating.
    fn array_value(&mut self, depth: usize) -> Result<Vec<MetadataValue>, String> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(format!("arrays are nested more than {MAX_ARRAY_DEPTH} levels deep"));
        }
        let at = self.pos;
        let elem = self.u32("an array element type")?;
        let len = self.u64("an array length")?;
        let min = min_encoded_size(elem).ok_or_else(|| format!("array at offset {at} has unknown element type {elem}"))?;
        if len > self.remaining() as u64 / min {
            return Err(format!(
                "array at offset {at} claims {len} elements of type {elem}, which cannot fit in the {} bytes left in the file",
                self.remaining()
            ));
        }
        self.array_values_left = self
            .array_values_left
            .checked_sub(len)
            .ok_or_else(|| format!("array at offset {at} has {len} elements, which takes the metadata past {MAX_ARRAY_VALUES} array elements in all"))?;
        if let Some(size) = fixed_numeric_size(elem) {
            // Fits: `len * size <= remaining` was checked above.
            let raw = self.take(len as usize * size, "array elements")?;
            return Ok(decode_numeric(raw, elem));
        }
        let mut out = Vec::with_capacity(prealloc(len));
        for i in 0..len {
            let v = self.value(elem, depth + 1).map_err(|e| format!("array element {i}: {e}"))?;
            out.push(v);
        }
        Ok(out)
    }
}

/// Byte size of numeric types that need no per-element validation (bool does), else `None`.
fn fixed_numeric_size(ty: u32) -> Option<usize> {
    use value_type::*;
    match ty {
        U8 | I8 => Some(1),
        U16 | I16 => Some(2),
        U32 | I32 | F32 => Some(4),
        U64 | I64 | F64 => Some(8),
        _ => None,
    }
}

/// Decodes a packed little-endian array of numeric type `ty` (the fast path for large arrays
/// such as token scores). `raw.len()` is a multiple of the type's size.
fn decode_numeric(raw: &[u8], ty: u32) -> Vec<MetadataValue> {
    use value_type::*;
    use MetadataValue as V;
    fn each<const N: usize>(raw: &[u8], f: impl Fn([u8; N]) -> MetadataValue) -> Vec<MetadataValue> {
        raw.chunks_exact(N)
            .map(|c| {
                let mut b = [0u8; N];
                b.copy_from_slice(c);
                f(b)
            })
            .collect()
    }
    match ty {
        U8 => raw.iter().map(|&b| V::U8(b)).collect(),
        I8 => each(raw, |b| V::I8(i8::from_le_bytes(b))),
        U16 => each(raw, |b| V::U16(u16::from_le_bytes(b))),
        I16 => each(raw, |b| V::I16(i16::from_le_bytes(b))),
        U32 => each(raw, |b| V::U32(u32::from_le_bytes(b))),
        I32 => each(raw, |b| V::I32(i32::from_le_bytes(b))),
        F32 => each(raw, |b| V::F32(f32::from_le_bytes(b))),
        U64 => each(raw, |b| V::U64(u64::from_le_bytes(b))),
        I64 => each(raw, |b| V::I64(i64::from_le_bytes(b))),
        F64 => each(raw, |b| V::F64(f64::from_le_bytes(b))),
        _ => Vec::new(), // only called for the types of `fixed_numeric_size`
    }
}
