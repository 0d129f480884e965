//! Nx's window reductions (`window_sum/product/max/min`), `window_scatter_max/min`, and the
//! constant and interior padding they share with conv and `pad`.
//!
//! A window reduction over a box is separable: reducing along one axis at a time gives the same
//! values as reducing each whole window (exactly for max/min and integers, up to float rounding
//! order for sums and products). Along one axis the window is `w` strided slices of the padded
//! tensor combined element-wise, so the cost is `sum(window dims)` element-wise ops rather than
//! `product(window dims)`, and everything runs on the device's own kernels.

use burn::backend::ops::{BoolTensorOps, FloatTensorOps, IntTensorOps};
use burn::backend::{DType, Dispatch, Scalar, Slice};
use burn::tensor::Device;

use crate::dispatch::{self, by_kind, by_kind2, Prim, BOOL};
use crate::dtype::NxType;
use crate::error::{ExError, ExResult};
use crate::ops::vocab::WindowOp;
use crate::ops::{cast_to, check_alloc, dims_detail, empty, colocate};
use crate::tensor::{numel, Handle};

/// What fills new positions: a constant, or a one-element tensor (Nx's pad value is a tensor).
pub(crate) enum Fill {
    Value(Scalar),
    Tensor(Prim),
}

fn full_slices(shape: &[usize]) -> Vec<Slice> {
    shape.iter().map(|&d| Slice::new(0, Some(d as isize), 1)).collect()
}

/// A tensor of `shape` and `dtype` holding `fill` everywhere.
pub(crate) fn filled(shape: &[usize], fill: &Fill, dtype: DType, device: &Device) -> Prim {
    match fill {
        Fill::Value(v) => dispatch::full(shape, *v, dtype, device),
        Fill::Tensor(t) => {
            // Assigning a broadcast view writes the value's exact bits (-0.0 and NaN payloads
            // included), which arithmetic such as `zeros + value` would not.
            let zeros = dispatch::full(shape, dispatch::zero_of(dtype), dtype, device);
            let one = dispatch::reshape(dispatch::cast(t.clone(), dtype), &vec![1; shape.len()]);
            let value = dispatch::expand(one, shape);
            let slices = full_slices(&crate::dispatch::burn_shape(shape));
            by_kind!(zeros, float_slice_assign, int_slice_assign, &slices, value)
        }
    }
}

fn pad_error(shape: &[usize], what: &str) -> ExError {
    ExError::invalid_with(format!("{what} does not fit the tensor"), vec![dims_detail("shape", shape)])
}

/// Pads with `(lo, hi)` per axis: positive sides are filled with `fill`, then negative sides are
/// cut off the padded tensor (so a negative side may remove padding, as in XLA's pad).
pub(crate) fn pad_constant(
    prim: Prim,
    shape: &[usize],
    pads: &[(i64, i64)],
    fill: &Fill,
    device: &Device,
) -> ExResult<(Prim, Vec<usize>)> {
    if pads.len() != shape.len() {
        return Err(pad_error(shape, "padding"));
    }
    let grown: Vec<usize> = shape.iter().zip(pads).map(|(&d, &(lo, hi))| d + lo.max(0) as usize + hi.max(0) as usize).collect();
    let mut prim = prim;
    if grown != shape {
        let dtype = dispatch::dtype(&prim);
        let out = filled(&grown, fill, dtype, device);
        prim = if numel(shape) == 0 {
            out
        } else {
            let center: Vec<Slice> = shape
                .iter()
                .zip(pads)
                .map(|(&d, &(lo, _))| {
                    let lo = lo.max(0) as isize;
                    Slice::new(lo, Some(lo + d as isize), 1)
                })
                .collect();
            by_kind!(out, float_slice_assign, int_slice_assign, &center, prim)
        };
    }
    let cut: Vec<(usize, usize)> = pads.iter().map(|&(lo, hi)| ((-lo).max(0) as usize, (-hi).max(0) as usize)).collect();
    if cut.iter().all(|&(lo, hi)| lo == 0 && hi == 0) {
        return Ok((prim, grown));
    }
    if grown.iter().zip(&cut).any(|(&d, &(lo, hi))| lo + hi > d) {
        return Err(pad_error(shape, "negative padding"));
    }
    let out: Vec<usize> = grown.iter().zip(&cut).map(|(&d, &(lo, hi))| d - lo - hi).collect();
    if numel(&out) == 0 || numel(&grown) == 0 {
        let dtype = dispatch::dtype(&prim);
        return Ok((dispatch::full(&out, dispatch::zero_of(dtype), dtype, device), out));
    }
    let slices: Vec<Slice> = out.iter().zip(&cut).map(|(&d, &(lo, _))| Slice::new(lo as isize, Some((lo + d) as isize), 1)).collect();
    Ok((dispatch::slice(prim, &slices), out))
}

