//! Nx.conv on Burn's conv1d/conv2d/conv3d, with Nx's whole option set.
//!
//! Burn's convolution takes stride, symmetric padding, kernel dilation and feature groups. The
//! rest of Nx's options are rewritten around it: permutations are transposes, input dilation
//! interleaves zeros, unequal padding is added and negative padding crops before the
//! convolution, and batch groups move batch slices into the
//! channel axis so that they become feature groups (XLA's definition: batch group `j` meets the
//! `j`-th block of output features).

use burn::backend::ops::{ConvOptions, ModuleOps};
use burn::backend::{DType, Dispatch, Scalar};

use crate::dispatch;
use crate::dtype::NxType;
use crate::error::{ExError, ExResult};
use crate::ops::window::{pad_constant, pad_interior_prim, Fill};
use crate::ops::{check_alloc, check_axes, dims_detail, empty, colocate};
use crate::tensor::{numel, Handle};

pub struct ConvSpec {
    pub strides: Vec<usize>,
    pub padding: Vec<(i64, i64)>,
    pub input_dilation: Vec<usize>,
    pub kernel_dilation: Vec<usize>,
    pub feature_groups: usize,
    pub batch_groups: usize,
    pub input_perm: Vec<usize>,
    pub kernel_perm: Vec<usize>,
    pub output_perm: Vec<usize>,
}

fn inverse(perm: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    inv
}

fn options<const N: usize>(spec: &ConvSpec, padding: &[(usize, usize)], groups: usize) -> ConvOptions<N> {
    ConvOptions {
        stride: spec.strides.clone().try_into().expect("one stride per spatial axis"),
        padding: padding.to_vec().try_into().expect("one padding pair per spatial axis"),
        dilation: spec.kernel_dilation.clone().try_into().expect("one dilation per spatial axis"),
        groups,
    }
}

