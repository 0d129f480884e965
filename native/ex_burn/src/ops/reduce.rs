//! Reductions over axes, with Nx's `keep_axes`, and argmax/argmin with tie breaking.

use burn::backend::ops::{BoolTensorOps, FloatTensorOps, IntTensorOps};
use burn::backend::{DType, Dispatch, IntDType, Scalar};

use crate::dispatch::{self, by_kind, Prim, BOOL};
use crate::dtype::{NxType, PRED};
use crate::error::{ExError, ExResult};
use crate::ops::{cast_to, check_axes, empty};
use crate::ops::vocab::{ArgReduceOp, ReduceOp};
use crate::tensor::{numel, Handle};

fn out_shape(shape: &[usize], axes: &[usize], keep: bool) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .filter_map(|(i, d)| match (axes.contains(&i), keep) {
            (false, _) => Some(*d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

/// The value a reduction of nothing yields (Nx: sum 0, product 1, max -inf / type minimum, ...).
fn identity(op: ReduceOp, ty: NxType) -> Scalar {
    let (lo, hi) = ty.bounds();
    match op {
        ReduceOp::Sum | ReduceOp::Any => ty.scalar(0),
        ReduceOp::Product | ReduceOp::All => ty.scalar(1),
        ReduceOp::Mean => Scalar::Float(f64::NAN),
        ReduceOp::ReduceMax => lo,
        ReduceOp::ReduceMin => hi,
    }
}

fn fold_axes(t: Prim, axes: &[usize], f: impl Fn(Prim, usize) -> Prim) -> Prim {
    axes.iter().fold(t, |acc, &a| f(acc, a))
}

fn reduce_prim(op: ReduceOp, t: Prim, axes: &[usize]) -> Prim {
    match op {
        ReduceOp::Sum => fold_axes(t, axes, |x, a| by_kind!(x, float_sum_dim, int_sum_dim, a)),
        ReduceOp::Product => fold_axes(t, axes, |x, a| by_kind!(x, float_prod_dim, int_prod_dim, a)),
        ReduceOp::Mean => fold_axes(t, axes, Dispatch::float_mean_dim),
        ReduceOp::ReduceMax => fold_axes(t, axes, |x, a| by_kind!(x, float_max_dim, int_max_dim, a)),
        ReduceOp::ReduceMin => fold_axes(t, axes, |x, a| by_kind!(x, float_min_dim, int_min_dim, a)),
        ReduceOp::All => dispatch::pred(fold_axes(dispatch::to_bool(t), axes, Dispatch::bool_all_dim)),
        ReduceOp::Any => dispatch::pred(fold_axes(dispatch::to_bool(t), axes, Dispatch::bool_any_dim)),
    }
}

pub fn reduce(op: ReduceOp, h: &Handle, axes: Option<Vec<usize>>, keep: bool, out: NxType) -> ExResult<Handle> {
    let axes = axes.unwrap_or_else(|| (0..h.rank()).collect());
    check_axes(&axes, h.rank())?;
    let is_pred = matches!(op, ReduceOp::All | ReduceOp::Any);
    let out = if is_pred { PRED } else { out };
    h.device.check_type(out)?;
    let shape = out_shape(&h.shape, &axes, keep);
    if numel(&shape) == 0 {
        return empty(shape, out, h.device);
    }
    if h.numel() == 0 {
        let prim = dispatch::full(&shape, identity(op, out), out.dtype(), &h.device.burn()?);
        return Ok(Handle::new(prim, out, shape, h.device));
    }
    if op == ReduceOp::Mean && !out.is_float() {
        return Err(ExError::invalid(format!("mean needs a floating output type, got {out}")));
    }
    // f32/f64 sums on the CPU: one pass over the storage, accumulating in f64 (kernels::cpu::vector).
    if matches!(op, ReduceOp::Sum | ReduceOp::Mean) && matches!(out, NxType::F(32) | NxType::F(64)) && h.device.kind == crate::device::DeviceKind::Cpu {
        let x = cast_to(h, out);
        if let Some(prim) = crate::kernels::cpu::vector::sum(&x, &h.shape, &axes, op == ReduceOp::Mean) {
            return Ok(Handle::new(dispatch::reshape(prim, &shape), out, shape, h.device));
        }
    }
    // f32/f64 maxima on the CPU (softmax's first step): one parallel pass, NaN as Nx ranks it.
    if op == ReduceOp::ReduceMax && matches!(out, NxType::F(32) | NxType::F(64)) && h.device.kind == crate::device::DeviceKind::Cpu {
        let x = cast_to(h, out);
        if let Some(prim) = crate::kernels::cpu::vector::reduce_max(&x, &h.shape, &axes) {
            return Ok(Handle::new(dispatch::reshape(prim, &shape), out, shape, h.device));
        }
    }
    // Narrow floats accumulate in f64 (as Nx.BinaryBackend does): f32 running sums drift by
    // several ulps on long axes. Max/min are exact in any width.
    let widen = matches!(op, ReduceOp::Sum | ReduceOp::Product | ReduceOp::Mean)
        && matches!(out, NxType::F(16) | NxType::F(32) | NxType::BF16)
        && h.device.check_type(NxType::F(64)).is_ok();
    let x = if is_pred {
        h.prim.clone()
    } else if widen {
        dispatch::cast(cast_to(h, out), DType::F64)
    } else {
        cast_to(h, out)
    };
    let reduced = match widen.then(|| sum_by_matmul(op, &x, &h.shape, &axes, h.device)).flatten() {
        Some(r) => r?,
        None => reduce_prim(op, x, &axes),
    };
    let prim = dispatch::reshape(dispatch::cast(reduced, out.dtype()), &shape);
    Ok(Handle::new(prim, out, shape, h.device))
}

/// Softmax over the last axis, as the composition the compiler fuses (`compiler::fuse`):
/// `e = exp(x - reduce_max(x))`, then `e / sum(e)` or, with `recip`, `e * (1 / sum(e))`, every
/// step in `ty`. One pass on the CPU for f32 (`kernels::cpu::vector::softmax_last`, the same bits;
/// in fast math mode `kernels::cpu::fast_math::softmax_last`, within a few ulp);
/// elsewhere the same core ops one after another.
pub fn softmax_last(h: &Handle, recip: bool, ty: NxType) -> ExResult<Handle> {
    use super::elementwise::{binary, unary};
    use super::vocab::{BinaryOp, UnaryOp};
    use crate::kernels::cpu::{fast_math, vector};
    let last = h.rank().checked_sub(1).ok_or_else(|| ExError::invalid("softmax of a scalar"))?;
    if ty == NxType::F(32) && h.ty == ty && h.device.kind == crate::device::DeviceKind::Cpu {
        let fused = if super::precision::MathMode::fast() { fast_math::softmax_last(&h.prim) } else { vector::softmax_last(&h.prim, recip) };
        if let Some(prim) = fused {
            return Ok(Handle::new(prim, ty, h.shape.clone(), h.device));
        }
    }
    let m = reduce(ReduceOp::ReduceMax, h, Some(vec![last]), true, ty)?;
    let e = unary(UnaryOp::Exp, &binary(BinaryOp::Subtract, h, &m, ty)?, ty)?;
    let s = reduce(ReduceOp::Sum, &e, Some(vec![last]), true, ty)?;
    if recip {
        let one = Handle::new(dispatch::full(&[1], Scalar::Float(1.0), ty.dtype(), &h.device.burn()?), ty, vec![1], h.device);
        binary(BinaryOp::Multiply, &binary(BinaryOp::Divide, &one, &s, ty)?, &e, ty)
    } else {
        binary(BinaryOp::Divide, &e, &s, ty)
    }
}

/// Layer norm over the last axis, as the composition the compiler fuses (`compiler::fuse`):
/// `c = x - sum(x) / mean_den`, `r = rsqrt(sum(c * c) / var_den + eps)`, then `c * r` or, with
/// `affine` (gamma, beta), `(gamma * r) * c + beta`, every step in f32. One pass on the CPU
/// (`kernels::cpu::layer_norm::layer_norm_last`, the same bits, in either math mode: nothing in it is a
/// transcendental); elsewhere the same core ops one after another.
pub fn layer_norm_last(h: &Handle, affine: Option<(&Handle, &Handle)>, eps: f32, (mean_den, var_den): (f32, f32), ty: NxType) -> ExResult<Handle> {
    use super::elementwise::{binary, unary};
    use super::vocab::{BinaryOp, UnaryOp};
    let last = h.rank().checked_sub(1).ok_or_else(|| ExError::invalid("layer norm of a scalar"))?;
    if ty != NxType::F(32) || h.ty != ty {
        return Err(ExError::invalid(format!("layer norm is fused for f32 only, got {}", h.ty)));
    }
    if h.device.kind == crate::device::DeviceKind::Cpu {
        let columns = match affine {
            None => Some(None),
            Some((g, b)) => crate::kernels::cpu::vector::flex_f32(&g.prim).zip(crate::kernels::cpu::vector::flex_f32(&b.prim)).map(Some),
        };
        if let Some(prim) = columns.and_then(|gb| crate::kernels::cpu::layer_norm::layer_norm_last(&h.prim, gb, eps, mean_den, var_den)) {
            return Ok(Handle::new(prim, ty, h.shape.clone(), h.device));
        }
    }
    let constant = |v: f32| -> ExResult<Handle> { Ok(Handle::new(dispatch::full(&[], Scalar::Float(v as f64), ty.dtype(), &h.device.burn()?), ty, vec![], h.device)) };
    let mean_of = |t: &Handle, den: f32| binary(BinaryOp::Divide, &reduce(ReduceOp::Sum, t, Some(vec![last]), true, ty)?, &constant(den)?, ty);
    let c = binary(BinaryOp::Subtract, h, &mean_of(h, mean_den)?, ty)?;
    let var = mean_of(&binary(BinaryOp::Multiply, &c, &c, ty)?, var_den)?;
    let r = unary(UnaryOp::Rsqrt, &binary(BinaryOp::Add, &var, &constant(eps)?, ty)?, ty)?;
    match affine {
        None => binary(BinaryOp::Multiply, &c, &r, ty),
        Some((g, b)) => binary(BinaryOp::Add, &binary(BinaryOp::Multiply, &binary(BinaryOp::Multiply, g, &r, ty)?, &c, ty)?, b, ty),
    }
}

/// An f64 sum or mean over a leading or trailing block of axes as a product with a ones vector,
/// on the CPU: the gemm kernel accumulates in f64 like `sum_dim` but is much faster there
/// (a bias gradient is exactly this column sum; guides/backend.md). `None` where the
/// axes are not such a block or the device is a GPU, whose own reductions are already fused.
fn sum_by_matmul(op: ReduceOp, x: &Prim, shape: &[usize], axes: &[usize], device: crate::device::DeviceRef) -> Option<ExResult<Prim>> {
    if !matches!(op, ReduceOp::Sum | ReduceOp::Mean) || device.kind != crate::device::DeviceKind::Cpu || shape.is_empty() {
        return None;
    }
    let mut sorted = axes.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let k = sorted.len();
    let rank = shape.len();
    let leading = sorted.iter().enumerate().all(|(i, &a)| a == i);
    let trailing = sorted.iter().enumerate().all(|(i, &a)| a == rank - k + i);
    if k == 0 || !(leading || trailing) {
        return None;
    }
    let reduced: usize = sorted.iter().map(|&a| shape[a]).product();
    let kept = numel(shape) / reduced.max(1);
    Some((|| {
        let dev = device.burn()?;
        let ones = |s: &[usize]| dispatch::full(s, Scalar::Float(1.0), DType::F64, &dev);
        let summed = if leading {
            Dispatch::float_matmul(ones(&[1, reduced]), dispatch::reshape(x.clone(), &[reduced, kept]))
        } else {
            Dispatch::float_matmul(dispatch::reshape(x.clone(), &[kept, reduced]), ones(&[reduced, 1]))
        };
        let summed = if op == ReduceOp::Mean {
            Dispatch::float_div_scalar(summed, Scalar::Float(reduced as f64))
        } else {
            summed
        };
        // x86's inf + -inf is a negative NaN; Nx (and sum_dim) give the positive one. The
        // result has only the kept elements, so this pass is cheap.
        let nan = Dispatch::float_is_nan(summed.clone(), BOOL);
        let summed = Dispatch::float_mask_fill(summed, nan, Scalar::Float(f64::NAN));
        Ok(dispatch::reshape(summed, &[kept]))
    })())
}

/// Order-preserving widening of an int primitive to 64 bits.
fn widen(x: Prim) -> Prim {
    let to = if dispatch::dtype(&x).is_uint() { DType::U64 } else { DType::I64 };
    dispatch::cast(x, to)
}

/// argmax/argmin along `axis` (the flattened tensor when `None`); `high` picks the last of tied
/// extremes instead of the first. Nx ranks NaN above every number for both ops, and
/// Nx.BinaryBackend takes each NaN it meets, so a slice holding NaN yields its last NaN's index
/// whatever the tie break; Burn's comparisons are false on NaN, so those slices are patched.
pub fn arg_reduce(op: ArgReduceOp, h: &Handle, axis: Option<usize>, keep: bool, high: bool, out: NxType) -> ExResult<Handle> {
    let plain = arg_extreme(op, h, axis, keep, high, out)?;
    if !h.ty.is_float() {
        return Ok(plain);
    }
    // On the CPU one pass over the values saves the patch where there is no NaN; on a GPU a
    // read would wait for the queue, so the patch always runs there.
    if crate::kernels::cpu::vector::has_nan(&h.prim) == Some(false) {
        return Ok(plain);
    }
    let nan = super::elementwise::unary(crate::ops::vocab::UnaryOp::IsNan, h, PRED)?;
    let last_nan = arg_extreme(ArgReduceOp::Argmax, &nan, axis, keep, true, out)?;
    let has_nan = reduce(ReduceOp::Any, &nan, axis.map(|a| vec![a]), keep, PRED)?;
    super::elementwise::select(&has_nan, &last_nan, &plain, out)
}

fn arg_extreme(op: ArgReduceOp, h: &Handle, axis: Option<usize>, keep: bool, high: bool, out: NxType) -> ExResult<Handle> {
    if out.is_float() {
        return Err(ExError::invalid(format!("{op} needs an integer output type, got {out}")));
    }
    h.device.check_type(out)?;
    let (x, axis, shape) = match axis {
        Some(a) => {
            check_axes(&[a], h.rank())?;
            (h.prim.clone(), a, out_shape(&h.shape, &[a], keep))
        }
        None => {
            let all: Vec<usize> = (0..h.rank()).collect();
            (dispatch::reshape(h.prim.clone(), &[h.numel()]), 0, out_shape(&h.shape, &all, keep))
        }
    };
    let len = dispatch::dims(&x)[axis];
    if h.numel() == 0 || len == 0 {
        return Err(ExError::invalid(format!("cannot compute {op} of an empty axis")));
    }
    // Burn returns the first extreme index; the last one is the first of the reversed axis.
    let x = if high { dispatch::flip(x, &[axis]) } else { x };
    let idx = match op {
        ArgReduceOp::Argmax if dispatch::is_float(&x) => Dispatch::float_argmax(x, axis, IntDType::I64),
        ArgReduceOp::Argmin if dispatch::is_float(&x) => Dispatch::float_argmin(x, axis, IntDType::I64),
        // Int argmax returns indices in the input's dtype: widen first so they cannot wrap.
        ArgReduceOp::Argmax => Dispatch::int_argmax(widen(x), axis),
        ArgReduceOp::Argmin => Dispatch::int_argmin(widen(x), axis),
    };
    let idx = dispatch::cast(idx, DType::I64);
    let idx = if high {
        Dispatch::int_add_scalar(Dispatch::int_neg(idx), Scalar::Int(len as i64 - 1))
    } else {
        idx
    };
    let prim = dispatch::reshape(dispatch::cast(idx, out.dtype()), &shape);
    Ok(Handle::new(prim, out, shape, h.device))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;

    #[test]
    fn f32_sum_accumulates_in_f64() {
        let n = 100_000;
        let x = f32s(&vec![0.1; n], &[n]);
        let got = floats(&reduce(ReduceOp::Sum, &x, None, false, NxType::F(32)).unwrap())[0];
        let want = (0.1f32 as f64 * n as f64) as f32 as f64;
        assert_eq!(got, want);
    }

    /// Every axis set against a direct f64 sum: leading and trailing blocks take the matmul
    /// path on the CPU, middle or split axes `sum_dim`; non-finite values propagate either way.
    #[test]
    fn sums_and_means_over_any_axes_match_an_f64_reference() {
        let shape = [3usize, 4, 5];
        let mut vals: Vec<f32> = (0..60).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.37).collect();
        let x = f32s(&vals, &shape);
        let sets: [&[usize]; 7] = [&[0], &[2], &[0, 1], &[1, 2], &[0, 1, 2], &[1], &[0, 2]];
        for axes in sets {
            for op in [ReduceOp::Sum, ReduceOp::Mean] {
                let got = floats(&reduce(op, &x, Some(axes.to_vec()), false, NxType::F(32)).unwrap());
                let kept: Vec<usize> = (0..3).filter(|a| !axes.contains(a)).collect();
                let mut want = std::collections::BTreeMap::<Vec<usize>, (f64, usize)>::new();
                for (i, v) in vals.iter().enumerate() {
                    let idx = [i / 20, i / 5 % 4, i % 5];
                    let e = want.entry(kept.iter().map(|&a| idx[a]).collect()).or_insert((0.0, 0));
                    e.0 += *v as f64;
                    e.1 += 1;
                }
                let want: Vec<f64> = want.values().map(|&(s, n)| (if op == ReduceOp::Sum { s as f32 } else { (s / n as f64) as f32 }) as f64).collect();
                assert_eq!(got, want, "{op} over {axes:?}");
            }
        }
        vals[7] = f32::INFINITY;
        vals[8] = f32::NAN;
        let x = f32s(&vals, &shape);
        let got = floats(&reduce(ReduceOp::Sum, &x, Some(vec![1, 2]), false, NxType::F(32)).unwrap());
        assert!(got[0].is_nan() && got[1].is_finite() && got[2].is_finite(), "{got:?}");
        // inf + -inf: NaN. On the CPU our kernel writes the positive quiet NaN, as Nx's
        // BinaryBackend does; GPU kernels write the NaN their hardware makes (CUDA: negative).
        // Nx gives NaN's sign and payload no meaning, so only the CPU's bytes are pinned.
        let x = f32s(&[f32::INFINITY, f32::NEG_INFINITY], &[2]);
        let bytes = reduce(ReduceOp::Sum, &x, None, false, NxType::F(32)).unwrap().to_bytes().unwrap();
        assert!(f32::from_ne_bytes(bytes[..4].try_into().unwrap()).is_nan());
        if x.device.kind == crate::device::DeviceKind::Cpu {
            assert_eq!(bytes, f32::NAN.to_ne_bytes().to_vec());
        }
    }

    #[test]
    fn out_shape_drops_or_keeps_reduced_axes() {
        assert_eq!(out_shape(&[2, 3, 4], &[1], false), vec![2, 4]);
        assert_eq!(out_shape(&[2, 3, 4], &[0, 2], true), vec![1, 3, 1]);
        assert_eq!(out_shape(&[2, 3], &[0, 1], false), Vec::<usize>::new());
    }

    #[test]
    fn sums_over_axes_with_and_without_keep() {
        let x = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
        let s = reduce(ReduceOp::Sum, &x, Some(vec![1]), false, NxType::F(32)).unwrap();
        assert_eq!((s.shape.clone(), floats(&s)), (vec![2], vec![6.0, 15.0]));
        let s = reduce(ReduceOp::Sum, &x, None, true, NxType::F(32)).unwrap();
        assert_eq!((s.shape.clone(), floats(&s)), (vec![1, 1], vec![21.0]));
        let m = reduce(ReduceOp::ReduceMax, &x, Some(vec![0]), false, NxType::F(32)).unwrap();
        assert_eq!(floats(&m), vec![4.0, 5.0, 6.0]);
        let p = reduce(ReduceOp::Product, &i64s(&[1, 2, 3, 4], &[4]), None, false, NxType::S(64)).unwrap();
        assert_eq!((p.shape.clone(), ints(&p)), (vec![], vec![24]));
        let a = reduce(ReduceOp::All, &x, Some(vec![1]), false, NxType::F(32)).unwrap();
        assert_eq!((a.ty, a.to_bytes().unwrap()), (PRED, vec![1, 1]));
    }

    #[test]
    fn reductions_of_nothing_give_the_identity() {
        let e = crate::tensor::Handle::from_bytes(vec![], vec![0, 2], NxType::F(32), crate::testing::device()).unwrap();
        assert_eq!(floats(&reduce(ReduceOp::Sum, &e, Some(vec![0]), false, NxType::F(32)).unwrap()), vec![0.0, 0.0]);
        assert_eq!(floats(&reduce(ReduceOp::Product, &e, None, false, NxType::F(32)).unwrap()), vec![1.0]);
        // u64's largest value, which no integer fill is read as on every backend alike
        let e = crate::tensor::Handle::from_bytes(vec![], vec![0, 2], NxType::U(64), crate::testing::device()).unwrap();
        let min = reduce(ReduceOp::ReduceMin, &e, Some(vec![0]), false, NxType::U(64)).unwrap().to_bytes().unwrap();
        assert_eq!(min.chunks(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).collect::<Vec<_>>(), vec![u64::MAX; 2]);
    }

    #[test]
    fn argmax_breaks_ties_low_or_high() {
        let x = f32s(&[3.0, 1.0, 3.0, 0.0, 2.0, 2.0], &[2, 3]);
        let lo = arg_reduce(ArgReduceOp::Argmax, &x, Some(1), false, false, NxType::S(64)).unwrap();
        assert_eq!(ints(&lo), vec![0, 1]);
        let hi = arg_reduce(ArgReduceOp::Argmax, &x, Some(1), false, true, NxType::S(64)).unwrap();
        assert_eq!(ints(&hi), vec![2, 2]);
        let flat = arg_reduce(ArgReduceOp::Argmin, &x, None, false, false, NxType::S(32)).unwrap();
        assert_eq!((flat.shape.clone(), ints(&flat)), (vec![], vec![3]));
        let big = crate::ops::create::iota(vec![300], NxType::U(8), None, crate::testing::device()).unwrap();
        // u8 iota wraps at 256, so the maximum (255) sits at index 255, an index u8 could hold,
        // while the int path widens before Burn computes indices in the input's dtype.
        assert_eq!(ints(&arg_reduce(ArgReduceOp::Argmax, &big, None, false, false, NxType::S(64)).unwrap()), vec![255]);
    }

    /// Nx ranks NaN above every number for argmax and argmin alike, and a slice holding NaN
    /// gives its last NaN's index whatever the tie break (Nx.BinaryBackend's answers).
    #[test]
    fn nan_wins_both_arg_reductions_at_its_last_index() {
        let x = f32s(&[1.0, f32::NAN, 5.0, f32::NAN, 2.0, 9.0, 1.0, 0.0], &[2, 4]);
        for (op, high, want) in [
            (ArgReduceOp::Argmax, false, vec![3, 1]),
            (ArgReduceOp::Argmax, true, vec![3, 1]),
            (ArgReduceOp::Argmin, false, vec![3, 3]),
            (ArgReduceOp::Argmin, true, vec![3, 3]),
        ] {
            let r = arg_reduce(op, &x, Some(1), false, high, NxType::S(32)).unwrap();
            assert_eq!((r.ty, r.shape.clone(), ints(&r)), (NxType::S(32), vec![2], want), "{op} high={high}");
        }
        let kept = arg_reduce(ArgReduceOp::Argmin, &x, Some(1), true, false, NxType::S(64)).unwrap();
        assert_eq!((kept.shape.clone(), ints(&kept)), (vec![2, 1], vec![3, 3]));
        let flat = arg_reduce(ArgReduceOp::Argmax, &x, None, false, false, NxType::S(64)).unwrap();
        assert_eq!(ints(&flat), vec![3]);
        let clean = f32s(&[1.0, 7.0, 7.0], &[3]);
        assert_eq!(ints(&arg_reduce(ArgReduceOp::Argmax, &clean, None, false, true, NxType::S(64)).unwrap()), vec![2]);
    }
}
