//! `x @ Wᵀ` for a few rows of `x` on the cube GPU backends, with what surrounds it in a decoder
//! layer fused in: the input's RMSNorm or SiLU gate, and the residual the result adds to. These
//! are the weight products of a decoding step, whose rows are the batch's sequences.
//!
//! Why: Burn's matmul tiles the output into blocks of rows and columns; with 1 to 32 rows most
//! of a tile is empty and a product runs on few workgroups, so a batched step's weight products
//! cost far more than their weight traffic, and each op around them is a kernel launch of its
//! own. Here one plane (warp/subgroup) computes one output column for a group of rows: its
//! lanes walk that weight row in coalesced steps, each lane keeps one partial sum per row of the
//! group, and a plane sum finishes each. The planes of one column sit in one workgroup, so a
//! weight value comes from memory once per product whatever the number of rows. Splitting the
//! rows into groups gives a batch more planes in flight and each plane fewer loads in a row;
//! with few columns and rows, several planes share a column's row the same way.
//!
//! The weights are f32 values, or GGML blocks as codes with a scale (and offset) per group
//! (`gpu::blocks`), which each lane decodes as it reads them: a decoding step reads a quarter to a
//! third of the bytes.
//!
//! `fused` hands its operands back where it does not apply (more rows, other dtypes, devices
//! without plane kernels, the CPU): the caller then runs the same arithmetic in Burn ops.

use burn::tensor::{DType, Tensor};

pub use super::blocks::GpuBlocks;

/// The most rows of `x` the kernel takes (and it takes at least one): its partial sums live in
/// registers.
pub const MAX_ROWS: usize = 32;

/// What the product's input is made of.
#[derive(Clone, Copy)]
pub enum Input<'a> {
    /// `x` itself.
    Plain,
    /// RMSNorm of `x`'s rows with this weight and epsilon.
    Norm(&'a Tensor<1>, f64),
    /// `silu(gate) * up` of `x = [gate | up]`, halves of equal width.
    SiluMul,
}

