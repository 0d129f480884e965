//! GGUF-quantised linear layers for the Burn engine on the CPU: the weights stay in their GGML
//! blocks and `x @ Wᵀ` runs on the block kernels of `kernels::cpu::quant`, which decode them in
//! registers. Formats other than F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K, and other devices,
//! keep the dequantised f32 tensors.

use crate::kernels::cpu::quant::packed::{self, LANES};
use crate::kernels::cpu::quant::{matmul_units, Rows};
use crate::kernels::cpu::vector::par_chunks_for;
pub use crate::kernels::cpu::quant::{dequantise_row, QFormat};

/// A `[rows, cols]` matrix in GGML blocks (PyTorch's `[out_features, in_features]`): rows in
/// groups of eight where the kernels take the format so (`packed`), else row-major.
pub struct QMatrix {
    pub format: QFormat,
    pub rows: usize,
    pub cols: usize,
    grouped: bool,
    data: Vec<u8>,
}

impl QMatrix {
    /// `None` when the bytes do not hold `rows` rows of `cols / format.block_values()` blocks.
    pub fn new(format: QFormat, rows: usize, cols: usize, data: Vec<u8>) -> Option<QMatrix> {
        let mut at = 0;
        QMatrix::read(format, rows, cols, |buf| {
            let end = at + buf.len();
            buf.copy_from_slice(data.get(at..end).ok_or(())?);
            at = end;
            Ok::<(), ()>(())
        })
        .ok()
        .filter(|_| at == data.len())
    }

    /// The matrix from `read`, which fills each buffer it is given with the next GGML bytes:
    /// eight rows at a time where they are regrouped, so that a load holds one copy of the
    /// weights. `Err` when the columns are not whole blocks, or from `read`.
    pub fn read<E>(format: QFormat, rows: usize, cols: usize, mut read: impl FnMut(&mut [u8]) -> Result<(), E>) -> Result<QMatrix, Option<E>> {
        let per = format.block_values();
        if cols % per != 0 {
            return Err(None);
        }
        let row_bytes = cols / per * format.block_bytes();
        if !packed::packs(format) {
            let mut data = vec![0u8; rows * row_bytes];
            read(&mut data).map_err(Some)?;
            return Ok(QMatrix { format, rows, cols, grouped: false, data });
        }
        // read a few hundred rows at a time and regroup them in parallel
        const GROUPS: usize = 64;
        let group = packed::group_bytes(format, cols);
        let (mut data, mut raw) = (vec![0u8; rows.div_ceil(LANES) * group], vec![0u8; GROUPS * LANES * row_bytes]);
        for (c, out) in data.chunks_mut(GROUPS * group).enumerate() {
            let n = (rows - c * GROUPS * LANES).min(GROUPS * LANES);
            read(&mut raw[..n * row_bytes]).map_err(Some)?;
            par_chunks_for(out, group, n * row_bytes * 8, |g, out| {
                let first = g * LANES;
                let n = (n - first).min(LANES);
                packed::pack(format, n, cols, &raw[first * row_bytes..(first + n) * row_bytes], out);
            });
        }
        Ok(QMatrix { format, rows, cols, grouped: true, data })
    }

    /// Rows `first..first + 8` (fewer at the end): a unit of the matmul.
    fn unit(&self, first: usize) -> Rows<'_> {
        let rows = (self.rows - first).min(LANES);
        if self.grouped {
            let n = packed::group_bytes(self.format, self.cols);
            let g = first / LANES;
            Rows::Grouped { format: self.format, group: &self.data[g * n..(g + 1) * n], rows }
        } else {
            let n = self.cols / self.format.block_values() * self.format.block_bytes();
            Rows::Plain { format: self.format, data: &self.data[first * n..(first + rows) * n], rows }
        }
    }

    /// Row `r` dequantised into `out` (`cols` values): an embedding lookup.
    pub fn dequantise_row(&self, r: usize, out: &mut [f32]) {
        match self.unit(r - r % LANES) {
            Rows::Grouped { group, .. } => packed::dequantise_lane(self.format, group, r % LANES, out),
            Rows::Plain { data, rows, .. } => {
                let n = data.len() / rows;
                dequantise_row(self.format, &data[r % LANES * n..(r % LANES + 1) * n], out)
            }
        }
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
    /// Each unit's part, first row, and first row in the stack: eight rows a unit, fewer at
    /// the end of a part.
    units: Vec<(usize, usize, usize)>,
}

