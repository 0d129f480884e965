//! GGML blocks the kernels do not decode, rewritten into ones they do.
//!
//! Q3_K holds, per 16 values, a 6-bit scale `sc` (used as `sc − 32`) and 3-bit quants `q`
//! (`w = d·(sc − 32)·(q − 4)`); Q6_K holds a signed 8-bit scale per 16 values and 6-bit quants
//! (`w = d·sc·(q − 32)`). With the same `d`, Q6_K scale `sc − 32` and quant `q + 28` give each
//! value exactly, so a Q3_K row runs on the Q6_K kernels, in 210 bytes per 256 values instead
//! of 110.

use super::QFormat;

/// Bytes of a Q3_K super-block: `hmask[32]`, `qs[64]`, `scales[12]`, `d: f16`.
pub const Q3_K_BYTES: usize = 110;

/// The 16 scales of a Q3_K block (6 bits each, unpacked as GGML's `dequantize_row_q3_K`), less 32.
fn q3_k_scales(scales: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let low = if i < 8 { scales[i] & 0x0f } else { scales[i - 8] >> 4 };
        let high = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = (low | high << 4) as i8 - 32;
    }
    out
}

/// One Q3_K super-block as the Q6_K block of the same values.
pub fn q3_k_to_q6_k(b: &[u8]) -> [u8; 210] {
    debug_assert_eq!(b.len(), Q3_K_BYTES);
    let (hmask, qs, scales) = (&b[0..32], &b[32..96], q3_k_scales(&b[96..108]));
    let mut out = [0u8; 210];
    for v in 0..256 {
        // Q3_K: value v = 128·n + 32·j + l of half n takes bits 2j of qs[32n + l] and bit
        // 4n + j of hmask[l]
        let (n, j, l) = (v / 128, (v % 128) / 32, v % 32);
        let q = ((qs[32 * n + l] >> (2 * j)) & 3) | (((hmask[l] >> (4 * n + j)) & 1) << 2);
        let q6 = q + 28;
        // Q6_K: the same value's low nibble in ql[64n + l + 32·(j % 2)] (high nibble for j ≥ 2),
        // its two high bits at bit 2j of qh[32n + l]
        let low = &mut out[64 * n + l + 32 * (j % 2)];
        *low |= (q6 & 0x0f) << (4 * (j / 2));
        out[128 + 32 * n + l] |= (q6 >> 4) << (2 * j);
    }
    for (i, s) in scales.iter().enumerate() {
        out[192 + i] = *s as u8;
    }
    out[208..210].copy_from_slice(&b[108..110]);
    out
}

/// Rows of Q3_K blocks (`data`) as Q6_K blocks: the format and bytes the kernels take.
pub fn q3_k_rows(data: &[u8]) -> (QFormat, Vec<u8>) {
    (QFormat::Q6_K, data.chunks_exact(Q3_K_BYTES).flat_map(q3_k_to_q6_k).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::quant::dequantise_row;
    use candle_core::quantized::{ggml_file, GgmlDType};

    /// Random Q3_K blocks (every byte pattern is a block; `d` kept finite) dequantised by candle
    /// (GGML's code) and their Q6_K rewrite dequantised here hold the same values, bit for bit.
    #[test]
    fn q3_k_blocks_become_q6_k_blocks_of_the_same_values() {
        let (rows, cols) = (6, 512);
        let mut s = 7u64;
        let mut data: Vec<u8> = (0..rows * cols / 256 * Q3_K_BYTES)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (s >> 33) as u8
            })
            .collect();
        for (i, block) in data.chunks_exact_mut(Q3_K_BYTES).enumerate() {
            let d = burn::tensor::f16::from_f32(0.01 * (i as f32 + 1.0) * if i % 2 == 0 { 1.0 } else { -1.0 });
            block[108..110].copy_from_slice(&d.to_bits().to_le_bytes());
        }
        let dev = candle_core::Device::Cpu;
        let want: Vec<f32> = ggml_file::qtensor_from_ggml(GgmlDType::Q3K, &data, vec![rows, cols], &dev)
            .unwrap()
            .dequantize(&dev)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let (format, widened) = q3_k_rows(&data);
        assert_eq!(widened.len(), rows * cols / 256 * 210);
        let mut got = vec![0f32; rows * cols];
        for (row, out) in widened.chunks_exact(cols / 256 * 210).zip(got.chunks_exact_mut(cols)) {
            dequantise_row(format, row, out);
        }
        assert_eq!(got, want);
        assert!(want.iter().any(|&v| v != 0.0));
    }
}
