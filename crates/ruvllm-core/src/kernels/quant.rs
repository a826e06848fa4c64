//! Block formats of ggml (layouts as in ggml-common.h) and their scalar dequantization.
//! OWNER: kernels helper.

use super::GgmlType;

/// Dequantizes `dst.len()` elements (a multiple of the block size) from `src`.
/// Supports F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) { todo!() }

/// Quantizes f32 data into `ty` (reference quantizers, as ggml's `quantize_row_*_ref`), used by
/// tests to build synthetic weights. Supports the same types as `dequantize`.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Vec<u8> { todo!() }
