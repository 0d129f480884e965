//! GGML's block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the k-quants Q4_K, Q5_K and Q6_K, and plain
//! f32 rows) and `x @ Wᵀ` with W's rows kept in their blocks; Q3_K rows are rewritten into Q6_K
//! blocks first (`widen`).
//!
//! Why: decoding one token reads every weight once, so a dequantised model is bound by memory
//! bandwidth and holds several times its file's size in memory (guides/pretrained.md).
//!
//! Quantised rows take llama.cpp's route: each activation row is quantised to 8 bits per block of
//! 32 (`q8`), and a block's products are summed in integers (`maddubs` on AVX2, `dpbusd` with
//! VNNI), then scaled once per block. The weights are kept with eight rows interleaved
//! (`packed`), so a block gives eight rows' sums in one register. The activations' rounding adds
//! at most `amax/254` per value of a block (`amax` its largest magnitude), the bound the tests
//! check against an f64 product of the dequantised weights.
//!
//! The k-quants' super-blocks of 256 hold sub-blocks of 32 (Q4_K, Q5_K: own 6-bit scale and min) or 16
//! (Q6_K: own 8-bit scale) that start on the activations' 32-blocks, so each activation block
//! meets one weight scale and offset (Q6_K: two scales, applied in integers): the same products as
//! Q4_1's, against the same Q8 blocks. llama.cpp quantises the activations per 256 for these
//! (Q8_K); per 32 is the finer grid of the two, so the bound above holds unchanged.
//!
//! F16 rows are regrouped too, and converted to f32 in registers against f32 activations
//! (`packed_f16`). F32 rows keep f32 activations
//! (`f32_dots`): nothing to decode, and a general matmul's packing of the weights would cost more
//! than the product when the activations are a few rows.

mod f32_dots;
mod isa;
mod grouped;
pub mod groups;
pub mod packed;
#[cfg(target_arch = "x86_64")]
mod packed_avx2;
mod packed_f16;
mod q8;
pub mod widen;

use burn::tensor::f16;
use candle_core::quantized::GgmlDType;

use crate::kernels::cpu::vector::{par_tasks, simd, SharedMut, PAR_MIN};
use packed::LANES;
pub use q8::Q8Rows;

/// Values per GGML block, and per sub-block of the k-quants' super-blocks: the unit of every
/// kernel here.
pub const BLOCK: usize = 32;

/// The GGML block formats this kernel decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
#[allow(non_camel_case_types)]
pub enum QFormat {
    /// `d: f16, qs: [u8; 16]`, `w = d·(q − 8)` with 4-bit `q`.
    Q4_0,
    /// `d: f16, m: f16, qs: [u8; 16]`, `w = d·q + m`.
    Q4_1,
    /// `d: f16, qs: [i8; 32]`, `w = d·q`.
    Q8_0,
    /// Plain f32 rows (blocks of 32 values, nothing to decode): a stack's f32 parts run through
    /// the same driver as its quantised ones.
    F32,
    /// `d: f16, qh: u32, qs: [u8; 16]`, `w = d·(q − 16)` with 5-bit `q` (bit `i` of `qh` is value
    /// `i`'s fifth bit).
    Q5_0,
    /// `d: f16, m: f16, qh: u32, qs: [u8; 16]`, `w = d·q + m`.
    Q5_1,
    /// Super-blocks of 256: `d, dmin: f16, scales: [u8; 12], qs: [u8; 128]`; sub-block `s` of 32
    /// has 6-bit scale `sc` and min `mn` (packed), `w = d·sc·q − dmin·mn` with 4-bit `q` (sub-blocks
    /// `2j` and `2j + 1` are the low and high nibbles of `qs[32j..32j + 32]`).
    Q4_K,
    /// Super-blocks of 256: `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16`;
    /// `w = d·sc·(q − 32)` with 6-bit `q` and one scale per 16 values.
    Q6_K,
    /// Q4_K's super-blocks with a fifth bit: `d, dmin: f16, scales: [u8; 12], qh: [u8; 32],
    /// qs: [u8; 128]`; bit `s` of `qh[j]` is value `j`'s fifth bit in sub-block `s`.
    Q5_K,
    /// Plain f16 rows: converted to f32 in registers, against f32 activations.
    F16,
}

