//! The storage of one layer's cached keys and values, which the attention kernels read.

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::runtime::mem::HugeVec;

/// Element type of the cached keys and values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    /// IEEE half precision, rounded to nearest even on store: llama.cpp's default cache type,
    /// half the memory and attention traffic of f32.
    #[default]
    F16,
    /// Exact f32 (the reference: tests against f32 implementations use it).
    F32,
    /// ggml's q8_0 (llama.cpp's `--cache-type-k/v q8_0`): per 32 values an f16 scale and 32
    /// signed bytes, 1.06 bytes per value, about half of f16's memory. Rows must be a
    /// multiple of 32 values long.
    Q8_0,
}

impl KvType {
    /// The name `kvCacheType` takes: `f16`, `f32` or `q8_0`.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::F32 => "f32",
            KvType::Q8_0 => "q8_0",
        }
    }

    pub fn parse(s: &str) -> Option<KvType> {
        [KvType::F16, KvType::F32, KvType::Q8_0].into_iter().find(|t| t.name() == s)
    }

    /// Bytes of `n` cached values.
    pub fn bytes(self, n: usize) -> usize {
        match self {
            KvType::F16 => 2 * n,
            KvType::F32 => 4 * n,
            KvType::Q8_0 => n / Q8_BLOCK * std::mem::size_of::<KvQ8>(),
        }
    }
}

/// Values per [`KvQ8`] block.
pub const Q8_BLOCK: usize = 32;

/// A block of 32 cached values in ggml's q8_0 layout: `value[i] = d · qs[i]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KvQ8 {
    pub d: f16,
    pub qs: [i8; Q8_BLOCK],
}

impl KvQ8 {
    /// ggml's `quantize_row_q8_0_ref`: the scale maps the largest magnitude to 127, values
    /// rounded half away from zero.
    pub fn quantize(x: &[f32]) -> KvQ8 {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0i8; Q8_BLOCK];
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = (v * id).round() as i8;
        }
        KvQ8 { d: f16::from_f32(d), qs }
    }

    /// Writes the 32 values into `out`.
    #[inline]
    pub fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = d * q as f32;
        }
    }
}

/// The key and value rows of one layer, of one [`KvType`], on huge pages (runtime::mem):
/// decode's attention streams them every token.
pub enum KvRows {
    F16 {
        k: HugeVec<f16>,
        v: HugeVec<f16>,
    },
    F32 {
        k: HugeVec<f32>,
        v: HugeVec<f32>,
    },
    /// q8_0 blocks, `row / 32` per position.
    Q8 {
        k: HugeVec<KvQ8>,
        v: HugeVec<KvQ8>,
    },
    /// Rows in a GPU's memory, which only that backend's kernels read and write.
    Device(DeviceRows),
}

/// Keys and values held in device memory by a GPU backend: addresses, element size and the
/// release of the memory when the cache is dropped.
pub struct DeviceRows {
    pub k: u64,
    pub v: u64,
    /// Bytes per element (2: f16, 4: f32).
    pub elem: usize,
    /// Bytes of keys and values together.
    pub bytes: usize,
    release: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl DeviceRows {
    pub fn new(k: u64, v: u64, elem: usize, bytes: usize, release: Box<dyn FnOnce() + Send + Sync>) -> Self {
        DeviceRows { k, v, elem, bytes, release: Some(release) }
    }
}

impl Drop for DeviceRows {
    fn drop(&mut self) {
        if let Some(f) = self.release.take() {
            f();
        }
    }
}

/// Keys and values of one layer.
pub struct LayerCache {
    /// Number of slots; position `p` lives in slot `p % capacity`.
    pub capacity: usize,
    pub rows: KvRows,
}

impl LayerCache {
    /// `capacity` slots of `row` floats (keys and values each), stored as `ty`, zeroed.
    pub fn new(capacity: usize, row: usize, ty: KvType) -> Self {
        let n = capacity * row;
        let rows = match ty {
            KvType::F16 => KvRows::F16 { k: HugeVec::zeros(n), v: HugeVec::zeros(n) },
            KvType::F32 => KvRows::F32 { k: HugeVec::zeros(n), v: HugeVec::zeros(n) },
            KvType::Q8_0 => {
                assert!(row.is_multiple_of(Q8_BLOCK), "a q8_0 KV cache needs rows of a multiple of {Q8_BLOCK} values, not {row}");
                KvRows::Q8 { k: HugeVec::zeros(n / Q8_BLOCK), v: HugeVec::zeros(n / Q8_BLOCK) }
            }
        };
        LayerCache { capacity, rows }
    }