/// The weight matrix `w: [n, k]`.
#[derive(Clone, Copy)]
pub enum Weight<'a> {
    /// f32 values.
    F32(&'a Tensor<2>),
    /// GGML blocks as codes and scales (`gpu::blocks`), decoded in registers.
    Blocks(&'a GpuBlocks),
}

/// `input(x) @ wᵀ (+ residual)`: `[rows of x, n]`, or the operands back. For tensors where
/// `gpu::kernels_run`, which the caller asks once for its device.
#[allow(clippy::result_large_err)]
pub fn fused(x: Tensor<2>, w: Weight, input: Input, residual: Option<Tensor<2>>) -> Result<Tensor<2>, (Tensor<2>, Option<Tensor<2>>)> {
    let runs = (1..=MAX_ROWS).contains(&x.dims()[0])
        && x.dtype() == DType::F32
        && match w {
            Weight::F32(w) => w.dtype() == DType::F32,
            Weight::Blocks(_) => true,
        };
    #[cfg(cube)]
    if runs {
        return Ok(cube::fused(x, w, input, residual));
    }
    let _ = (runs, w, input);
    Err((x, residual))
}

#[cfg(cube)]
mod cube {
    use burn::backend::fusion::custom::TensorSpec;
    use burn::backend::tensor::{FloatTensor, IntTensor};
    use burn::backend::{backend_extension, Backend, Dispatch};
    use burn::tensor::Tensor;
    use burn_cubecl::tensor::CubeTensor;
    use burn_cubecl::CubeBackend;
    use cubecl::prelude::*;

    use super::{Input, Weight};

    /// Planes per workgroup.
    const PLANES: usize = 8;

    /// The most rows one plane sums; more rows are split into groups of equal size (the size
    /// was picked by measuring several, guides/devices.md).
    const GROUP_ROWS: usize = 4;

    /// Planes a product should keep in flight: about what a large GPU holds at once. Below it a
    /// column's weight row is split between several planes of its workgroup, since one plane
    /// walking a long row alone waits on one load after another.
    const PLANES_IN_FLIGHT: usize = 8192;

    /// Planes that share one column's row (a power of two, at most the workgroup's planes over
    /// its row groups), for `n` columns, `groups` row groups and rows of `k` values.
    pub(super) fn splits(n: usize, groups: usize, k: usize, plane: usize) -> usize {
        let most = (PLANES / groups.min(PLANES)).min(k.div_ceil(plane)).max(1);
        let want = (PLANES_IN_FLIGHT / (n * groups).max(1)).clamp(1, most);
        1 << want.ilog2()
    }

    #[backend_extension(Cube: cfg(cube), Fusion: cfg(cube))]
    pub trait RowsMatmul: Backend {
        /// `input(x) @ wᵀ (+ res)`, f32, `x` of at most `MAX_ROWS` rows. `g` is the norm's
        /// weight where `norm`, `res` the residual where `residual`; unused ones are any
        /// tensor. `eps` is the norm's epsilon as f32 bits.
        #[allow(clippy::too_many_arguments)]
        #[fusion(meta = rows_meta)]
        fn rows_fused(
            x: FloatTensor<Self>,
            w: FloatTensor<Self>,
            g: FloatTensor<Self>,
            res: FloatTensor<Self>,
            norm: bool,
            silu: bool,
            residual: bool,
            eps: u32,
        ) -> FloatTensor<Self>;

        /// The same with the weights as GGML codes (`n` rows): `scales`, `codes` and `offsets`
        /// as `GpuBlocks` holds them (`offsets` any tensor without `offset`), decoded as
        /// `groups::Layout` says (`bits`, `group`, `zero`, `offset`).
        #[allow(clippy::too_many_arguments)]
        #[fusion(meta = blocks_meta)]
        fn rows_fused_blocks(
            x: FloatTensor<Self>,
            scales: FloatTensor<Self>,
            codes: IntTensor<Self>,
            offsets: FloatTensor<Self>,
            g: FloatTensor<Self>,
            res: FloatTensor<Self>,
            n: usize,
            norm: bool,
            silu: bool,
            residual: bool,
            eps: u32,
            bits: u32,
            group: usize,
            zero: u32,
            offset: bool,
        ) -> FloatTensor<Self>;
    }

    #[allow(clippy::too_many_arguments)]
    fn blocks_meta(
        x: &TensorSpec,
        _scales: &TensorSpec,
        _codes: &TensorSpec,
        _offsets: &TensorSpec,
        _g: &TensorSpec,
        _res: &TensorSpec,
        n: &usize,
        _norm: &bool,
        _silu: &bool,
        _residual: &bool,
        _eps: &u32,
        _bits: &u32,
        _group: &usize,
        _zero: &u32,
        _offset: &bool,
    ) -> TensorSpec {
        let mut shape = x.shape.clone();
        shape[1] = *n;
        TensorSpec::new(shape, x.dtype)
    }

    /// How `rows_by_weight` reads the weights: f32 values (`bits` 0), or codes.
    #[derive(Clone, Copy)]
    struct Codes {
        bits: u32,
        group: usize,
        zero: u32,
        offset: bool,
    }

    /// Launches `rows_by_weight` for `x` and weights `w` (f32 values, or the scales of `codes`)
    /// with `n` output columns; operands a flag leaves unused are bound to any buffer.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        x: CubeTensor,
        [w, codes, offsets]: [CubeTensor; 3],
        g: CubeTensor,
        res: CubeTensor,
        n: usize,
        [norm, silu, residual]: [bool; 3],
        eps: u32,
        c: Codes,
    ) -> CubeTensor {
        let plane = x.client.properties().hardware.plane_size_max;
        let [x, w, codes, offsets, g, res] = [x, w, codes, offsets, g, res].map(crate::gpu::contiguous);
        let [m, width] = [x.meta.shape()[0], x.meta.shape()[1]];
        let k = if silu { width / 2 } else { width };
        let client = x.client.clone();
        let out = crate::gpu::output(&x, [m, n]);
        let groups = m.div_ceil(GROUP_ROWS);
        let splits = splits(n, groups, k, plane as usize);
        let (columns, rows) = (PLANES / (groups.min(PLANES) * splits), m.div_ceil(groups));
        rows_by_weight::launch(
            &client,
            CubeCount::Static(n.div_ceil(columns) as u32, 1, 1),
            CubeDim::new_1d(plane * (columns * groups * splits) as u32),
            x.into_buffer_arg(),
            w.into_buffer_arg(),
            codes.into_buffer_arg(),
            offsets.into_buffer_arg(),
            g.into_buffer_arg(),
            res.into_buffer_arg(),
            out.clone().into_buffer_arg(),
            k,
            n,
            width,
            f32::from_bits(eps),
            m,
            groups,
            rows,
            splits,
            norm,
            silu,
            residual,
            c.bits as usize,
            c.group,
            c.zero as usize,
            c.offset,
        );
        out
    }

    #[allow(clippy::too_many_arguments)]
    fn rows_meta(
        x: &TensorSpec,
        w: &TensorSpec,
        _g: &TensorSpec,
        _res: &TensorSpec,
        _norm: &bool,
        _silu: &bool,
        _residual: &bool,
        _eps: &u32,
    ) -> TensorSpec {
        let mut shape = x.shape.clone();
        shape[1] = w.shape[0];
        TensorSpec::new(shape, x.dtype)
    }

    impl RowsMatmul for CubeBackend {
        fn rows_fused(
            x: CubeTensor,
            w: CubeTensor,
            g: CubeTensor,
            res: CubeTensor,
            norm: bool,
            silu: bool,
            residual: bool,
            eps: u32,
        ) -> CubeTensor {
            let n = w.meta.shape()[0];
            let none = Codes { bits: 0, group: 1, zero: 0, offset: false };
            launch(x, [w.clone(), w.clone(), w], g, res, n, [norm, silu, residual], eps, none)
        }

        fn rows_fused_blocks(
            x: CubeTensor,
            scales: CubeTensor,
            codes: CubeTensor,
            offsets: CubeTensor,
            g: CubeTensor,
            res: CubeTensor,
            n: usize,
            norm: bool,
            silu: bool,
            residual: bool,
            eps: u32,
            bits: u32,
            group: usize,
            zero: u32,
            offset: bool,
        ) -> CubeTensor {
            launch(x, [scales, codes, offsets], g, res, n, [norm, silu, residual], eps, Codes { bits, group, zero, offset })
        }
    }

    /// `splits` planes per output column `col` and group of `rows` rows of `x` (the planes of a
    /// column neighbours in the workgroup, its groups' planes next to one another): lane `i` of
    /// split `s` sums `x'[r, j] * w[col, j]` over `j = s·PLANE_DIM + i`, stepping by
    /// `splits·PLANE_DIM`, for every row `r` of its group, where `x'` is `x`, (`norm`) its RMSNorm
    /// with weight `g`, or (`silu`) `silu(gate) * up` of its halves; then each plane adds its
    /// lanes, the first split adds the others' sums through shared memory, and (`residual`)
    /// `res` is added. `x` has `m` rows, `width` apart; a last group that runs past them repeats
    /// the last row and writes nothing for it. The weights are `w` itself (`bits` 0) or decoded
    /// from `codes` (`weight`). Buffers a flag leaves unused are bound to any read-only operand.
    #[cube(launch)]
    #[allow(clippy::too_many_arguments)]
    fn rows_by_weight(
        x: &[f32],
        w: &[f32],
        codes: &[i32],
        offsets: &[f32],
        g: &[f32],
        res: &[f32],
        out: &mut [f32],
        k: usize,
        n: usize,
        width: usize,
        eps: f32,
        m: usize,
        #[comptime] groups: usize,
        #[comptime] rows: usize,
        #[comptime] splits: usize,
        #[comptime] norm: bool,
        #[comptime] silu: bool,
        #[comptime] residual: bool,
        #[comptime] bits: usize,
        #[comptime] group: usize,
        #[comptime] zero: usize,
        #[comptime] offset: bool,
    ) {
        let plane = PLANE_DIM as usize;
        let per_col = comptime![groups * splits];
        let slot = PLANE_POS as usize;
        let col = CUBE_POS_X as usize * (CUBE_DIM as usize / plane / per_col) + slot / per_col;
        let (first, split) = ((slot % per_col) / splits * rows, slot % splits);
        let mut acc = Array::<f32>::new(rows);
        let mut sq = Array::<f32>::new(rows);
        #[unroll]
        for r in 0..rows {
            acc[r] = f32::new(0.0);
            sq[r] = f32::new(0.0);
        }
        // the same for every lane of a plane, so the plane sums below run in uniform control flow
        if col < n {
            let mut j = split * plane + UNIT_POS_PLANE as usize;
            while j < k {
                let mut wv = weight(w, codes, offsets, col * k + j, bits, group, zero, offset);
                if comptime![norm] {
                    wv *= g[j];
                }
                #[unroll]
                for r in 0..rows {
                    let at = (first + r).min(m - 1) * width + j;
                    let mut xv = x[at];
                    if comptime![silu] {
                        xv = xv / (f32::new(1.0) + (-xv).exp()) * x[at + k];
                    }
                    acc[r] += xv * wv;
                    if comptime![norm] {
                        sq[r] += xv * xv;
                    }
                }
                j += plane * splits;
            }
        }
        if comptime![splits == 1] {
            if col < n {
                #[unroll]
                for r in 0..rows {
                    let s = plane_sum(acc[r]);
                    let q = if comptime![norm] { plane_sum(sq[r]) } else { f32::new(0.0) };
                    finish(s, q, first + r, col, res, out, k, n, m, eps, norm, residual);
                }
            }
        } else {
            // every plane reaches the barrier, whether or not its column exists
            let mut part = Shared::<[f32]>::new_slice(comptime![PLANES * GROUP_ROWS * 2]);
            #[unroll]
            for r in 0..rows {
                let s = plane_sum(acc[r]);
                let q = if comptime![norm] { plane_sum(sq[r]) } else { f32::new(0.0) };
                if UNIT_POS_PLANE == 0 {
                    part[(slot * rows + r) * 2] = s;
                    part[(slot * rows + r) * 2 + 1] = q;
                }
            }
            sync_cube();
            if split == 0 && col < n && UNIT_POS_PLANE == 0 {
                #[unroll]
                for r in 0..rows {
                    let mut s = f32::new(0.0);
                    let mut q = f32::new(0.0);
                    #[unroll]
                    for t in 0..splits {
                        s += part[((slot + t) * rows + r) * 2];
                        q += part[((slot + t) * rows + r) * 2 + 1];
                    }
                    finish(s, q, first + r, col, res, out, k, n, m, eps, norm, residual);
                }
            }
        }
    }

    /// Writes output `(row, col)` from its sum `s` (and, for `norm`, the sum of squares `q` of
    /// the row's `k` inputs), plus the residual; lane 0 of a plane only, and no row past `m`.
    #[cube]
    #[allow(clippy::too_many_arguments)]
    fn finish(s: f32, q: f32, row: usize, col: usize, res: &[f32], out: &mut [f32], k: usize, n: usize, m: usize, eps: f32, #[comptime] norm: bool, #[comptime] residual: bool) {
        let mut v = s;
        if comptime![norm] {
            v /= (q / f32::cast_from(k) + eps).sqrt();
        }
        if UNIT_POS_PLANE == 0 && row < m {
            if comptime![residual] {
                v += res[row * n + col];
            }
            out[row * n + col] = v;
        }
    }

    /// Weight `e` of the matrix (row-major): `w[e]`, or (`bits` > 0) the code at bits
    /// `bits·(e % per)` of word `e / per` of `codes` (`per = 32 / bits`), less `zero`, times the
    /// group's scale `w[e / group]`, plus its offset where the layout has one. The words are i32:
    /// the mask drops what an arithmetic shift brings in.
    #[cube]
    #[allow(clippy::too_many_arguments)]
    fn weight(w: &[f32], codes: &[i32], offsets: &[f32], e: usize, #[comptime] bits: usize, #[comptime] group: usize, #[comptime] zero: usize, #[comptime] offset: bool) -> f32 {
        if comptime![bits == 0] {
            w[e]
        } else {
            let per = comptime![32 / bits];
            let mask = comptime![((1u32 << bits) - 1) as i32];
            let code = (codes[e / per] >> i32::cast_from((e % per) * bits)) & mask;
            let v = w[e / group] * (f32::cast_from(code) - f32::new(comptime![zero as f32]));
            if comptime![offset] {
                v + offsets[e / group]
            } else {
                v
            }
        }
    }

    pub fn fused(x: Tensor<2>, w: Weight, input: Input, residual: Option<Tensor<2>>) -> Tensor<2> {
        let (norm, silu) = (matches!(input, Input::Norm(..)), matches!(input, Input::SiluMul));
        let (g, eps) = match input {
            Input::Norm(g, eps) => (g.clone().unsqueeze::<2>().into_dispatch(), eps as f32),
            _ => (x.clone().into_dispatch(), 0.0),
        };
        let has_residual = residual.is_some();
        let res = residual.unwrap_or_else(|| x.clone()).into_dispatch();
        Tensor::from_dispatch(match w {
            Weight::F32(w) => Dispatch::rows_fused(x.into_dispatch(), w.clone().into_dispatch(), g, res, norm, silu, has_residual, eps.to_bits()),
            Weight::Blocks(b) => {
                let l = b.layout;
                let offsets = b.offsets.as_ref().unwrap_or(&b.scales).clone().into_dispatch();
                Dispatch::rows_fused_blocks(
                    x.into_dispatch(),
                    b.scales.clone().into_dispatch(),
                    b.codes.clone().into_dispatch(),
                    offsets,
                    g,
                    res,
                    b.rows,
                    norm,
                    silu,
                    has_residual,
                    eps.to_bits(),
                    l.bits,
                    l.group,
                    l.zero,
                    l.offset,
                )
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::test_support::{kernels_run, value};
    use crate::pretrained::weights::f32_tensor;

    /// Each input form, with and without a residual, against f64 arithmetic on the host, for row
    /// counts around the kernel's limit, ones whose last group runs past the rows (5 and 17), and
    /// a `k` that is no multiple of a plane. Where the kernels run, it must take every case of at
    /// most `MAX_ROWS` rows; the CPU runs none.
    #[test]
    fn rows_kernel_equals_f64_arithmetic() {
        let device = crate::testing::device();
        let dev = device.burn().unwrap();
        let (k, n, eps) = (577, 70, 1e-5);
        let w: Vec<f64> = (0..n * k).map(|i| value(i, 1)).collect();
        let g: Vec<f64> = (0..k).map(|i| 0.5 + value(i, 2)).collect();
        let f32s = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<f32>>();
        let (wt, gt) = (f32_tensor(f32s(&w), [n, k], &dev), f32_tensor(f32s(&g), [k], &dev));
        if !kernels_run(&wt, &device) {
            return;
        }
        for m in [1, 5, 17, MAX_ROWS, MAX_ROWS + 1] {
            for form in 0..3 {
                for with_residual in [false, true] {
                    let width = if form == 2 { 2 * k } else { k };
                    // rounded to f32 first, as the kernel sees them
                    let x: Vec<f64> = (0..m * width).map(|i| value(i, m + form) as f32 as f64).collect();
                    let res: Vec<f64> = (0..m * n).map(|i| value(i, 7) as f32 as f64).collect();
                    let input = match form {
                        0 => Input::Plain,
                        1 => Input::Norm(&gt, eps),
                        _ => Input::SiluMul,
                    };
                    let residual = with_residual.then(|| f32_tensor(f32s(&res), [m, n], &dev));
                    let got = match fused(f32_tensor(f32s(&x), [m, width], &dev), Weight::F32(&wt), input, residual) {
                        Ok(got) => got,
                        Err(_) => {
                            assert!(m > MAX_ROWS, "the kernel refused {m} rows");
                            continue;
                        }
                    };
                    assert_eq!(got.dims(), [m, n]);
                    let got = got.into_data().try_into_vec::<f32>().unwrap();
                    let tag = format!("m {m} form {form} residual {with_residual}");
                    assert_rows_match(&got, &x, &w, with_residual.then_some(&res[..]), &g, (m, n, k, eps), form, &tag);
                }
            }
        }
    }

    /// The kernel's `got` (`m` rows of `n`) against f64 arithmetic: each row of `x` in input form
    /// `form` (plain; RMS-normalised with the weights `g`; SiLU of its first half times its
    /// second) against the `n` rows of `k` values of `w`, plus `res` where given, within 1e-5 of
    /// the sum of the terms' magnitudes.
    #[allow(clippy::too_many_arguments)]
    fn assert_rows_match(got: &[f32], x: &[f64], w: &[f64], res: Option<&[f64]>, g: &[f64], (m, n, k, eps): (usize, usize, usize, f64), form: usize, tag: &str) {
        let width = if form == 2 { 2 * k } else { k };
        for r in 0..m {
            let row = &x[r * width..(r + 1) * width];
            let xr: Vec<f64> = match form {
                0 => row.to_vec(),
                1 => {
                    let scale = 1.0 / (row.iter().map(|a| a * a).sum::<f64>() / k as f64 + eps).sqrt();
                    row.iter().zip(g).map(|(a, b)| a * scale * b).collect()
                }
                _ => (0..k).map(|j| row[j] / (1.0 + (-row[j]).exp()) * row[k + j]).collect(),
            };
            for c in 0..n {
                let terms = (0..k).map(|j| xr[j] * w[c * k + j]);
                let want = terms.clone().sum::<f64>() + res.map_or(0.0, |res| res[r * n + c]);
                let bound = 1e-5 * (terms.map(f64::abs).sum::<f64>() + 1.0);
                let v = got[r * n + c] as f64;
                assert!((v - want).abs() <= bound, "{tag} at ({r}, {c}): {v} vs {want}");
            }
        }
    }

    /// Every quantised format as GPU blocks, each input form with a residual, against f64
    /// arithmetic on GGML's dequantised values (`dequantise_row`), for 1, 7 and `MAX_ROWS` rows:
    /// the codes are decoded as `groups` lays them out, whichever row, group and word a lane reads.
    #[test]
    fn rows_kernel_decodes_gpu_blocks() {
        use crate::kernels::cpu::quant::dequantise_row;
        use crate::kernels::cpu::quant::tests::{random_blocks, QUANTISED};
        let device = crate::testing::device();
        let dev = device.burn().unwrap();
        let (k, n, eps) = (512, 37, 1e-5);
        if !kernels_run(&f32_tensor(vec![0.0], [1], &dev), &device) {
            return;
        }
        for f in QUANTISED {
            let data = random_blocks(f, n, k, 11);
            let blocks = GpuBlocks::stack(&[(f, n, data.clone())], k, &dev).unwrap();
            let mut w = vec![0f32; n * k];
            let row = data.len() / n;
            for (r, out) in w.chunks_exact_mut(k).enumerate() {
                dequantise_row(f, &data[r * row..(r + 1) * row], out);
            }
            let w: Vec<f64> = w.into_iter().map(f64::from).collect();
            let g: Vec<f64> = (0..k).map(|i| 0.5 + value(i, 2)).collect();
            let gt = f32_tensor(g.iter().map(|&v| v as f32).collect(), [k], &dev);
            for m in [1, 7, MAX_ROWS] {
                for form in 0..3 {
                    let width = if form == 2 { 2 * k } else { k };
                    let x: Vec<f64> = (0..m * width).map(|i| value(i, m + form) as f32 as f64).collect();
                    let res: Vec<f64> = (0..m * n).map(|i| value(i, 7) as f32 as f64).collect();
                    let input = [Input::Plain, Input::Norm(&gt, eps), Input::SiluMul][form];
                    let xt = f32_tensor(x.iter().map(|&v| v as f32).collect(), [m, width], &dev);
                    let rt = f32_tensor(res.iter().map(|&v| v as f32).collect(), [m, n], &dev);
                    let got = fused(xt, Weight::Blocks(&blocks), input, Some(rt)).unwrap_or_else(|_| panic!("{f:?}: the kernel refused {m} rows"));
                    assert_eq!(got.dims(), [m, n]);
                    let got = got.into_data().try_into_vec::<f32>().unwrap();
                    assert_rows_match(&got, &x, &w, Some(&res), &g, (m, n, k, eps), form, &format!("{f:?} m {m} form {form}"));
                }
            }
        }
    }
}
