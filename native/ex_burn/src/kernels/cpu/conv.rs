//! 2-D convolution on the CPU as one im2col pass plus a batched matrix product.
//!
//! flex's conv2d converts the input to NHWC, builds im2col tiles and calls gemm once per tile,
//! so its layout work costs more than the product itself (guides/backend.md has the timings).
//! Here the columns are laid out [N, C*KH*KW, OH*OW], so the product
//! k [O, C*KH*KW] . cols[n] is already the NCHW output and no layout conversion is needed.
//! Groups other than 1 and non-f32 tensors keep flex's path. Written against Burn's public API
//! so it could move into burn-flex.

use burn::backend::ops::{ConvOptions, FloatTensorOps};
use burn::backend::{Dispatch, TensorData};

use super::vector::{flex_f32, par_chunks_for};
use crate::dispatch::{self, Prim};

/// `conv2d(x, k)` without bias for contiguous f32 flex tensors and one group, else `None`: 3x3
/// kernels at stride 1 through Winograd (`winograd`, which declines non-finite values),
/// everything else through im2col.
pub fn conv2d(x: &Prim, k: &Prim, opts: &ConvOptions<2>) -> Option<Prim> {
    if let Some(y) = super::winograd::conv2d(x, k, opts) {
        return Some(y);
    }
    im2col(x, k, opts)
}

/// `conv2d` through im2col and one batched matrix product.
pub(crate) fn im2col(x: &Prim, k: &Prim, opts: &ConvOptions<2>) -> Option<Prim> {
    if opts.groups != 1 {
        return None;
    }
    // the kernel is only reshaped, but must be a contiguous f32 tensor for that to be a view
    let (xs, _) = (flex_f32(x)?, flex_f32(k)?);
    let (xd, kd) = (dispatch::dims(x), dispatch::dims(k));
    let ([n, c, h, w], [o, kc, kh, kw]) = (<[usize; 4]>::try_from(xd).ok()?, <[usize; 4]>::try_from(kd).ok()?);
    if kc != c || kh == 0 || kw == 0 {
        return None;
    }
    let ([sh, sw], [dh, dw], [(ph, _), (pw, _)]) = (opts.stride, opts.dilation, opts.padding);
    let out_len = |len: usize, (lo, hi): (usize, usize), k: usize, s: usize, d: usize| {
        (len + lo + hi).checked_sub(d * (k - 1) + 1).map(|span| span / s + 1)
    };
    let oh = out_len(h, opts.padding[0], kh, sh, dh)?;
    let ow = out_len(w, opts.padding[1], kw, sw, dw)?;
    let (rows, cols) = (c * kh * kw, oh * ow);
    // one row of the column matrix: input channel ci, kernel offset (i, j), every output position
    let fill_row = |b: usize, r: usize, row: &mut [f32]| {
        let (ci, i, j) = (r / (kh * kw), (r / kw) % kh, r % kw);
        let plane = &xs[(b * c + ci) * h * w..][..h * w];
        for y in 0..oh {
            let out = &mut row[y * ow..][..ow];
            let iy = (y * sh + i * dh) as isize - ph as isize;
            if iy < 0 || iy >= h as isize {
                out.fill(0.0);
                continue;
            }
            let src = &plane[iy as usize * w..][..w];
            // output columns whose input column x * sw + j * dw - pw falls inside the row
            let shift = (j * dw) as isize - pw as isize;
            let first = if shift >= 0 { 0 } else { ((-shift) as usize).div_ceil(sw) }.min(ow);
            let end = if (w as isize) <= shift { 0 } else { ((w as isize - shift) as usize).div_ceil(sw) }.clamp(first, ow);
            out[..first].fill(0.0);
            out[end..].fill(0.0);
            let start = (first * sw) as isize + shift;
            if sw == 1 {
                out[first..end].copy_from_slice(&src[start as usize..][..end - first]);
            } else {
                for (k, v) in out[first..end].iter_mut().enumerate() {
                    *v = src[start as usize + k * sw];
                }
            }
        }
    };
    let mut buf = vec![0.0f32; n * rows * cols];
    par_chunks_for(&mut buf, cols, n * rows * cols, |t, row| fill_row(t / rows, t % rows, row));
    let device = burn::tensor::Device::flex();
    let cols_t = dispatch::from_data(TensorData::new(buf, [n, rows, cols]), &device);
    let kernel = dispatch::reshape(k.clone(), &[1, o, rows]);
    // flex's matmul broadcasts the kernel over the batch
    let y = Dispatch::float_matmul(kernel, cols_t);
    Some(dispatch::reshape(y, &[n, o, oh, ow]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{flex_f32s as flex, prim_f32s as values};
    use burn::backend::ops::ModuleOps;

    fn pseudo(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 2001) as f32 / 1000.0 - 1.0).collect()
    }

    #[test]
    fn equals_flex_conv2d_over_strides_paddings_and_dilations() {
        for (case, ([n, c, h, w], [o, kh, kw], stride, padding, dilation)) in [
            ([8, 32, 32, 32], [64, 3, 3], [1, 1], [(1, 1), (1, 1)], [1, 1]),
            ([2, 3, 7, 9], [4, 3, 2], [2, 3], [(2, 0), (1, 3)], [1, 2]),
            ([1, 1, 5, 5], [1, 5, 5], [1, 1], [(0, 0), (0, 0)], [1, 1]),
            ([3, 2, 4, 6], [5, 1, 1], [1, 2], [(0, 1), (2, 2)], [1, 1]),
            ([1, 4, 10, 3], [2, 3, 2], [3, 1], [(4, 4), (0, 0)], [2, 1]),
        ]
        .into_iter()
        .enumerate()
        {
            let x = flex(pseudo(n * c * h * w, 1), &[n, c, h, w]);
            let k = flex(pseudo(o * c * kh * kw, 7), &[o, c, kh, kw]);
            let opts = ConvOptions { stride, padding, dilation, groups: 1 };
            let ours = conv2d(&x, &k, &opts).expect("f32, one group");
            assert_eq!(dispatch::dims(&ours), dispatch::dims(&Dispatch::conv2d(x.clone(), k.clone(), None, opts.clone())), "case {case}");
            let (ours, theirs) = (values(ours), values(Dispatch::conv2d(x, k, None, opts)));
            for (a, b) in ours.iter().zip(&theirs) {
                assert!((a - b).abs() <= 1e-4 * (c * kh * kw) as f32, "case {case}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn other_groups_dtypes_and_kernels_larger_than_the_input_are_left_to_flex() {
        let x = flex(pseudo(2 * 4 * 4 * 4, 1), &[2, 4, 4, 4]);
        let k = flex(pseudo(4 * 2 * 3 * 3, 2), &[4, 2, 3, 3]);
        let grouped = ConvOptions { stride: [1, 1], padding: [(0, 0); 2], dilation: [1, 1], groups: 2 };
        assert!(conv2d(&x, &k, &grouped).is_none());
        let big = flex(pseudo(4 * 4 * 5 * 5, 2), &[4, 4, 5, 5]);
        let one = ConvOptions { groups: 1, ..grouped };
        assert!(conv2d(&x, &big, &one).is_none());
    }
}