    /// Bytes held by the keys and values.
    pub fn bytes(&self) -> usize {
        match &self.rows {
            KvRows::F16 { k, v } => (k.len() + v.len()) * 2,
            KvRows::F32 { k, v } => (k.len() + v.len()) * 4,
            KvRows::Q8 { k, v } => (k.len() + v.len()) * std::mem::size_of::<KvQ8>(),
            KvRows::Device(d) => d.bytes,
        }
    }

    #[inline]
    pub fn slot(&self, pos: usize) -> usize {
        pos % self.capacity
    }

    /// Copies the key and value rows of positions `positions` from `src` (rows of `row`
    /// values of the same type, each cache holding those positions in its slots). `false`:
    /// nothing copied, the rows being in device memory or of different types.
    pub fn copy_positions(&mut self, src: &LayerCache, positions: std::ops::Range<usize>, row: usize) -> bool {
        fn copy<T: Copy>(dst: &mut [T], src: &[T], slots: impl Iterator<Item = (usize, usize)>, row: usize) {
            for (d, s) in slots {
                dst[d * row..(d + 1) * row].copy_from_slice(&src[s * row..(s + 1) * row]);
            }
        }
        let slots: Vec<_> = positions.map(|p| (self.slot(p), src.slot(p))).collect();
        match (&mut self.rows, &src.rows) {
            (KvRows::F16 { k, v }, KvRows::F16 { k: sk, v: sv }) => {
                copy(k, sk, slots.iter().copied(), row);
                copy(v, sv, slots.into_iter(), row);
            }
            (KvRows::F32 { k, v }, KvRows::F32 { k: sk, v: sv }) => {
                copy(k, sk, slots.iter().copied(), row);
                copy(v, sv, slots.into_iter(), row);
            }
            (KvRows::Q8 { k, v }, KvRows::Q8 { k: sk, v: sv }) => {
                copy(k, sk, slots.iter().copied(), row / Q8_BLOCK);
                copy(v, sv, slots.into_iter(), row / Q8_BLOCK);
            }
            _ => return false,
        }
        true
    }

    /// Stores the key and value rows of position `pos`.
    pub fn store(&mut self, pos: usize, k_row: &[f32], v_row: &[f32]) {
        let row = k_row.len();
        let s = self.slot(pos) * row;
        match &mut self.rows {
            KvRows::F16 { k, v } => {
                k[s..s + row].convert_from_f32_slice(k_row);
                v[s..s + row].convert_from_f32_slice(v_row);
            }
            KvRows::F32 { k, v } => {
                k[s..s + row].copy_from_slice(k_row);
                v[s..s + row].copy_from_slice(v_row);
            }
            KvRows::Q8 { k, v } => {
                let (s, nb) = (s / Q8_BLOCK, row / Q8_BLOCK);
                for (dst, src) in [(&mut k[s..s + nb], k_row), (&mut v[s..s + nb], v_row)] {
                    for (b, x) in dst.iter_mut().zip(src.chunks_exact(Q8_BLOCK)) {
                        *b = KvQ8::quantize(x);
                    }
                }
            }
            KvRows::Device(_) => panic!("LayerCache::store on a device cache (only its backend writes it)"),
        }
    }
}