impl QStack {
    /// `None` when the parts' columns differ or there are none.
    pub fn new(parts: Vec<QMatrix>) -> Option<QStack> {
        let cols = parts.first()?.cols;
        let starts = parts.iter().scan(0, |at, p| Some(std::mem::replace(at, *at + p.rows)));
        let units = parts.iter().zip(starts).enumerate().flat_map(|(i, (p, at))| (0..p.rows).step_by(LANES).map(move |r| (i, r, at + r))).collect();
        parts.iter().all(|p| p.cols == cols).then(|| QStack { rows: parts.iter().map(|p| p.rows).sum(), cols, parts, units })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The parts' formats, in order.
    #[cfg(test)]
    pub(crate) fn formats(&self) -> Vec<QFormat> {
        self.parts.iter().map(|p| p.format).collect()
    }

    /// `x @ Wᵀ` for `x` of `m` rows of `cols` values: `m` rows of `rows` values.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        let quantised = self.parts.iter().any(|p| !matches!(p.format, QFormat::F32 | QFormat::F16));
        matmul_units(self.rows, self.cols, x, m, quantised, self.units.len(), |u| {
            let (part, first, col) = self.units[u];
            (self.parts[part].unit(first), col)
        })
    }

    /// Stacked row `r` dequantised into `out` (`cols` values): an embedding lookup.
    pub fn dequantise_row(&self, r: usize, out: &mut [f32]) {
        let (part, row) = self.locate(r);
        part.dequantise_row(row, out)
    }