impl QFormat {
    pub fn from_ggml(t: GgmlDType) -> Option<QFormat> {
        match t {
            GgmlDType::Q4_0 => Some(QFormat::Q4_0),
            GgmlDType::Q4_1 => Some(QFormat::Q4_1),
            GgmlDType::Q8_0 => Some(QFormat::Q8_0),
            GgmlDType::Q5_0 => Some(QFormat::Q5_0),
            GgmlDType::Q5_1 => Some(QFormat::Q5_1),
            GgmlDType::Q4K => Some(QFormat::Q4_K),
            GgmlDType::Q6K => Some(QFormat::Q6_K),
            GgmlDType::Q5K => Some(QFormat::Q5_K),
            GgmlDType::F16 => Some(QFormat::F16),
            _ => None,
        }
    }

    /// The format a kernel's `const F: u8` parameter names (`QFormat as u8`).
    #[inline(always)]
    pub(super) const fn of(f: u8) -> QFormat {
        match f {
            0 => QFormat::Q4_0,
            1 => QFormat::Q4_1,
            2 => QFormat::Q8_0,
            4 => QFormat::Q5_0,
            5 => QFormat::Q5_1,
            6 => QFormat::Q4_K,
            7 => QFormat::Q6_K,
            8 => QFormat::Q5_K,
            9 => QFormat::F16,
            _ => QFormat::F32,
        }
    }

    /// Values per block: 256 for the k-quants' super-blocks, else 32.
    pub const fn block_values(self) -> usize {
        match self {
            QFormat::Q4_K | QFormat::Q5_K | QFormat::Q6_K => 256,
            _ => BLOCK,
        }
    }

    /// 32-value sub-blocks per block.
    #[inline(always)]
    pub(super) const fn sub_blocks(self) -> usize {
        self.block_values() / BLOCK
    }

    /// Whether the weights have an offset (`m_w ≠ 0`) that the activations' sums multiply.
    #[inline(always)]
    pub(super) const fn has_offset(self) -> bool {
        !matches!(self, QFormat::Q8_0 | QFormat::Q6_K | QFormat::F32 | QFormat::F16)
    }

    pub const fn block_bytes(self) -> usize {
        match self {
            QFormat::Q4_0 => 18,
            QFormat::Q4_1 => 20,
            QFormat::Q8_0 => 34,
            QFormat::F32 => 4 * BLOCK,
            QFormat::Q5_0 => 22,
            QFormat::Q5_1 => 24,
            QFormat::Q4_K => 144,
            QFormat::Q6_K => 210,
            QFormat::Q5_K => 176,
            QFormat::F16 => 2 * BLOCK,
        }
    }

    /// A 32-value block's scale `d` and offset `m`, and where its quants start.
    #[inline(always)]
    pub(super) fn header(self, b: &[u8]) -> (f32, f32, usize) {
        let half = |i: usize| f16_at(b, i);
        match self {
            QFormat::Q4_0 => {
                let d = half(0);
                (d, -8.0 * d, 2)
            }
            QFormat::Q4_1 => (half(0), half(2), 4),
            QFormat::Q8_0 => (half(0), 0.0, 2),
            QFormat::F32 => (1.0, 0.0, 0),
            QFormat::Q5_0 => {
                let d = half(0);
                (d, -16.0 * d, 6)
            }
            QFormat::Q5_1 => (half(0), half(2), 8),
            QFormat::Q4_K | QFormat::Q5_K | QFormat::Q6_K => unreachable!("super-blocks take `sub_header`"),
            QFormat::F16 => unreachable!("f16 rows meet f32 activations"),
        }
    }

    /// Sub-block `s`'s scale and offset, `w = scale·q + offset` with `q` as `int_quants` gives
    /// it. Exact products of f16 and small integers, so dequantising with them gives GGML's values.
    #[inline(always)]
    pub(super) fn sub_header(self, b: &[u8], s: usize) -> (f32, f32) {
        match self {
            QFormat::Q4_K | QFormat::Q5_K => {
                let (sc, mn) = scale_min_k4(s, &b[4..16]);
                (f16_at(b, 0) * sc as f32, -(f16_at(b, 2) * mn as f32))
            }
            // the per-16 scales go into the integer quants
            QFormat::Q6_K => (f16_at(b, 208), 0.0),
            _ => {
                let (d, m, _) = self.header(b);
                (d, m)
            }
        }
    }

