//! GGUF-quantised linear layers for the Burn engine on the CPU: the weights stay in their GGML
//! blocks (Q4_0, Q4_1, Q8_0) and `x @ Wᵀ` decodes each block in registers.
//!
//! Why: decoding one token reads every weight once. Dequantised to f32, SmolLM2-135M is 540 MB
//! per token, so decoding is bound by memory bandwidth, and the model holds several times its
//! file's size in memory (guides/pretrained.md). In Q4_1 the same weights are 85 MB. candle's own
//! Q4_1 dot product has no SIMD path (`k_quants.rs` vectorises Q4_0, Q8_0 and the K-quants), and
//! it quantises the activations to 8 bits as llama.cpp does. Here the activations stay f32: each
//! block of 32 weights is dequantised in registers, `w = fma(q, d, m)`, and multiplied into up to
//! 8 activation rows (a prompt's tokens share one decoding), so the products are the dequantised
//! matmul's up to f32 rounding and the outputs match the f32 path's tests.
//!
//! Formats other than these three, and other devices, keep the dequantised f32 tensors.

use burn::tensor::f16;
use candle_core::quantized::GgmlDType;

use crate::kernels::cpu::vector::{par_chunks_for, simd, Simd};

/// Values per GGML block, for every format here.
const BLOCK: usize = 32;

/// The GGML block formats this kernel decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QFormat {
    /// `d: f16, qs: [u8; 16]`, `w = d·(q − 8)` with 4-bit `q`.
    Q4_0,
    /// `d: f16, m: f16, qs: [u8; 16]`, `w = d·q + m`.
    Q4_1,
    /// `d: f16, qs: [i8; 32]`, `w = d·q`.
    Q8_0,
    /// Plain f32 rows (blocks of 32 values, nothing to decode): the same kernel serves f32
    /// weights where few activation rows make a general matmul's packing of the weights its
    /// main cost (`matmul_f32`).
    F32,
}

impl QFormat {
    pub fn from_ggml(t: GgmlDType) -> Option<QFormat> {
        match t {
            GgmlDType::Q4_0 => Some(QFormat::Q4_0),
            GgmlDType::Q4_1 => Some(QFormat::Q4_1),
            GgmlDType::Q8_0 => Some(QFormat::Q8_0),
            _ => None,
        }
    }

    pub const fn block_bytes(self) -> usize {
        match self {
            QFormat::Q4_0 => 18,
            QFormat::Q4_1 => 20,
            QFormat::Q8_0 => 34,
            QFormat::F32 => 4 * BLOCK,
        }
    }

    /// A block's scale `d` and offset `m`, and where its quants start.
    #[inline(always)]
    fn header(self, b: &[u8]) -> (f32, f32, usize) {
        let half = |i: usize| f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32();
        match self {
            QFormat::Q4_0 => {
                let d = half(0);
                (d, -8.0 * d, 2)
            }
            QFormat::Q4_1 => (half(0), half(2), 4),
            QFormat::Q8_0 => (half(0), 0.0, 2),
            QFormat::F32 => (1.0, 0.0, 0),
        }
    }

    /// The 32 quants of a block as f32, unscaled (GGML order: low nibbles are values 0..16,
    /// high nibbles 16..32).
    #[inline(always)]
    fn quants(self, b: &[u8], at: usize, out: &mut [f32; BLOCK]) {
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
        }
    }
}

/// A row-major `[rows, cols]` matrix in GGML blocks (PyTorch's `[out_features, in_features]`).
pub struct QMatrix {
    pub format: QFormat,
    pub rows: usize,
    pub cols: usize,
    data: Vec<u8>,
}

impl QMatrix {
    /// `None` when the bytes do not hold `rows` rows of `cols / 32` blocks.
    pub fn new(format: QFormat, rows: usize, cols: usize, data: Vec<u8>) -> Option<QMatrix> {
        (cols % BLOCK == 0 && data.len() == rows * (cols / BLOCK) * format.block_bytes()).then_some(QMatrix { format, rows, cols, data })
    }

    fn row_bytes(&self) -> usize {
        self.cols / BLOCK * self.format.block_bytes()
    }

    fn row(&self, r: usize) -> &[u8] {
        let n = self.row_bytes();
        &self.data[r * n..(r + 1) * n]
    }