/// The shape after inserting `interior[i]` elements between neighbours along each axis.
fn interior_shape(shape: &[usize], interior: &[usize]) -> Vec<usize> {
    shape.iter().zip(interior).map(|(&d, &i)| if d == 0 { 0 } else { (d - 1) * (i + 1) + 1 }).collect()
}

/// Inserts `interior[i]` copies of `fill` between neighbours along each axis.
pub(crate) fn pad_interior_prim(prim: Prim, shape: &[usize], interior: &[usize], fill: &Fill, device: &Device) -> (Prim, Vec<usize>) {
    let out = interior_shape(shape, interior);
    if out == shape {
        return (prim, out);
    }
    let dtype = dispatch::dtype(&prim);
    let base = filled(&out, fill, dtype, device);
    if numel(shape) == 0 {
        return (base, out);
    }
    let slices: Vec<Slice> = out.iter().zip(interior).map(|(&d, &i)| Slice::new(0, Some(d as isize), i as isize + 1)).collect();
    (by_kind!(base, float_slice_assign, int_slice_assign, &slices, prim), out)
}

/// Nx.pad: `config` holds `(lo, hi, interior)` per axis. Interior padding comes first, so a
/// negative edge cuts into the interior-padded tensor (as in XLA and Nx.BinaryBackend). The
/// tensor and `value` (a one-element tensor) are taken in `ty`, the result type.
pub fn pad(h: &Handle, value: &Handle, config: &[(i64, i64, usize)], ty: NxType) -> ExResult<Handle> {
    let (device, [h, value]) = colocate([h, value])?;
    let (h, value) = (h.as_ref(), value.as_ref());
    if config.len() != h.rank() || value.numel() != 1 {
        return Err(ExError::invalid_with(
            "pad needs one (lo, hi, interior) per axis and a one-element pad value",
            vec![dims_detail("shape", &h.shape), ("config", crate::error::Detail::Int(config.len() as i128)), dims_detail("value", &value.shape)],
        ));
    }
    device.check_type(ty)?;
    let interior: Vec<usize> = config.iter().map(|c| c.2).collect();
    let inner = interior_shape(&h.shape, &interior);
    let out: Option<Vec<usize>> = inner
        .iter()
        .zip(config)
        .map(|(&d, &(lo, hi, _))| usize::try_from(d as i128 + lo as i128 + hi as i128).ok())
        .collect();
    let Some(out) = out else { return Err(pad_error(&h.shape, "negative padding")) };
    check_alloc(&out, ty)?;
    let fill = Fill::Tensor(cast_to(value, ty));
    let burn = device.burn()?;
    let (prim, shape) = pad_interior_prim(cast_to(h, ty), &h.shape, &interior, &fill, &burn);
    let edges: Vec<(i64, i64)> = config.iter().map(|&(lo, hi, _)| (lo, hi)).collect();
    let (prim, shape) = pad_constant(prim, &shape, &edges, &fill, &burn)?;
    Ok(Handle::new(prim, ty, shape, device))
}

pub struct WindowSpec {
    pub dims: Vec<usize>,
    pub strides: Vec<usize>,
    pub padding: Vec<(i64, i64)>,
    pub dilations: Vec<usize>,
}