    /// The rows `ids` names, dequantised one after another (`[ids.len(), cols]`): a sequence's
    /// embedding lookup.
    pub fn dequantise_rows(&self, ids: &[u32]) -> Vec<f32> {
        let mut out = vec![0f32; ids.len() * self.cols];
        for (&id, row) in ids.iter().zip(out.chunks_exact_mut(self.cols)) {
            self.dequantise_row(id as usize, row);
        }
        out
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::quant::tests::{candle_dequantised, f64_product, inputs, q8_bound, random_blocks, QUANTISED};

    fn reference(f: QFormat, data: &[u8], rows: usize, cols: usize, x: &[f32], m: usize) -> Vec<f64> {
        f64_product(&candle_dequantised(f, data, rows, cols), rows, cols, x, m)
    }

    /// Wall time of one decoding step's worth of a SmolLM2-sized gate/up projection (`[3072,
    /// 576]` Q4_1, 30 layers, so the weights stream from memory as in a step) for 1 to 8
    /// activation rows, beside the same product on one matrix 30 times (from the caches).
    #[test]
    #[ignore]
    fn quant_matmul_step_timing() {
        let (rows, cols, layers) = (3072, 576, 30);
        let stacks: Vec<QStack> = (0..layers).map(|l| QStack::new(vec![QMatrix::new(QFormat::Q4_1, rows, cols, random_blocks(QFormat::Q4_1, rows, cols, l as u64)).unwrap()]).unwrap()).collect();
        for m in [1, 2, 4, 8] {
            let x = inputs(m, cols);
            let time = |pick: &dyn Fn(usize) -> usize| {
                let t = std::time::Instant::now();
                for _ in 0..20 {
                    for l in 0..layers {
                        std::hint::black_box(stacks[pick(l)].matmul(&x, m));
                    }
                }
                t.elapsed().as_secs_f64() * 1e3 / 20.0
            };
            let (streamed, cached) = (time(&|l| l), time(&|_| 0));
            println!("m={m}: {streamed:.3} ms a step from memory, {cached:.3} ms from the caches ({} threads)", rayon::current_num_threads());
        }
    }

    #[test]
    fn quantised_matmul_equals_candles_dequantised_product() {
        for f in QUANTISED.into_iter().chain([QFormat::F32, QFormat::F16]) {
            // odd row counts (tiles and the row groups end part-way), m from 1 to 23; widths of
            // super-blocks for the k-quants
            let cases = [(1, 32, 1), (7, 64, 1), (33, 96, 2), (300, 576, 3), (5, 128, 4), (61, 160, 5), (1000, 64, 9), (17, 96, 8), (40, 64, 23)];
            let k_cases = [(1, 256, 1), (7, 512, 1), (33, 256, 2), (300, 768, 3), (61, 256, 5), (17, 512, 8), (40, 256, 23)];
            for (rows, cols, m) in cases.into_iter().chain(k_cases).filter(|c| c.1 % f.block_values() == 0) {
                let data = random_blocks(f, rows, cols, (rows * 31 + cols) as u64);
                let q = QStack::new(vec![QMatrix::new(f, rows, cols, data.clone()).unwrap()]).unwrap();
                let x = inputs(m, cols);
                let w = candle_dequantised(f, &data, rows, cols);
                let want = f64_product(&w, rows, cols, &x, m);
                let got = q.matmul(&x, m);
                for (idx, e) in want.iter().enumerate() {
                    let (i, j) = (idx / rows, idx % rows);
                    let tol = match f {
                        QFormat::F32 | QFormat::F16 => 1e-5 * (1.0 + e.abs()) * (cols as f64).sqrt(),
                        _ => q8_bound(&w[j * cols..(j + 1) * cols], &x[i * cols..(i + 1) * cols]),
                    };
                    assert!((got[idx] as f64 - e).abs() <= tol, "{f:?} {rows}x{cols} m={m} [{idx}]: {} vs {e} (tol {tol})", got[idx]);
                }
            }
        }
    }

    #[test]
    fn stacked_parts_of_different_formats_and_rows_dequantise_like_candle() {
        let (cols, m) = (64, 3);
        let parts: Vec<(QFormat, usize)> = vec![(QFormat::Q4_1, 5), (QFormat::Q8_0, 3), (QFormat::Q4_0, 300), (QFormat::Q5_0, 4), (QFormat::Q5_1, 3), (QFormat::F32, 2)];
        let datas: Vec<Vec<u8>> = parts.iter().enumerate().map(|(i, (f, r))| random_blocks(*f, *r, cols, i as u64 + 7)).collect();
        let stack =
            QStack::new(parts.iter().zip(&datas).map(|((f, r), d)| QMatrix::new(*f, *r, cols, d.clone()).unwrap()).collect()).unwrap();
        assert_eq!((stack.rows(), stack.cols()), (317, 64));
        let x = inputs(m, cols);
        let got = stack.matmul(&x, m);
        let mut col = 0;
        for ((f, r), d) in parts.iter().zip(&datas) {
            let want = reference(*f, d, *r, cols, &x, m);
            for i in 0..m {
                for j in 0..*r {
                    let (g, w) = (got[i * 317 + col + j] as f64, want[i * r + j]);
                    let deq = candle_dequantised(*f, d, *r, cols);
                    let tol = q8_bound(&deq[j * cols..(j + 1) * cols], &x[i * cols..(i + 1) * cols]).max(1e-4 * (1.0 + w.abs()));
                    assert!((g - w).abs() <= tol, "{f:?} row {j} of x row {i}: {g} vs {w}");
                }
            }
            // rows dequantise to candle's values exactly
            let m0 = QMatrix::new(*f, *r, cols, d.clone()).unwrap();
            let w = candle_dequantised(*f, d, *r, cols);
            let mut row = vec![0f32; cols];
            for j in [0, r - 1] {
                m0.dequantise_row(j, &mut row);
                assert_eq!(row, w[j * cols..(j + 1) * cols], "{f:?} row {j}");
            }
            col += r;
        }
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

    #[test]
    fn a_row_gives_the_same_bits_alone_and_among_others() {
        for f in QUANTISED.into_iter().chain([QFormat::F32, QFormat::F16]) {
            let (rows, cols, m) = (37, if f.block_values() > 32 { 768 } else { 576 }, 11);
            let q = QStack::new(vec![QMatrix::new(f, rows, cols, random_blocks(f, rows, cols, 3)).unwrap()]).unwrap();
            let x = inputs(m, cols);
            let all = q.matmul(&x, m);
            for i in 0..m {
                assert_eq!(q.matmul(&x[i * cols..(i + 1) * cols], 1), all[i * rows..(i + 1) * rows], "{f:?} row {i}");
            }
        }
    }
}