    /// Row `r` dequantised into `out` (`cols` values): an embedding lookup.
    pub fn dequantise_row(&self, r: usize, out: &mut [f32]) {
        dequantise_row(self.format, self.row(r), out)
    }

    pub fn bytes(&self) -> usize {
        self.data.len()
    }
}

/// Matrices with the same number of columns stacked along their rows, one matmul for all (Q,
/// K and V; gate and up). Parts keep their own formats.
pub struct QStack {
    parts: Vec<QMatrix>,
    cols: usize,
    rows: usize,
}

impl QStack {
    /// `None` when the parts' columns differ or there are none.
    pub fn new(parts: Vec<QMatrix>) -> Option<QStack> {
        let cols = parts.first()?.cols;
        parts.iter().all(|p| p.cols == cols).then(|| QStack { rows: parts.iter().map(|p| p.rows).sum(), cols, parts })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// `x @ Wᵀ` for `x` of `m` rows of `cols` values: `m` rows of `rows` values.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        matmul_rows(self.rows, self.cols, x, m, |r| {
            let (w, row) = self.locate(r);
            (w.format, w.row(row))
        })
    }

    /// Stacked row `r` dequantised into `out` (`cols` values): an embedding lookup.
    pub fn dequantise_row(&self, r: usize, out: &mut [f32]) {
        let (part, row) = self.locate(r);
        part.dequantise_row(row, out)
    }

    /// The part holding stacked row `r`, and the row within it.
    fn locate(&self, mut r: usize) -> (&QMatrix, usize) {
        for p in &self.parts {
            if r < p.rows {
                return (p, r);
            }
            r -= p.rows;
        }
        unreachable!("row beyond the stack")
    }
}

/// One row of `format` blocks (`row`, as GGML stores it) dequantised into `out`: an embedding
/// lookup, for `QMatrix` and for Candle's own quantised tensors.
pub fn dequantise_row(format: QFormat, row: &[u8], out: &mut [f32]) {
    let mut q = [0f32; BLOCK];
    for (b, chunk) in row.chunks_exact(format.block_bytes()).zip(out.chunks_exact_mut(BLOCK)) {
        let (d, m, at) = format.header(b);
        format.quants(b, at, &mut q);
        for (o, q) in chunk.iter_mut().zip(q) {
            *o = d * q + m;
        }
    }
}

/// `x @ Wᵀ` for f32 `w` of `rows` rows of `cols` values (PyTorch's `[out, in]`, row-major) and
/// `x` of `m` rows: `m` rows of `rows` values; `None` unless `cols` is a multiple of 32.
pub fn matmul_f32(w: &[f32], rows: usize, cols: usize, x: &[f32], m: usize) -> Option<Vec<f32>> {
    if !cols.is_multiple_of(BLOCK) || w.len() != rows * cols {
        return None;
    }
    let bytes: &[u8] = bytemuck::cast_slice(w);
    let row_bytes = cols * 4;
    Some(matmul_rows(rows, cols, x, m, |r| (QFormat::F32, &bytes[r * row_bytes..(r + 1) * row_bytes])))
}

/// The parallel driver: `n` weight rows of `k` values, row `r` as `row(r)`'s format and bytes.
fn matmul_rows<'a>(n: usize, k: usize, x: &[f32], m: usize, row: impl Fn(usize) -> (QFormat, &'a [u8]) + Sync) -> Vec<f32> {
    assert_eq!(x.len(), m * k, "qmatmul: x holds {} values, not {m} rows of {k}", x.len());
    if m == 0 || n == 0 {
        return vec![0.0; m * n];
    }
    // computed transposed, `[n, m]`, so each task owns a run of weight rows. Tasks of about
    // 128K multiply-adds: fewer hand-offs between the threads than smaller ones, and larger
    // ones gain nothing (guides/pretrained.md)
    let mut out_t = vec![0f32; n * m];
    let tile = ((1 << 17) / (k * m).max(1)).clamp(1, 256);
    let level = simd();
    par_chunks_for(&mut out_t, tile * m, n * k * m.min(ROWS), |t, piece| {
        let first = t * tile;
        for (i, dst) in piece.chunks_exact_mut(m).enumerate() {
            let (format, w) = row(first + i);
            let mut r = 0;
            while r < m {
                let take = (m - r).min(ROWS);
                row_dots(level, format, w, &x[r * k..(r + take) * k], k, &mut dst[r..r + take]);
                r += take;
            }
        }
    });
    if m == 1 {
        return out_t;
    }
    let mut out = vec![0f32; m * n];
    for (j, col) in out_t.chunks_exact(m).enumerate() {
        for (i, v) in col.iter().enumerate() {
            out[i * n + j] = *v;
        }
    }
    out
}