impl WindowSpec {
    fn check(&self, shape: &[usize]) -> ExResult<Vec<usize>> {
        let r = shape.len();
        let bad = |reason: &str| {
            ExError::invalid_with(
                reason.to_string(),
                vec![
                    dims_detail("shape", shape),
                    dims_detail("window", &self.dims),
                    dims_detail("strides", &self.strides),
                    dims_detail("dilations", &self.dilations),
                ],
            )
        };
        if self.dims.len() != r || self.strides.len() != r || self.padding.len() != r || self.dilations.len() != r {
            return Err(bad("window options need one entry per axis"));
        }
        if self.dims.iter().chain(&self.strides).chain(&self.dilations).any(|&x| x == 0) {
            return Err(bad("window dimensions, strides and dilations must be positive"));
        }
        (0..r)
            .map(|i| {
                let padded = shape[i] as i64 + self.padding[i].0 + self.padding[i].1;
                let span = ((self.dims[i] - 1) * self.dilations[i] + 1) as i64;
                if padded < 0 {
                    Err(bad("negative padding removes more than the axis holds"))
                } else if padded < span {
                    Ok(0)
                } else {
                    Ok(((padded - span) as usize) / self.strides[i] + 1)
                }
            })
            .collect()
    }
}

/// The reduction's identity, which is also what BinaryBackend pads with.
fn identity(op: WindowOp, ty: NxType) -> Scalar {
    match op {
        WindowOp::WindowSum => ty.scalar(0),
        WindowOp::WindowProduct => ty.scalar(1),
        WindowOp::WindowMax => ty.bounds().0,
        WindowOp::WindowMin => ty.bounds().1,
    }
}

/// Nx's NaN-propagating max/min (a comparison with NaN is false, so NaN must be picked
/// explicitly).
fn extreme(max: bool, a: Prim, b: Prim) -> Prim {
    let a_wins = if max {
        by_kind2!(a.clone(), b.clone(), float_greater_equal, int_greater_equal, BOOL)
    } else {
        by_kind2!(a.clone(), b.clone(), float_lower_equal, int_lower_equal, BOOL)
    };
    let a_wins = if dispatch::is_float(&a) { Dispatch::bool_or(a_wins, Dispatch::float_is_nan(a.clone(), BOOL)) } else { a_wins };
    dispatch::select(a_wins, a, b)
}

fn combine(op: WindowOp, a: Prim, b: Prim) -> Prim {
    match op {
        WindowOp::WindowSum => by_kind2!(a, b, float_add, int_add),
        WindowOp::WindowProduct => by_kind2!(a, b, float_mul, int_mul),
        WindowOp::WindowMax => extreme(true, a, b),
        WindowOp::WindowMin => extreme(false, a, b),
    }
}

/// Slices selecting, along `axis`, positions `start, start + stride, ...` (`count` of them).
fn strided(shape: &[usize], axis: usize, start: usize, count: usize, stride: usize) -> Vec<Slice> {
    (0..shape.len())
        .map(|i| {
            if i == axis {
                Slice::new(start as isize, Some((start + (count - 1) * stride + 1) as isize), stride as isize)
            } else {
                Slice::new(0, Some(shape[i] as isize), 1)
            }
        })
        .collect()
}

/// Nx.window_sum/product/max/min (op named as the callback), result of type `out`.
pub fn window_reduce(op: WindowOp, h: &Handle, spec: &WindowSpec, out: NxType) -> ExResult<Handle> {
    let device = h.device;
    device.check_type(out)?;
    let fill = Fill::Value(identity(op, out));
    let out_shape = spec.check(&h.shape)?;
    check_alloc(&out_shape, out)?;
    if numel(&out_shape) == 0 {
        return empty(out_shape, out, device);
    }
    if h.rank() == 0 {
        return Ok(Handle::new(cast_to(h, out), out, vec![], device));
    }
    // BinaryBackend folds float sums and products in f64 and rounds once at the end.
    let compute = if matches!(op, WindowOp::WindowSum | WindowOp::WindowProduct) && out.is_float() && out != NxType::F(64) && device.supports(NxType::F(64))? {
        NxType::F(64)
    } else {
        out
    };
    let burn = device.burn()?;
    let fill = if compute == out { fill } else { Fill::Value(identity(op, compute)) };
    let (mut x, mut shape) = pad_constant(cast_to(h, compute), &h.shape, &spec.padding, &fill, &burn)?;
    for axis in 0..shape.len() {
        let (w, s, d, o) = (spec.dims[axis], spec.strides[axis], spec.dilations[axis], out_shape[axis]);
        if w == 1 && s == 1 && o == shape[axis] {
            continue;
        }
        let mut acc: Option<Prim> = None;
        for j in 0..w {
            let part = dispatch::slice(x.clone(), &strided(&shape, axis, j * d, o, s));
            acc = Some(match acc {
                None => part,
                Some(a) => combine(op, a, part),
            });
        }
        x = acc.expect("window dimensions are positive");
        shape[axis] = o;
    }
    Ok(Handle::new(dispatch::cast(x, out.dtype()), out, out_shape, device))
}