/// Nx.conv: result of the float type `out`. f16/bf16 are computed in f32 and rounded once;
/// integer operands are converted to `out` first.
pub fn conv(x: &Handle, k: &Handle, spec: &ConvSpec, out: NxType) -> ExResult<Handle> {
    let (device, [x, k]) = colocate([x, k])?;
    let (x, k) = (x.as_ref(), k.as_ref());
    device.check_type(out)?;
    let rank = x.rank();
    let n = rank.saturating_sub(2);
    let bad = |reason: &str| {
        ExError::invalid_with(
            reason.to_string(),
            vec![
                dims_detail("input", &x.shape),
                dims_detail("kernel", &k.shape),
                dims_detail("strides", &spec.strides),
                dims_detail("input_dilation", &spec.input_dilation),
                dims_detail("kernel_dilation", &spec.kernel_dilation),
            ],
        )
    };
    if !out.is_float() {
        return Err(bad("conv output must be a float type"));
    }
    if k.rank() != rank || !(1..=3).contains(&n) {
        return Err(bad("conv needs input and kernel of the same rank with 1 to 3 spatial axes"));
    }
    for perm in [&spec.input_perm, &spec.kernel_perm, &spec.output_perm] {
        if perm.len() != rank {
            return Err(bad("permutations must name every axis"));
        }
        check_axes(perm, rank)?;
    }
    let lens_ok = [spec.strides.len(), spec.padding.len(), spec.input_dilation.len(), spec.kernel_dilation.len()].iter().all(|&l| l == n);
    let positive = spec.strides.iter().chain(&spec.input_dilation).chain(&spec.kernel_dilation).all(|&v| v > 0);
    if !lens_ok || !positive {
        return Err(bad("strides, padding and dilations need one positive entry per spatial axis"));
    }
    let xs: Vec<usize> = spec.input_perm.iter().map(|&a| x.shape[a]).collect();
    let ks: Vec<usize> = spec.kernel_perm.iter().map(|&a| k.shape[a]).collect();
    let (batch, cin, cout, kin) = (xs[0], xs[1], ks[0], ks[1]);
    let (fg, bg) = (spec.feature_groups, spec.batch_groups);
    let groups_ok = fg > 0
        && bg > 0
        && (fg == 1 || bg == 1)
        && batch % bg == 0
        && cin == kin * fg
        && cout % fg == 0
        && cout % bg == 0;
    if !groups_ok {
        return Err(bad("channels, batch and filters do not match the group sizes"));
    }
    let dilated: Vec<usize> = (0..n).map(|i| if xs[2 + i] == 0 { 0 } else { (xs[2 + i] - 1) * spec.input_dilation[i] + 1 }).collect();
    let mut spatial = Vec::with_capacity(n);
    for i in 0..n {
        let padded = dilated[i] as i64 + spec.padding[i].0 + spec.padding[i].1;
        let span = if ks[2 + i] == 0 { 0 } else { ((ks[2 + i] - 1) * spec.kernel_dilation[i] + 1) as i64 };
        if padded < 0 {
            return Err(bad("negative padding removes more than the spatial axis holds"));
        }
        spatial.push(if padded < span { 0 } else { ((padded - span) as usize) / spec.strides[i] + 1 });
    }
    let mut raw = vec![batch / bg, cout];
    raw.extend(&spatial);
    let inv = inverse(&spec.output_perm);
    let shape: Vec<usize> = inv.iter().map(|&a| raw[a]).collect();
    check_alloc(&shape, out)?;
    if numel(&shape) == 0 {
        return empty(shape, out, device);
    }
    let compute = if out == NxType::F(64) { DType::F64 } else { DType::F32 };
    let burn = device.burn()?;
    if kin == 0 || ks[2..].contains(&0) || x.numel() == 0 {
        // An empty contraction: every output is the empty sum.
        return Ok(Handle::new(dispatch::full(&shape, Scalar::Float(0.0), out.dtype(), &burn), out, shape, device));
    }

    let px = dispatch::permute(dispatch::cast(x.prim.clone(), compute), &spec.input_perm);
    let pk = dispatch::permute(dispatch::cast(k.prim.clone(), compute), &spec.kernel_perm);
    let zero = Fill::Value(Scalar::Float(0.0));
    let mut interior = vec![0, 0];
    interior.extend(spec.input_dilation.iter().map(|d| d - 1));
    let (px, xs) = pad_interior_prim(px, &xs, &interior, &zero, &burn);
    // Burn pads equal sides itself. Unequal sides are padded here (Burn's GPU convolutions
    // refuse them), and a negative side crops, padding included.
    let (px, xs, padding) = if spec.padding.iter().any(|&(lo, hi)| lo < 0 || hi < 0 || lo != hi) {
        let mut pads = vec![(0, 0), (0, 0)];
        pads.extend(&spec.padding);
        let (p, s) = pad_constant(px, &xs, &pads, &zero, &burn)?;
        (p, s, vec![(0, 0); n])
    } else {
        (px, xs, spec.padding.iter().map(|&(lo, hi)| (lo as usize, hi as usize)).collect())
    };
    let (px, groups) = if bg > 1 {
        // [b*m, c, ...] -> [m, b*c, ...]: batch slice j becomes channel block j.
        let m = batch / bg;
        let rest = &xs[2..];
        let split: Vec<usize> = [bg, m, cin].iter().chain(rest).copied().collect();
        let t = dispatch::reshape(px, &split);
        let mut order = vec![1, 0];
        order.extend(2..split.len());
        let t = dispatch::permute(t, &order);
        let merged: Vec<usize> = [m, bg * cin].iter().chain(rest).copied().collect();
        (dispatch::reshape(t, &merged), bg)
    } else {
        (px, fg)
    };
    let y = match n {
        1 => Dispatch::conv1d(px, pk, None, options::<1>(spec, &padding, groups)),
        2 => {
            let opts = options::<2>(spec, &padding, groups);
            match crate::kernels::cpu::conv::conv2d(&px, &pk, &opts) {
                Some(y) => y,
                None => Dispatch::conv2d(px, pk, None, opts),
            }
        }
        _ => Dispatch::conv3d(px, pk, None, options::<3>(spec, &padding, groups)),
    };
    let y = dispatch::permute(y, &inv);
    Ok(Handle::new(dispatch::cast(y, out.dtype()), out, shape, device))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;

    fn spec(n: usize) -> ConvSpec {
        let ident: Vec<usize> = (0..n + 2).collect();
        ConvSpec {
            strides: vec![1; n],
            padding: vec![(0, 0); n],
            input_dilation: vec![1; n],
            kernel_dilation: vec![1; n],
            feature_groups: 1,
            batch_groups: 1,
            input_perm: ident.clone(),
            kernel_perm: ident.clone(),
            output_perm: ident,
        }
    }

    #[test]
    fn conv1d_valid_strided_and_padded() {
        let x = f32s(&[1.0, 2.0, 3.0, 4.0], &[1, 1, 4]);
        let k = f32s(&[1.0, -1.0], &[1, 1, 2]);
        let y = conv(&x, &k, &spec(1), NxType::F(32)).unwrap();
        assert_eq!((y.shape.clone(), floats(&y)), (vec![1, 1, 3], vec![-1.0, -1.0, -1.0]));
        // padding (2, 1), stride 2 over [0 0 1 2 3 4 0]: windows at 0, 2, 4
        let s = ConvSpec { strides: vec![2], padding: vec![(2, 1)], ..spec(1) };
        assert_eq!(floats(&conv(&x, &k, &s, NxType::F(32)).unwrap()), vec![0.0, -1.0, -1.0]);
        // negative padding drops the first element: [2 3 4]
        let s = ConvSpec { padding: vec![(-1, 0)], ..spec(1) };
        assert_eq!(floats(&conv(&x, &k, &s, NxType::F(32)).unwrap()), vec![-1.0, -1.0]);
    }

    #[test]
    fn conv_dilations() {
        let x = f32s(&[1.0, 2.0, 3.0, 4.0], &[1, 1, 4]);
        let k = f32s(&[1.0, 10.0], &[1, 1, 2]);
        // kernel dilation 2: x[i] + 10 x[i+2]
        let s = ConvSpec { kernel_dilation: vec![2], ..spec(1) };
        assert_eq!(floats(&conv(&x, &k, &s, NxType::F(32)).unwrap()), vec![31.0, 42.0]);
        // input dilation 2: [1 0 2 0 3 0 4] -> x + 10 y over neighbours
        let s = ConvSpec { input_dilation: vec![2], ..spec(1) };
        assert_eq!(floats(&conv(&x, &k, &s, NxType::F(64)).unwrap()), vec![1.0, 20.0, 2.0, 30.0, 3.0, 40.0]);
    }

    #[test]
    fn conv2d_with_channels_and_feature_groups() {
        // two channels of 2x2, one 1x1 filter per channel in two groups, integer input
        let x = i64s(&[1, 2, 3, 4, 5, 6, 7, 8], &[1, 2, 2, 2]);
        let k = f32s(&[2.0, -1.0], &[2, 1, 1, 1]);
        let s = ConvSpec { feature_groups: 2, ..spec(2) };
        let y = conv(&x, &k, &s, NxType::F(32)).unwrap();
        assert_eq!((y.shape.clone(), floats(&y)), (vec![1, 2, 2, 2], vec![2.0, 4.0, 6.0, 8.0, -5.0, -6.0, -7.0, -8.0]));
        // without groups, one filter summing both channels
        let k = f32s(&[1.0, 1.0], &[1, 2, 1, 1]);
        assert_eq!(floats(&conv(&x, &k, &spec(2), NxType::F(32)).unwrap()), vec![6.0, 8.0, 10.0, 12.0]);
    }

    #[test]
    fn conv_batch_groups_pair_batch_blocks_with_filter_blocks() {
        // batch 2 (values 1s and 2s), 2 batch groups, 2 filters (x1, x10): output batch 1 with
        // feature 0 from batch 0 and feature 1 from batch 1.
        let x = f32s(&[1.0, 1.0, 2.0, 2.0], &[2, 1, 2]);
        let k = f32s(&[1.0, 10.0], &[2, 1, 1]);
        let s = ConvSpec { batch_groups: 2, ..spec(1) };
        let y = conv(&x, &k, &s, NxType::F(32)).unwrap();
        assert_eq!((y.shape.clone(), floats(&y)), (vec![1, 2, 2], vec![1.0, 1.0, 20.0, 20.0]));
    }

    #[test]
    fn conv_permutations_and_3d() {
        // channels-last 1D input [batch, length, channels] and output [batch, length, features]
        let x = f32s(&[1.0, 2.0, 3.0], &[1, 3, 1]);
        let k = f32s(&[1.0, 1.0], &[1, 1, 2]);
        let s = ConvSpec { input_perm: vec![0, 2, 1], output_perm: vec![0, 2, 1], ..spec(1) };
        let y = conv(&x, &k, &s, NxType::F(32)).unwrap();
        assert_eq!((y.shape.clone(), floats(&y)), (vec![1, 2, 1], vec![3.0, 5.0]));
        let x = f32s(&[1.0; 8], &[1, 1, 2, 2, 2]);
        let k = f32s(&[1.0; 8], &[1, 1, 2, 2, 2]);
        let y = conv(&x, &k, &spec(3), NxType::F(16)).unwrap();
        assert_eq!((y.shape.clone(), y.ty, floats(&y)), (vec![1, 1, 1, 1, 1], NxType::F(16), vec![8.0]));
        // unequal padding (Nx's :same for even kernels): a zero plane before axis 0, after axis 1
        let s = ConvSpec { padding: vec![(1, 0), (0, 1), (0, 0)], ..spec(3) };
        let y = conv(&x, &k, &s, NxType::F(32)).unwrap();
        assert_eq!((y.shape.clone(), floats(&y)), (vec![1, 1, 2, 2, 1], vec![4.0, 2.0, 8.0, 4.0]));
    }

    #[test]
    fn conv_rejects_mismatched_channels() {
        let x = f32s(&[1.0; 4], &[1, 2, 2]);
        let k = f32s(&[1.0; 3], &[1, 3, 1]);
        assert!(conv(&x, &k, &spec(1), NxType::F(32)).is_err());
        assert!(conv(&x, &f32s(&[1.0; 2], &[1, 2, 1]), &spec(1), NxType::S(32)).is_err());
    }
}