    /// Sub-block `s`'s 32 quants as integers: unsigned for the formats with an offset, Q8_0's
    /// signed bytes, Q6_K's `sc·(q − 32)`.
    #[inline(always)]
    pub(super) fn int_quants(self, b: &[u8], s: usize, out: &mut [i32; BLOCK]) {
        match self {
            QFormat::Q4_0 | QFormat::Q4_1 | QFormat::Q5_0 | QFormat::Q5_1 => {
                let (_, _, at) = self.header(b);
                let high = if matches!(self, QFormat::Q5_0 | QFormat::Q5_1) { u32::from_le_bytes(b[at - 4..at].try_into().unwrap()) } else { 0 };
                for j in 0..16 {
                    out[j] = (b[at + j] & 0x0f) as i32 | (((high >> j) & 1) << 4) as i32;
                    out[j + 16] = (b[at + j] >> 4) as i32 | (((high >> (j + 16)) & 1) << 4) as i32;
                }
            }
            QFormat::Q8_0 => (0..BLOCK).for_each(|j| out[j] = b[2 + j] as i8 as i32),
            QFormat::Q4_K | QFormat::Q5_K => {
                // Q5_K: `qh` between the scales and the nibbles
                let at = if self == QFormat::Q4_K { 16 } else { 48 };
                let qs = &b[at + 32 * (s / 2)..at + 32 * (s / 2) + 32];
                let shift = 4 * (s % 2);
                for (j, o) in out.iter_mut().enumerate() {
                    let fifth = if self == QFormat::Q5_K { ((b[16 + j] >> s) & 1) << 4 } else { 0 };
                    *o = (((qs[j] >> shift) & 0x0f) | fifth) as i32;
                }
            }
            QFormat::Q6_K => {
                for (j, o) in out.iter_mut().enumerate() {
                    let (sc, q) = q6_k_quant(b, s, j);
                    *o = sc * (q as i32 - 32);
                }
            }
            QFormat::F32 | QFormat::F16 => unreachable!("f32 and f16 rows meet f32 activations"),
        }
    }

    /// The 32 quants of a block as f32, unscaled (GGML order: low nibbles are values 0..16,
    /// high nibbles 16..32), for the formats f32 activations meet (`f32_dots`).
    #[inline(always)]
    pub(super) fn quants(self, b: &[u8], at: usize, out: &mut [f32; BLOCK]) {
        match self {
            QFormat::Q4_0 | QFormat::Q4_1 => {
                for j in 0..16 {
                    out[j] = (b[at + j] & 0x0f) as f32;
                    out[j + 16] = (b[at + j] >> 4) as f32;
                }
            }
            QFormat::Q8_0 => {
                for j in 0..BLOCK {
                    out[j] = b[at + j] as i8 as f32;
                }
            }
            QFormat::F32 => {
                for j in 0..BLOCK {
                    out[j] = f32::from_le_bytes(b[at + 4 * j..at + 4 * j + 4].try_into().unwrap());
                }
            }
            _ => unreachable!("f32 activations meet Q4_0, Q4_1, Q8_0 and f32 rows only"),
        }
    }
}

/// Q6_K's value `j` of sub-block `s`: its scale (one per 16 values) and 6-bit quant. Sub-block
/// `s` of the half `s / 4` takes the low or high nibbles of the half's first or second 32 bytes
/// of `ql`, and two bits of `qh`.
#[inline(always)]
pub(super) fn q6_k_quant(b: &[u8], s: usize, j: usize) -> (i32, u8) {
    let (half, c) = (s / 4, s % 4);
    let low = (b[64 * half + 32 * (c % 2) + j] >> (4 * (c / 2))) & 0x0f;
    let high = (b[128 + 32 * half + j] >> (2 * c)) & 3;
    (b[192 + 2 * s + j / 16] as i8 as i32, low | high << 4)
}

#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// Q4_K's 6-bit scale and min of sub-block `j` from the 12 packed bytes (GGML's
/// `get_scale_min_k4`).
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// One row of `format` blocks (`row`, as GGML stores it) dequantised into `out`: an embedding
/// lookup, for `QMatrix` and for Candle's own quantised tensors.
pub fn dequantise_row(format: QFormat, row: &[u8], out: &mut [f32]) {
    if format == QFormat::F32 {
        out.iter_mut().zip(row.chunks_exact(4)).for_each(|(o, b)| *o = f32::from_le_bytes(b.try_into().unwrap()));
        return;
    }
    if format == QFormat::F16 {
        out.iter_mut().zip(row.chunks_exact(2)).for_each(|(o, b)| *o = f16_at(b, 0));
        return;
    }
    let mut q = [0i32; BLOCK];
    for (b, values) in row.chunks_exact(format.block_bytes()).zip(out.chunks_exact_mut(format.block_values())) {
        for (s, chunk) in values.chunks_exact_mut(BLOCK).enumerate() {
            let (d, m) = format.sub_header(b, s);
            format.int_quants(b, s, &mut q);
            for (o, q) in chunk.iter_mut().zip(q) {
                *o = d * q as f32 + m;
            }
        }
    }
}