/// The window offsets, in row-major order, of every element of a window of `dims`.
fn window_offsets(dims: &[usize]) -> Vec<Vec<usize>> {
    let total: usize = dims.iter().product();
    (0..total)
        .map(|mut flat| {
            let mut at = vec![0; dims.len()];
            for i in (0..dims.len()).rev() {
                at[i] = flat % dims[i];
                flat /= dims[i];
            }
            at
        })
        .collect()
}

fn window_slices(offset: &[usize], out: &[usize], strides: &[usize]) -> Vec<Slice> {
    offset
        .iter()
        .zip(out)
        .zip(strides)
        .map(|((&o, &n), &s)| Slice::new(o as isize, Some((o + (n - 1) * s + 1) as isize), s as isize))
        .collect()
}

/// Nx.window_scatter_max/min (`max` chooses which): every window's selected element (the last
/// maximum, resp. minimum, in row-major order, as BinaryBackend's `>=`/`<=` scan picks it)
/// receives the window's `source` value; positions gather `init + sum of what they received`.
/// The tensor is padded with `init` and compared in `select_type`; a selection that lands in the
/// padding is dropped. Result of type `out`.
#[allow(clippy::too_many_arguments)]
pub fn window_scatter(
    max: bool,
    h: &Handle,
    source: &Handle,
    init: &Handle,
    dims: Vec<usize>,
    strides: Vec<usize>,
    padding: Vec<(i64, i64)>,
    select_type: NxType,
    out: NxType,
) -> ExResult<Handle> {
    let (device, [h, source, init]) = colocate([h, source, init])?;
    let (h, source, init) = (h.as_ref(), source.as_ref(), init.as_ref());
    device.check_type(out)?;
    device.check_type(select_type)?;
    let r = h.rank();
    let spec = WindowSpec { dims, strides, padding, dilations: vec![1; r] };
    let windows = spec.check(&h.shape)?;
    let mismatch = || {
        ExError::invalid_with(
            "source must have the shape of the windows, init one element, padding non-negative",
            vec![dims_detail("shape", &h.shape), dims_detail("windows", &windows), dims_detail("source", &source.shape)],
        )
    };
    if windows != source.shape || init.numel() != 1 || spec.padding.iter().any(|&(lo, hi)| lo < 0 || hi < 0) {
        return Err(mismatch());
    }
    check_alloc(&h.shape, out)?;
    let burn = device.burn()?;
    let init_fill = Fill::Tensor(init.prim.clone());
    if r == 0 {
        // One window holding the one element: it is always selected.
        let prim = by_kind2!(cast_to(source, out), cast_to(init, out), float_add, int_add);
        return Ok(Handle::new(prim, out, vec![], device));
    }
    if h.numel() == 0 {
        return empty(h.shape.clone(), out, device);
    }
    if source.numel() == 0 {
        return Ok(Handle::new(filled(&h.shape, &init_fill, out.dtype(), &burn), out, h.shape.clone(), device));
    }
    let (x, padded) = pad_constant(cast_to(h, select_type), &h.shape, &spec.padding, &Fill::Tensor(init.prim.clone()), &burn)?;
    let offsets = window_offsets(&spec.dims);
    let mut best = dispatch::slice(x.clone(), &window_slices(&offsets[0], &windows, &spec.strides));
    let mut chosen = dispatch::full(&windows, Scalar::Int(0), DType::I64, &burn);
    for (j, off) in offsets.iter().enumerate().skip(1) {
        let value = dispatch::slice(x.clone(), &window_slices(off, &windows, &spec.strides));
        let take = if max {
            by_kind2!(value.clone(), best.clone(), float_greater_equal, int_greater_equal, BOOL)
        } else {
            by_kind2!(value.clone(), best.clone(), float_lower_equal, int_lower_equal, BOOL)
        };
        best = dispatch::select(take.clone(), value, best);
        chosen = Dispatch::int_mask_fill(chosen, take, Scalar::Int(j as i64));
    }
    let src = cast_to(source, out);
    let zero = dispatch::zero_of(out.dtype());
    let mut acc = dispatch::full(&padded, zero, out.dtype(), &burn);
    for (j, off) in offsets.iter().enumerate() {
        let other = Dispatch::int_not_equal_elem(chosen.clone(), Scalar::Int(j as i64), BOOL);
        let part = by_kind!(src.clone(), float_mask_fill, int_mask_fill, other, zero);
        let slices = window_slices(off, &windows, &spec.strides);
        let current = dispatch::slice(acc.clone(), &slices);
        let sum = by_kind2!(current, part, float_add, int_add);
        acc = by_kind!(acc, float_slice_assign, int_slice_assign, &slices, sum);
    }
    let center: Vec<Slice> = h.shape.iter().zip(&spec.padding).map(|(&d, &(lo, _))| Slice::new(lo as isize, Some(lo as isize + d as isize), 1)).collect();
    let acc = dispatch::slice(acc, &center);
    let base = filled(&h.shape, &init_fill, out.dtype(), &burn);
    let prim = by_kind2!(acc, base, float_add, int_add);
    Ok(Handle::new(prim, out, h.shape.clone(), device))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::elementwise::as_type;
    use crate::testing::*;

    fn spec(dims: &[usize], strides: &[usize], padding: &[(i64, i64)], dilations: &[usize]) -> WindowSpec {
        WindowSpec { dims: dims.to_vec(), strides: strides.to_vec(), padding: padding.to_vec(), dilations: dilations.to_vec() }
    }

    #[test]
    fn window_sum_and_max_in_one_dimension() {
        let x = f32s(&[1.0, 2.0, 3.0, 4.0], &[4]);
        let s = window_reduce(WindowOp::WindowSum, &x, &spec(&[2], &[1], &[(0, 0)], &[1]), NxType::F(32)).unwrap();
        assert_eq!((s.shape.clone(), floats(&s)), (vec![3], vec![3.0, 5.0, 7.0]));
        // padding (1, 1), stride 2: windows [pad 1] [2 3] [4 pad]
        let m = window_reduce(WindowOp::WindowMax, &x, &spec(&[2], &[2], &[(1, 1)], &[1]), NxType::F(32)).unwrap();
        assert_eq!(floats(&m), vec![1.0, 3.0, 4.0]);
        // dilation 2: windows {1,3} {2,4}
        let p = window_reduce(WindowOp::WindowProduct, &x, &spec(&[2], &[1], &[(0, 0)], &[2]), NxType::F(32)).unwrap();
        assert_eq!(floats(&p), vec![3.0, 8.0]);
    }

    #[test]
    fn window_min_over_two_axes_with_padding_and_ints() {
        // [[5 1 4]
        //  [2 8 0]]
        let x = i64s(&[5, 1, 4, 2, 8, 0], &[2, 3]);
        let m = window_reduce(WindowOp::WindowMin, &x, &spec(&[2, 2], &[1, 1], &[(0, 0), (0, 1)], &[1, 1]), NxType::S(64)).unwrap();
        assert_eq!((m.shape.clone(), ints(&m)), (vec![1, 3], vec![1, 0, 0]));
        let s = window_reduce(WindowOp::WindowSum, &x, &spec(&[1, 3], &[1, 1], &[(1, 0), (0, 0)], &[1, 1]), NxType::S(64)).unwrap();
        assert_eq!((s.shape.clone(), ints(&s)), (vec![3, 1], vec![0, 10, 10]));
        let u = crate::ops::elementwise::as_type(&x, NxType::U(8)).unwrap();
        let mx = window_reduce(WindowOp::WindowMax, &u, &spec(&[2, 2], &[1, 1], &[(1, 0), (0, 0)], &[1, 1]), NxType::U(8)).unwrap();
        assert_eq!(ints(&mx), vec![5, 4, 8, 8]);
    }

    /// The padding of unsigned windows holds the type's bounds, u64's largest among them (a
    /// fill that the CPU and GPU backends read differently).
    #[test]
    fn unsigned_windows_pad_with_the_type_bounds() {
        let pad = spec(&[2], &[1], &[(1, 1)], &[1]);
        let x = as_type(&i64s(&[5, 1], &[2]), NxType::U(64)).unwrap();
        let m = window_reduce(WindowOp::WindowMin, &x, &pad, NxType::U(64)).unwrap();
        assert_eq!(ints(&m), vec![5, 1, 1]);
        let x = as_type(&i64s(&[5, 200], &[2]), NxType::U(8)).unwrap();
        assert_eq!(ints(&window_reduce(WindowOp::WindowMax, &x, &pad, NxType::U(8)).unwrap()), vec![5, 200, 200]);
        assert_eq!(ints(&window_reduce(WindowOp::WindowMin, &x, &pad, NxType::U(8)).unwrap()), vec![5, 5, 200]);
        assert_eq!(ints(&window_reduce(WindowOp::WindowProduct, &x, &pad, NxType::U(8)).unwrap()), vec![5, 232, 200]);
    }

    #[test]
    fn window_max_propagates_nan() {
        let x = f32s(&[1.0, f32::NAN, 3.0, 2.0], &[4]);
        let m = window_reduce(WindowOp::WindowMax, &x, &spec(&[2], &[2], &[(0, 0)], &[1]), NxType::F(32)).unwrap();
        let v = floats(&m);
        assert!(v[0].is_nan() && v[1] == 3.0);
    }

    #[test]
    fn padding_interior_and_negative() {
        let x = i64s(&[1, 2, 3], &[3]);
        let v = i64s(&[9], &[]);
        assert_eq!(ints(&pad(&x, &v, &[(0, 0, 2)], x.ty).unwrap()), vec![1, 9, 9, 2, 9, 9, 3]);
        // negative edges cut into the interior-padded [1, 9, 2, 9, 3]; both operands become f32
        let f = pad(&x, &v, &[(-2, 1, 1)], NxType::F(32)).unwrap();
        assert_eq!((f.ty, f.shape.clone(), floats(&f)), (NxType::F(32), vec![4], vec![2.0, 9.0, 3.0, 9.0]));
        assert!(pad(&x, &v, &[(-6, 0, 1)], x.ty).is_err());
        assert!(pad(&x, &v, &[(0, 0, 0), (0, 0, 0)], x.ty).is_err());
        let dev = x.device.burn().unwrap();
        let (p, shape) = pad_constant(x.prim.clone(), &[3], &[(2, -1)], &Fill::Value(Scalar::Int(0)), &dev).unwrap();
        assert_eq!(shape, vec![4]);
        assert_eq!(ints(&Handle::new(p, NxType::S(64), shape, x.device)), vec![0, 0, 1, 2]);
        assert!(pad_constant(x.prim.clone(), &[3], &[(-2, -2)], &Fill::Value(Scalar::Int(0)), &dev).is_err());
    }

    #[test]
    fn window_scatter_max_picks_the_last_maximum() {
        // windows of 2 with stride 2 over [1 3 3 0]: maxima at 2 (the later 3) and 2 is not in
        // the second window: [3 0] -> index 2. Source [10 20], init 1.
        let x = f32s(&[1.0, 3.0, 3.0, 0.0], &[4]);
        let src = f32s(&[10.0, 20.0], &[2]);
        let init = f32s(&[1.0], &[]);
        let r = window_scatter(true, &x, &src, &init, vec![2], vec![2], vec![(0, 0)], NxType::F(32), NxType::F(32)).unwrap();
        assert_eq!(floats(&r), vec![1.0, 11.0, 21.0, 1.0]);
        // Overlapping windows of 3 (stride 1) for min over [4 1 5 2]: mins at 1, 1 -> 1 gets both.
        let y = f32s(&[4.0, 1.0, 5.0, 2.0], &[4]);
        let r = window_scatter(false, &y, &src, &init, vec![3], vec![1], vec![(0, 0)], NxType::F(32), NxType::F(32)).unwrap();
        assert_eq!(floats(&r), vec![1.0, 31.0, 1.0, 1.0]);
    }

    #[test]
    fn window_scatter_drops_selections_in_the_padding() {
        // Padded with init 0: [0 -1 -2 0]; windows of 2, stride 2: maxima are the pads.
        let x = f32s(&[-1.0, -2.0], &[2]);
        let src = f32s(&[5.0, 7.0], &[2]);
        let init = f32s(&[0.0], &[]);
        let r = window_scatter(true, &x, &src, &init, vec![2], vec![2], vec![(1, 1)], NxType::F(32), NxType::F(32)).unwrap();
        assert_eq!(floats(&r), vec![0.0, 0.0]);
    }
}