/// Activation rows sharing one decoding of a weight row (a prompt's tokens): each block is
/// decoded once per this many rows.
const ROWS: usize = 8;

/// `out[i] = Σ_j w[j]·x_i[j]` for one weight row and `out.len()` (1 to `ROWS`) rows `x_i` of `k`
/// values. Each block is dequantised in registers, `w = fma(q, d, m)`, then multiplied in.
fn row_dots(level: Simd, f: QFormat, w: &[u8], xs: &[f32], k: usize, out: &mut [f32]) {
    macro_rules! by_rows {
        ($isa:ident) => {
            match out.len() {
                1 => $isa::row_dots::<1>(f, w, xs, k, out),
                2 => $isa::row_dots::<2>(f, w, xs, k, out),
                3 => $isa::row_dots::<3>(f, w, xs, k, out),
                4 => $isa::row_dots::<4>(f, w, xs, k, out),
                5 => $isa::row_dots::<5>(f, w, xs, k, out),
                6 => $isa::row_dots::<6>(f, w, xs, k, out),
                7 => $isa::row_dots::<7>(f, w, xs, k, out),
                _ => $isa::row_dots::<8>(f, w, xs, k, out),
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    if level >= Simd::Avx512 {
        // SAFETY: AVX-512 (F, BW) with AVX2, FMA and F16C were detected on this CPU (`simd`).
        unsafe { by_rows!(avx512) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if level >= Simd::Avx2 {
        // SAFETY: AVX2 and FMA were detected on this CPU (`simd`).
        unsafe { by_rows!(avx2) };
        return;
    }
    let _ = level;
    row_dots_scalar(f, w, xs, k, out)
}

fn row_dots_scalar(f: QFormat, w: &[u8], xs: &[f32], k: usize, out: &mut [f32]) {
    let bb = f.block_bytes();
    let mut q = [0f32; BLOCK];
    out.fill(0.0);
    for (b, block) in w.chunks_exact(bb).enumerate() {
        let (d, m, at) = f.header(block);
        f.quants(block, at, &mut q);
        if f != QFormat::F32 {
            q.iter_mut().for_each(|q| *q = q.mul_add(d, m));
        }
        for (i, o) in out.iter_mut().enumerate() {
            let x = &xs[i * k + b * BLOCK..i * k + (b + 1) * BLOCK];
            *o += q.iter().zip(x).map(|(w, x)| w * x).sum::<f32>();
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{QFormat, BLOCK};
    use std::arch::x86_64::*;

    /// A block's 32 quants as four vectors of 8 f32. Each byte is widened once and both of its
    /// nibbles taken in the 32-bit lanes: two byte shuffles per block instead of six, since
    /// shuffles issue on fewer ports than shifts and conversions and would set the pace.
    #[inline(always)]
    unsafe fn quants(f: QFormat, p: *const u8) -> [__m256; 4] {
        match f {
            QFormat::Q4_0 | QFormat::Q4_1 => {
                let v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
                let v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(8) as *const __m128i));
                let mask = _mm256_set1_epi32(0x0f);
                let f = _mm256_cvtepi32_ps;
                [f(_mm256_and_si256(v0, mask)), f(_mm256_and_si256(v1, mask)), f(_mm256_srli_epi32(v0, 4)), f(_mm256_srli_epi32(v1, 4))]
            }
            QFormat::Q8_0 => {
                let f = |o: usize| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(o) as *const __m128i)));
                [f(0), f(8), f(16), f(24)]
            }
            QFormat::F32 => {
                let p = p as *const f32;
                [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))]
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn row_dots<const R: usize>(f: QFormat, w: &[u8], xs: &[f32], k: usize, out: &mut [f32]) {
        let (bb, nb) = (f.block_bytes(), k / BLOCK);
        debug_assert!(w.len() == nb * bb && xs.len() == R * k && out.len() == R);
        let mut acc = [_mm256_setzero_ps(); R];
        let xp = xs.as_ptr();
        for b in 0..nb {
            let block = w.get_unchecked(b * bb..(b + 1) * bb);
            let (d, m, at) = f.header(block);
            let (dv, mv) = (_mm256_set1_ps(d), _mm256_set1_ps(m));
            let q = quants(f, block.as_ptr().add(at));
            // no closure here (`map`): closures do not inherit `target_feature`
            let w = if f == QFormat::F32 {
                q
            } else {
                [_mm256_fmadd_ps(q[0], dv, mv), _mm256_fmadd_ps(q[1], dv, mv), _mm256_fmadd_ps(q[2], dv, mv), _mm256_fmadd_ps(q[3], dv, mv)]
            };
            for r in 0..R {
                let x = xp.add(r * k + b * BLOCK);
                let mut a = acc[r];
                for (i, w) in w.iter().enumerate() {
                    a = _mm256_fmadd_ps(*w, _mm256_loadu_ps(x.add(8 * i)), a);
                }
                acc[r] = a;
            }
        }
        for r in 0..R {
            let v = acc[r];
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
            out[r] = _mm_cvtss_f32(s);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{QFormat, BLOCK};
    use std::arch::x86_64::*;

    /// A block's 32 quants as two vectors of 16 f32: one byte shuffle per block.
    #[inline(always)]
    unsafe fn quants(f: QFormat, p: *const u8) -> [__m512; 2] {
        match f {
            QFormat::Q4_0 | QFormat::Q4_1 => {
                let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
                let lo = _mm512_and_si512(v, _mm512_set1_epi32(0x0f));
                [_mm512_cvtepi32_ps(lo), _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4))]
            }
            QFormat::Q8_0 => {
                let f = |o: usize| _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(o) as *const __m128i)));
                [f(0), f(16)]
            }
            QFormat::F32 => [_mm512_loadu_ps(p as *const f32), _mm512_loadu_ps((p as *const f32).add(16))],
        }
    }

    /// One block into `acc` (a function, not a closure: closures do not inherit
    /// `target_feature`, and the intrinsics would become calls).
    #[inline(always)]
    unsafe fn step<const R: usize>(f: QFormat, w: &[u8], xp: *const f32, k: usize, b: usize, acc: &mut [__m512; R]) {
        let bb = f.block_bytes();
        let block = w.get_unchecked(b * bb..(b + 1) * bb);
        let (d, m, at) = f.header(block);
        let (dv, mv) = (_mm512_set1_ps(d), _mm512_set1_ps(m));
        let [q0, q1] = quants(f, block.as_ptr().add(at));
        let (w0, w1) = if f == QFormat::F32 { (q0, q1) } else { (_mm512_fmadd_ps(q0, dv, mv), _mm512_fmadd_ps(q1, dv, mv)) };
        for r in 0..R {
            let x = xp.add(r * k + b * BLOCK);
            acc[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x.add(16)), _mm512_fmadd_ps(w0, _mm512_loadu_ps(x), acc[r]));
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    pub(super) unsafe fn row_dots<const R: usize>(f: QFormat, w: &[u8], xs: &[f32], k: usize, out: &mut [f32]) {
        let nb = k / BLOCK;
        debug_assert!(w.len() == nb * f.block_bytes() && xs.len() == R * k && out.len() == R);
        // two accumulators per row (even and odd blocks): one row alone is otherwise a chain of
        // dependent FMAs, two per block
        let (mut even, mut odd) = ([_mm512_setzero_ps(); R], [_mm512_setzero_ps(); R]);
        let xp = xs.as_ptr();
        let mut b = 0;
        while b + 1 < nb {
            step(f, w, xp, k, b, &mut even);
            step(f, w, xp, k, b + 1, &mut odd);
            b += 2;
        }
        if b < nb {
            step(f, w, xp, k, b, &mut even);
        }
        for r in 0..R {
            out[r] = _mm512_reduce_add_ps(_mm512_add_ps(even[r], odd[r]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{ggml_file, GgmlDType};

    /// Random blocks of a format, scales of both signs and special values included.
    fn random_blocks(f: QFormat, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        let mut next = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 33) as u32
        };
        let mut out = Vec::new();
        for _ in 0..rows * cols / BLOCK {
            if f == QFormat::F32 {
                for _ in 0..BLOCK {
                    out.extend(((next() % 2000) as f32 / 1000.0 - 1.0).to_le_bytes());
                }
                continue;
            }
            let mut half = |out: &mut Vec<u8>| {
                let v = (next() % 2000) as f32 / 1000.0 - 1.0;
                out.extend(f16::from_f32(v * 0.05).to_bits().to_le_bytes());
            };
            half(&mut out);
            if f == QFormat::Q4_1 {
                half(&mut out);
            }
            let n = f.block_bytes() - out.len() % f.block_bytes();
            for _ in 0..n {
                out.push(next() as u8);
            }
        }
        out
    }

    /// The reference: candle dequantises the blocks; the product is summed in f64.
    fn reference(f: QFormat, data: &[u8], rows: usize, cols: usize, x: &[f32], m: usize) -> Vec<f64> {
        let dtype = match f {
            QFormat::Q4_0 => GgmlDType::Q4_0,
            QFormat::Q4_1 => GgmlDType::Q4_1,
            QFormat::Q8_0 => GgmlDType::Q8_0,
            QFormat::F32 => GgmlDType::F32,
        };
        let dev = candle_core::Device::Cpu;
        let w = ggml_file::qtensor_from_ggml(dtype, data, vec![rows, cols], &dev).unwrap().dequantize(&dev).unwrap();
        let w: Vec<f32> = w.flatten_all().unwrap().to_vec1().unwrap();
        let mut out = vec![0f64; m * rows];
        for i in 0..m {
            for j in 0..rows {
                out[i * rows + j] = (0..cols).map(|c| w[j * cols + c] as f64 * x[i * cols + c] as f64).sum();
            }
        }
        out
    }

    fn inputs(m: usize, k: usize) -> Vec<f32> {
        (0..m * k).map(|i| ((i as f32) * 0.37).sin() * 2.0).collect()
    }

    #[test]
    fn quantised_matmul_equals_candles_dequantised_product() {
        for f in [QFormat::Q4_0, QFormat::Q4_1, QFormat::Q8_0, QFormat::F32] {
            // odd row counts (tiles and the 4-row groups end part-way), m from 1 to 9
            for (rows, cols, m) in [(1, 32, 1), (7, 64, 1), (33, 96, 2), (300, 576, 3), (5, 128, 4), (61, 160, 5), (1000, 64, 9), (17, 96, 8), (40, 64, 23)] {
                let data = random_blocks(f, rows, cols, (rows * 31 + cols) as u64);
                let q = QStack::new(vec![QMatrix::new(f, rows, cols, data.clone()).unwrap()]).unwrap();
                let x = inputs(m, cols);
                let want = reference(f, &data, rows, cols, &x, m);
                for level in [Simd::Base, Simd::Avx2.min(simd()), simd()] {
                    let mut got = vec![0f32; m * rows];
                    for i in 0..m {
                        for j in 0..rows {
                            let xs = &x[i * cols..(i + 1) * cols];
                            row_dots(level, f, q.parts[0].row(j), xs, cols, &mut got[i * rows + j..i * rows + j + 1]);
                        }
                    }
                    let full = q.matmul(&x, m);
                    for (idx, w) in want.iter().enumerate() {
                        let tol = 1e-5 * (1.0 + w.abs()) * (cols as f64).sqrt();
                        assert!((got[idx] as f64 - w).abs() <= tol, "{f:?} {rows}x{cols} m={m} {level:?} [{idx}]: {} vs {w}", got[idx]);
                        assert!((full[idx] as f64 - w).abs() <= tol, "{f:?} {rows}x{cols} m={m} matmul [{idx}]: {} vs {w}", full[idx]);
                    }
                }
            }
        }
    }

    #[test]
    fn stacked_parts_of_different_formats_and_rows_dequantise_like_candle() {
        let (cols, m) = (64, 3);
        let parts: Vec<(QFormat, usize)> = vec![(QFormat::Q4_1, 5), (QFormat::Q8_0, 3), (QFormat::Q4_0, 300), (QFormat::F32, 2)];
        let datas: Vec<Vec<u8>> = parts.iter().enumerate().map(|(i, (f, r))| random_blocks(*f, *r, cols, i as u64 + 7)).collect();
        let stack =
            QStack::new(parts.iter().zip(&datas).map(|((f, r), d)| QMatrix::new(*f, *r, cols, d.clone()).unwrap()).collect()).unwrap();
        assert_eq!((stack.rows(), stack.cols()), (310, 64));
        let x = inputs(m, cols);
        let got = stack.matmul(&x, m);
        let mut col = 0;
        for ((f, r), d) in parts.iter().zip(&datas) {
            let want = reference(*f, d, *r, cols, &x, m);
            for i in 0..m {
                for j in 0..*r {
                    let (g, w) = (got[i * 310 + col + j] as f64, want[i * r + j]);
                    assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{f:?} row {j} of x row {i}: {g} vs {w}");
                }
            }
            // rows dequantise to candle's values exactly
            let m0 = QMatrix::new(*f, *r, cols, d.clone()).unwrap();
            let dev = candle_core::Device::Cpu;
            let dtype = match f {
                QFormat::Q4_0 => GgmlDType::Q4_0,
                QFormat::Q4_1 => GgmlDType::Q4_1,
                QFormat::Q8_0 => GgmlDType::Q8_0,
                QFormat::F32 => GgmlDType::F32,
            };
            let w: Vec<f32> =
                ggml_file::qtensor_from_ggml(dtype, d, vec![*r, cols], &dev).unwrap().dequantize(&dev).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let mut row = vec![0f32; cols];
            for j in [0, r - 1] {
                m0.dequantise_row(j, &mut row);
                assert_eq!(row, w[j * cols..(j + 1) * cols], "{f:?} row {j}");
            }
            col += r;
        }
    }

    #[test]
    fn f32_rows_equal_an_f64_product_and_refuse_other_widths() {
        for (rows, cols, m) in [(1, 32, 1), (384, 384, 16), (1536, 384, 7), (5, 1536, 33)] {
            let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.1).collect();
            let x = inputs(m, cols);
            let got = matmul_f32(&w, rows, cols, &x, m).unwrap();
            for i in 0..m {
                for j in 0..rows {
                    let want: f64 = (0..cols).map(|c| w[j * cols + c] as f64 * x[i * cols + c] as f64).sum();
                    let g = got[i * rows + j] as f64;
                    assert!((g - want).abs() <= 1e-5 * (1.0 + want.abs()) * (cols as f64).sqrt(), "{rows}x{cols} m={m} [{i},{j}]: {g} vs {want}");
                }
            }
        }
        assert!(matmul_f32(&[0.0; 48], 1, 48, &[0.0; 48], 1).is_none());
        assert!(matmul_f32(&[0.0; 64], 1, 32, &[0.0; 32], 1).is_none());
    }

    #[test]
    fn special_inputs_propagate_and_bad_shapes_are_refused() {
        let data = random_blocks(QFormat::Q4_1, 2, 64, 3);
        let q = QStack::new(vec![QMatrix::new(QFormat::Q4_1, 2, 64, data.clone()).unwrap()]).unwrap();
        let mut x = inputs(1, 64);
        x[5] = f32::NAN;
        assert!(q.matmul(&x, 1).iter().all(|v| v.is_nan()));
        x[5] = f32::INFINITY;
        assert!(q.matmul(&x, 1).iter().all(|v| !v.is_finite()));
        assert!(q.matmul(&[], 0).is_empty());
        assert!(QMatrix::new(QFormat::Q4_1, 2, 48, data.clone()).is_none());
        assert!(QMatrix::new(QFormat::Q4_1, 3, 64, data).is_none());
        let other = QMatrix::new(QFormat::Q8_0, 1, 32, random_blocks(QFormat::Q8_0, 1, 32, 1)).unwrap();
        let first = QMatrix::new(QFormat::Q8_0, 1, 64, random_blocks(QFormat::Q8_0, 1, 64, 1)).unwrap();
        assert!(QStack::new(vec![first, other]).is_none());
        assert!(QStack::new(vec![]).is_none());
    }
}