/// Up to eight weight rows of one format: the unit `matmul_units` hands to a task.
#[derive(Clone, Copy)]
pub enum Rows<'a> {
    /// A group in `packed`'s layout, of which the first `rows` lanes are rows.
    Grouped { format: QFormat, group: &'a [u8], rows: usize },
    /// `rows` GGML rows, one after another: f32 rows, which meet f32 activations.
    Plain { format: QFormat, data: &'a [u8], rows: usize },
}

/// `x @ Wᵀ` for `x` of `m` rows of `k` values and `n` weight rows of `k` values given as `units`
/// units of up to eight rows (`unit(u)`: the rows and the column of the output where they go):
/// `m` rows of `n` values. `quantised` says whether any row is in a quantised format (then the
/// activations are quantised once, for all of them).
pub fn matmul_units<'a>(n: usize, k: usize, x: &[f32], m: usize, quantised: bool, units: usize, unit: impl Fn(usize) -> (Rows<'a>, usize) + Sync) -> Vec<f32> {
    assert_eq!(x.len(), m * k, "qmatmul: x holds {} values, not {m} rows of {k}", x.len());
    let mut out = vec![0f32; m * n];
    if m == 0 || n == 0 {
        return out;
    }
    let (level, isa) = (simd(), isa::IntIsa::best());
    let acts = quantised.then(|| Q8Rows::quantise(x, k));
    let base = SharedMut(out.as_mut_ptr());
    // `vals` into row `i` of the output from column `col`
    let put = |i: usize, col: usize, vals: &[f32]| {
        debug_assert!(i < m && col + vals.len() <= n);
        // SAFETY: inside `out` (checked above), which outlives the tasks; each unit owns its
        // columns, and each unit is run by one task. A whole group's lanes are one fixed-size
        // store (a copy of a length known at run time is a call to `memcpy`, once per group and
        // row).
        unsafe {
            let dst = base.get().add(i * n + col);
            match <&[f32; LANES]>::try_from(vals) {
                Ok(lanes) => std::ptr::write_unaligned(dst as *mut [f32; LANES], *lanes),
                Err(_) => std::ptr::copy_nonoverlapping(vals.as_ptr(), dst, vals.len()),
            }
        }
    };
    // each task owns a run of units. Tasks of about 128K multiply-adds: fewer hand-offs between
    // the threads than smaller ones, and larger ones gain nothing (guides/pretrained.md)
    let tile = ((1 << 17) / (k * m * LANES).max(1)).clamp(1, 32);
    let task = |t: usize| {
        for u in t * tile..units.min((t + 1) * tile) {
            match unit(u) {
                (Rows::Grouped { format, group, rows }, col) => {
                    let mut sums = [[0f32; LANES]; packed::ROWS];
                    for r in (0..m).step_by(packed::ROWS) {
                        let take = (m - r).min(packed::ROWS);
                        // f16 rows meet the f32 activations, the others their 8-bit blocks
                        match &acts {
                            Some(a) if format != QFormat::F16 => grouped::group_dots(isa, format, group, a, r, &mut sums[..take]),
                            _ => packed_f16::group_dots(level, group, x, k, r, &mut sums[..take]),
                        }
                        for (i, lanes) in sums[..take].iter().enumerate() {
                            put(r + i, col, &lanes[..rows]);
                        }
                    }
                }
                (Rows::Plain { format, data, rows }, col) => {
                    let mut column = [0f32; f32_dots::ROWS];
                    for (j, w) in data.chunks_exact(data.len() / rows).enumerate() {
                        for r in (0..m).step_by(f32_dots::ROWS) {
                            let take = (m - r).min(f32_dots::ROWS);
                            f32_dots::row_dots(level, format, w, &x[r * k..(r + take) * k], k, &mut column[..take]);
                            for (i, v) in column[..take].iter().enumerate() {
                                put(r + i, col + j, std::slice::from_ref(v));
                            }
                        }
                    }
                }
            }
        }
    };
    let tasks = units.div_ceil(tile);
    if n * k * m.min(f32_dots::ROWS) < PAR_MIN {
        (0..tasks).for_each(task);
    } else {
        par_tasks(tasks, &task);
    }
    out
}

#[cfg(test)]
pub(crate) mod tests;
