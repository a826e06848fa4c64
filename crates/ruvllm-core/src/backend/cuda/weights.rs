//! Weights on the device: which types the kernels run, Q8_0 repacked into the layout they
//! read, each weight uploaded once.

use super::*;

/// Q8_0 rows in the layout the kernels read (`T_Q8_0R` in kernels.cu): per 256 columns, the
/// eight f16 scales then the 256 values; rows padded to 16 bytes. Returns the bytes and the row
/// stride.
pub(super) fn repack_q8_0(src: &[u8], rows: usize, cols: usize) -> (Vec<u8>, usize) {
    let blocks = cols / 32;
    let chunks = cols.div_ceil(256);
    let stride = (chunks * 16 + cols).div_ceil(16) * 16;
    let mut out = vec![0u8; rows * stride];
    for r in 0..rows {
        let (row, dst) = (&src[r * blocks * 34..(r + 1) * blocks * 34], &mut out[r * stride..(r + 1) * stride]);
        for b in 0..blocks {
            let blk = &row[b * 34..(b + 1) * 34];
            let (c, k) = (b / 8, b % 8);
            let base = c * 272;
            dst[base + 2 * k..base + 2 * k + 2].copy_from_slice(&blk[..2]);
            let at = base + 16 + k * 32;
            dst[at..at + 32].copy_from_slice(&blk[2..]);
        }
    }
    (out, stride)
}

/// Kernel names by weight type (Q8_0 runs in its uploaded layout, `q8_0r`).
pub(super) fn type_suffix(ty: GgmlType) -> Option<&'static str> {
    Some(match ty {
        GgmlType::F32 => "f32",
        GgmlType::F16 => "f16",
        GgmlType::BF16 => "bf16",
        GgmlType::Q4_0 => "q4_0",
        GgmlType::Q4_1 => "q4_1",
        GgmlType::Q5_0 => "q5_0",
        GgmlType::Q5_1 => "q5_1",
        GgmlType::Q8_0 => "q8_0r",
        GgmlType::Q4_K => "q4_k",
        GgmlType::Q5_K => "q5_k",
        GgmlType::Q6_K => "q6_k",
        _ => return None,
    })
}

/// How the products round a weight type's activations (as the CPU path does): the kernel that
/// does it ahead of the tiled product, or none for float weights.
pub(super) fn act_kernel(ty: GgmlType) -> Option<&'static str> {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => Some("act_q8_0"),
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => Some("act_q8_k"),
        _ => None,
    }
}

/// Can the CUDA backend run a weight of this type and width?
pub(super) fn supports(ty: GgmlType, cols: usize) -> bool {
    type_suffix(ty).is_some() && cols.is_multiple_of(8)
}

/// An uploaded weight.
pub(super) struct DevWeight {
    pub(super) mem: DevMem,
    pub(super) row_bytes: usize,
}

impl CudaBackend {
    pub(super) fn weight(&mut self, w: &QWeight) -> Option<(CUdeviceptr, usize)> {
        let bytes = w.bytes();
        let key = (bytes.as_ptr() as usize, bytes.len());
        if !self.weights.contains_key(&key) {
            if type_suffix(w.ty).is_none() {
                self.fail(Error::Gpu { code: "ERR_GPU", msg: format!("the CUDA kernels do not run {} weights", w.ty.name()) });
                return None;
            }
            let (data, row_bytes) = if w.ty == GgmlType::Q8_0 { repack_q8_0(bytes, w.rows, w.cols) } else { (Vec::new(), w.row_size()) };
            let src = if data.is_empty() { bytes } else { &data };
            let mem = self.alloc(src.len())?;
            self.upload(mem.ptr, src);
            self.weights.insert(key, DevWeight { mem, row_bytes });
        }
        let d = &self.weights[&key];
        Some((d.mem.ptr, d.row_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::repack_q8_0;
    use crate::backend::cpu::{quant, GgmlType};

    /// Element `j` of a row in the uploaded Q8_0 layout, read as kernels.cu's `dq8<T_Q8_0R>` does.
    pub(super) fn read_q8_0r(row: &[u8], j: usize) -> f32 {
        let c = &row[(j / 256) * 272..];
        let e = j % 256;
        let d = half::f16::from_le_bytes([c[2 * (e / 32)], c[2 * (e / 32) + 1]]).to_f32();
        d * (c[16 + e] as i8) as f32
    }

    #[test]
    pub(super) fn q8_0_upload_layout_holds_every_value() {
        for cols in [32usize, 224, 256, 640, 1024] {
            let rows = 3;
            let mut state = 12345u32;
            let mut bytes = Vec::with_capacity(rows * cols / 32 * 34);
            for _ in 0..rows * cols / 32 {
                state = state.wrapping_mul(1664525).wrapping_add(1013904223);
                bytes.extend_from_slice(&half::f16::from_f32(0.001 + (state >> 20) as f32 * 1e-5).to_le_bytes());
                for _ in 0..32 {
                    state = state.wrapping_mul(1664525).wrapping_add(1013904223);
                    bytes.push((state >> 24) as u8);
                }
            }
            let (packed, stride) = repack_q8_0(&bytes, rows, cols);
            assert_eq!(stride % 16, 0);
            for r in 0..rows {
                let mut want = vec![0f32; cols];
                quant::dequantize(GgmlType::Q8_0, &bytes[r * cols / 32 * 34..(r + 1) * cols / 32 * 34], &mut want);
                for (j, w) in want.iter().enumerate() {
                    assert_eq!(read_q8_0r(&packed[r * stride..(r + 1) * stride], j), *w, "cols {cols} row {r} col {j}");
                }
            }
        }
    }
}
