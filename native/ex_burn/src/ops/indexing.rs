//! Reordering and indexing ops for the Nx backend: reverse, stable sort/argsort, cumulative
//! ops, put_slice, take, take_along_axis and indexed add/put along one axis.

use burn::backend::ops::{BoolTensorOps, FloatTensorOps, IntTensorOps};
use burn::backend::{DType, Dispatch, IntDType, Scalar, Slice};
use burn::tensor::IndexingUpdateOp;

use crate::dispatch::{self, by_kind, Prim, BOOL};
use crate::dtype::NxType;
use crate::error::{Detail, ExError, ExResult};
use crate::ops::{cast_to, check_alloc, check_axes, dims_detail, empty, colocate};
use crate::ops::elementwise;
use crate::ops::vocab::{CumulativeOp, IndexedOp};
use crate::tensor::{numel, Handle};

fn axis_error(axis: usize, shape: &[usize]) -> ExError {
    ExError::invalid_with("axis out of range", vec![("axis", Detail::Int(axis as i128)), dims_detail("shape", shape)])
}

fn check_axis(axis: usize, h: &Handle) -> ExResult<()> {
    if axis >= h.rank() {
        return Err(axis_error(axis, &h.shape));
    }
    Ok(())
}

/// Nx.reverse over `axes`.
/// Nx.reverse, the result in `ty`.
pub fn reverse(h: &Handle, axes: Vec<usize>, ty: NxType) -> ExResult<Handle> {
    check_axes(&axes, h.rank())?;
    let h = &elementwise::as_type(h, ty)?;
    if h.numel() == 0 || axes.is_empty() {
        return Ok(h.clone());
    }
    Ok(h.with(dispatch::flip(h.prim.clone(), &axes), h.shape.clone()))
}

fn slice_along(rank: usize, dim: usize, shape: &[usize], start: usize, end: usize) -> Vec<Slice> {
    (0..rank)
        .map(|i| if i == dim { Slice::new(start as isize, Some(end as isize), 1) } else { Slice::new(0, Some(shape[i] as isize), 1) })
        .collect()
}

/// Indices that sort `x` along `dim`, ties kept in their original order. Burn's sorts are
/// unstable, so the unstable order is fixed up: equal neighbours in the sorted values form
/// groups (a cumulative sum of "differs from the previous"), and `group * n + index` is a key
/// without ties whose sort is the stable order.
fn stable_argsort(x: Prim, shape: &[usize], dim: usize, descending: bool) -> Prim {
    let n = shape[dim];
    let idx = if dispatch::is_float(&x) {
        Dispatch::float_argsort(x.clone(), dim, descending, IntDType::I64)
    } else {
        Dispatch::int_argsort(dispatch::cast(x.clone(), DType::I64), dim, descending)
    };
    let idx = dispatch::cast(idx, DType::I64);
    if n < 2 {
        return idx;
    }
    let rank = shape.len();
    let sorted = gather(dim, x, idx.clone());
    let sorted = if dispatch::is_float(&sorted) { sorted } else { dispatch::cast(sorted, DType::I64) };
    let tail = dispatch::slice(sorted.clone(), &slice_along(rank, dim, shape, 1, n));
    let head = dispatch::slice(sorted, &slice_along(rank, dim, shape, 0, n - 1));
    let differs = crate::dispatch::pred(if dispatch::is_float(&tail) {
        Dispatch::float_not_equal(tail, head, BOOL)
    } else {
        Dispatch::int_not_equal(tail, head, BOOL)
    });
    let first = dispatch::slice(idx.clone(), &slice_along(rank, dim, shape, 0, 1));
    let ones = Dispatch::int_add_scalar(Dispatch::int_mul_scalar(first, Scalar::Int(0)), Scalar::Int(1));
    let starts = Dispatch::int_cat(vec![ones, dispatch::cast(differs, DType::I64)], dim);
    let group = Dispatch::int_cumsum(starts, dim);
    let key = Dispatch::int_add(Dispatch::int_mul_scalar(group, Scalar::Int(n as i64)), idx.clone());
    let order = Dispatch::int_argsort(key, dim, false);
    Dispatch::int_gather(dim, idx, dispatch::cast(order, DType::I64))
}

/// Nx.argsort along `axis`, stable, indices of type `out`.
pub fn argsort(h: &Handle, axis: usize, descending: bool, out: NxType) -> ExResult<Handle> {
    check_axis(axis, h)?;
    if out.is_float() {
        return Err(ExError::invalid(format!("argsort needs an integer output type, got {out}")));
    }
    h.device.check_type(out)?;
    if h.numel() == 0 {
        return empty(h.shape.clone(), out, h.device);
    }
    let idx = match crate::kernels::cpu::sort::sort_f32(&h.prim, axis, descending) {
        Some((_, idx)) => idx,
        None => stable_argsort(h.prim.clone(), &h.shape, axis, descending),
    };
    Ok(Handle::new(dispatch::cast(idx, out.dtype()), out, h.shape.clone(), h.device))
}

/// Nx.sort along `axis` (values in stable-argsort order), the result in `ty`.
pub fn sort(h: &Handle, axis: usize, descending: bool, ty: NxType) -> ExResult<Handle> {
    check_axis(axis, h)?;
    let h = &elementwise::as_type(h, ty)?;
    if h.numel() == 0 {
        return Ok(h.clone());
    }
    if let Some((values, _)) = crate::kernels::cpu::sort::sort_f32(&h.prim, axis, descending) {
        return Ok(h.with(values, h.shape.clone()));
    }
    let idx = stable_argsort(h.prim.clone(), &h.shape, axis, descending);
    let prim = gather(axis, h.prim.clone(), idx);
    Ok(h.with(prim, h.shape.clone()))
}

/// Cumulative sum/product/min/max along `axis`, optionally from the end.
pub fn cumulative(op: CumulativeOp, h: &Handle, axis: usize, reverse: bool) -> ExResult<Handle> {
    check_axis(axis, h)?;
    if h.numel() == 0 {
        return Ok(h.clone());
    }
    let x = if reverse { dispatch::flip(h.prim.clone(), &[axis]) } else { h.prim.clone() };
    let y = match op {
        CumulativeOp::CumulativeSum => by_kind!(x, float_cumsum, int_cumsum, axis),
        CumulativeOp::CumulativeProduct => by_kind!(x, float_cumprod, int_cumprod, axis),
        CumulativeOp::CumulativeMin => by_kind!(x, float_cummin, int_cummin, axis),
        CumulativeOp::CumulativeMax => by_kind!(x, float_cummax, int_cummax, axis),
    };
    let y = if reverse { dispatch::flip(y, &[axis]) } else { y };
    Ok(h.with(dispatch::cast(y, h.ty.dtype()), h.shape.clone()))
}

/// Nx.put_slice with in-bounds starts: `update` (cast to the tensor's type) overwrites the
/// window at `starts`.
pub fn put_slice(h: &Handle, starts: Vec<usize>, update: &Handle) -> ExResult<Handle> {
    let (_, [h, update]) = colocate([h, update])?;
    let (h, update) = (h.as_ref(), update.as_ref());
    let r = h.rank();
    let fits = starts.len() == r
        && update.rank() == r
        && (0..r).all(|i| starts[i].checked_add(update.shape[i]).is_some_and(|e| e <= h.shape[i]));
    if !fits {
        return Err(ExError::invalid_with(
            "put_slice window is out of bounds",
            vec![dims_detail("shape", &h.shape), dims_detail("starts", &starts), dims_detail("update", &update.shape)],
        ));
    }
    if update.numel() == 0 || r == 0 {
        return Ok(if r == 0 { h.with(cast_to(update, h.ty), h.shape.clone()) } else { h.clone() });
    }
    let slices: Vec<Slice> = (0..r)
        .map(|i| Slice::new(starts[i] as isize, Some((starts[i] + update.shape[i]) as isize), 1))
        .collect();
    let value = cast_to(update, h.ty);
    let prim = by_kind!(h.prim.clone(), float_slice_assign, int_slice_assign, &slices, value);
    Ok(h.with(prim, h.shape.clone()))
}

/// Index tensor as i64, every entry checked against `bound` (Nx raises on out-of-range take
/// indices; Burn would read out of bounds or clamp depending on the device).
fn checked_indices(idx: &Handle, bound: usize) -> ExResult<Prim> {
    if idx.ty.is_float() {
        return Err(ExError::invalid(format!("indices must be integers, got {}", idx.ty)));
    }
    let p = cast_to(idx, NxType::S(64));
    let in_bounds = match crate::kernels::cpu::vector::indices_in_bounds(&p, bound) {
        Some(ok) => ok,
        None => {
            let low = Dispatch::int_lower_elem(p.clone(), Scalar::Int(0), BOOL);
            let high = Dispatch::int_greater_equal_elem(p.clone(), Scalar::Int(bound as i64), BOOL);
            let bad = dispatch::into_data(Dispatch::bool_any(Dispatch::bool_or(low, high)))?;
            bad.as_bytes().iter().all(|b| *b == 0)
        }
    };
    if !in_bounds {
        return Err(ExError::invalid_with("index out of bounds", vec![("bound", Detail::Int(bound as i128))]));
    }
    Ok(p)
}

/// Nx.take: `shape[..axis] ++ indices.shape ++ shape[axis+1..]`.
pub fn take(h: &Handle, idx: &Handle, axis: usize) -> ExResult<Handle> {
    let (device, [h, idx]) = colocate([h, idx])?;
    let (h, idx) = (h.as_ref(), idx.as_ref());
    check_axis(axis, h)?;
    let mut shape = h.shape[..axis].to_vec();
    shape.extend(&idx.shape);
    shape.extend(&h.shape[axis + 1..]);
    check_alloc(&shape, h.ty)?;
    if numel(&shape) == 0 {
        return empty(shape, h.ty, device);
    }
    let flat = dispatch::reshape(checked_indices(idx, h.shape[axis])?, &[idx.numel()]);
    let prim = match crate::kernels::cpu::gather::take(&h.prim, &flat, axis) {
        Some(p) => p,
        None => by_kind!(h.prim.clone(), float_select, int_select, axis, flat),
    };
    Ok(Handle::new(dispatch::reshape(prim, &shape), h.ty, shape, device))
}

/// Nx.take_along_axis: `indices` has the tensor's rank; the result has its shape.
pub fn take_along_axis(h: &Handle, idx: &Handle, axis: usize) -> ExResult<Handle> {
    let (device, [h, idx]) = colocate([h, idx])?;
    let (h, idx) = (h.as_ref(), idx.as_ref());
    check_axis(axis, h)?;
    let compatible = idx.rank() == h.rank() && (0..h.rank()).all(|i| i == axis || idx.shape[i] == h.shape[i]);
    if !compatible {
        return Err(ExError::invalid_with(
            "indices must match the tensor's shape except on the axis",
            vec![dims_detail("shape", &h.shape), dims_detail("indices", &idx.shape)],
        ));
    }
    if idx.numel() == 0 {
        return empty(idx.shape.clone(), h.ty, device);
    }
    let p = checked_indices(idx, h.shape[axis])?;
    let prim = gather(axis, h.prim.clone(), p);
    Ok(Handle::new(prim, h.ty, idx.shape.clone(), device))
}

fn gather(dim: usize, t: Prim, idx: Prim) -> Prim {
    if dispatch::is_float(&t) {
        Dispatch::float_gather(dim, t, idx)
    } else {
        Dispatch::int_gather(dim, t, idx)
    }
}

/// Adds (`add`) or writes (`put`) the rows of `updates` into `h` at positions `idx` (a vector)
/// along axis 0. The result has `out`'s type.
pub fn index_update(op: IndexedOp, h: &Handle, idx: &Handle, updates: &Handle, out: NxType) -> ExResult<Handle> {
    let (device, [h, idx, updates]) = colocate([h, idx, updates])?;
    let (h, idx, updates) = (h.as_ref(), idx.as_ref(), updates.as_ref());
    device.check_type(out)?;
    if h.rank() == 0 || idx.rank() != 1 || updates.rank() != h.rank() || updates.shape[0] != idx.shape[0] || updates.shape[1..] != h.shape[1..] {
        return Err(ExError::invalid_with(
            "indexed update shapes do not match",
            vec![dims_detail("shape", &h.shape), dims_detail("indices", &idx.shape), dims_detail("updates", &updates.shape)],
        ));
    }
    if h.numel() == 0 || idx.numel() == 0 {
        return Ok(Handle::new(cast_to(h, out), out, h.shape.clone(), device));
    }
    let p = checked_indices(idx, h.shape[0])?;
    let update = match op {
        IndexedOp::Add => IndexingUpdateOp::Add,
        IndexedOp::Put => IndexingUpdateOp::Assign,
    };
    let (t, v) = (cast_to(h, out), cast_to(updates, out));
    let prim = if out.is_float() {
        Dispatch::float_select_assign(t, 0, p, v, update)
    } else {
        Dispatch::int_select_assign(t, 0, p, v, update)
    };
    Ok(Handle::new(prim, out, h.shape.clone(), device))
}

// Nx's indexing rules, the one implementation the backend's NIFs and compiled programs share.

/// A slice start: a number, or a scalar tensor read when the op runs.
pub enum Start {
    Fixed(i64),
    Dynamic(Handle),
}

/// Nx clamps start indices so the window fits: `0 <= start <= dim - length` on every axis.
pub fn clamp_starts(starts: &[Start], shape: &[usize], lengths: &[usize]) -> ExResult<Vec<usize>> {
    if starts.len() != shape.len() || lengths.len() != shape.len() {
        return Err(ExError::invalid_with(
            "a slice needs one start and one length per axis",
            vec![dims_detail("shape", shape), dims_detail("lengths", lengths), ("starts", Detail::Int(starts.len() as i128))],
        ));
    }
    starts
        .iter()
        .zip(shape.iter().zip(lengths))
        .map(|(s, (&dim, &len))| {
            let v = match s {
                Start::Fixed(v) => *v,
                Start::Dynamic(h) if h.numel() == 1 => elementwise::read_ints(h)?[0],
                Start::Dynamic(h) => {
                    return Err(ExError::invalid_with("a slice start must be a scalar", vec![dims_detail("shape", &h.shape)]))
                }
            };
            Ok(v.max(0).min(dim.saturating_sub(len) as i64) as usize)
        })
        .collect()
}

/// Nx.slice with Nx's start clamping.
pub fn slice(h: &Handle, starts: &[Start], lengths: Vec<usize>, strides: Vec<usize>) -> ExResult<Handle> {
    let starts = clamp_starts(starts, &h.shape, &lengths)?;
    crate::ops::shape::slice(h, starts, lengths, strides)
}

/// Nx.put_slice with Nx's start clamping.
pub fn put_slice_at(h: &Handle, starts: &[Start], update: &Handle, ty: NxType) -> ExResult<Handle> {
    let starts = clamp_starts(starts, &h.shape, &update.shape)?;
    put_slice(&elementwise::as_type(h, ty)?, starts, update)
}

/// Elixir's inspect of a shape tuple, for Nx's error messages.
fn shape_text(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("{{{}}}", dims.join(", "))
}

/// `axes` moved to the front and merged into one axis, and `idx` (last axis: one coordinate per
/// entry of `axes`) turned into s64 indices into that merged axis. A coordinate out of range is
/// Nx's ArgumentError (BinaryBackend's message, naming the transposed shape), never a clamped or
/// wrapped read. Also returns the permutation.
fn linearize(x: &Handle, idx: &Handle, axes: &[usize]) -> ExResult<(Handle, Handle, Vec<usize>)> {
    let rank = x.rank();
    check_axes(axes, rank)?;
    let k = axes.len();
    if k == 0 || idx.rank() == 0 || idx.shape[idx.rank() - 1] != k {
        return Err(ExError::invalid_with(
            "indices need one coordinate per indexed axis in their last dimension",
            vec![dims_detail("indices", &idx.shape), ("axes", Detail::Dims(axes.to_vec()))],
        ));
    }
    let perm: Vec<usize> = axes.iter().copied().chain((0..rank).filter(|a| !axes.contains(a))).collect();
    let permuted: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let dims = &permuted[..k];
    let moved = if perm.iter().enumerate().all(|(i, &p)| i == p) { x.clone() } else { crate::ops::shape::transpose(x, perm.clone())? };
    let mut merged = vec![dims.iter().product()];
    merged.extend_from_slice(&permuted[k..]);
    let moved = crate::ops::shape::reshape(&moved, merged)?;
    let coords = elementwise::read_ints(idx)?;
    let mut flat = Vec::with_capacity(coords.len() / k * 8);
    for row in coords.chunks_exact(k) {
        let mut f = 0i64;
        for (axis, (&c, &d)) in row.iter().zip(dims).enumerate() {
            if c < 0 || c >= d as i64 {
                return Err(ExError::NxArgument(format!(
                    "index {c} is out of bounds for axis {axis} in shape {}",
                    shape_text(&permuted)
                )));
            }
            f = f * d as i64 + c;
        }
        flat.extend_from_slice(&f.to_ne_bytes());
    }
    let flat = Handle::from_bytes(flat, idx.shape[..idx.rank() - 1].to_vec(), NxType::S(64), x.device)?;
    Ok((moved, flat, perm))
}

/// Nx.gather over `axes`.
pub fn gather_axes(x: &Handle, idx: &Handle, axes: &[usize]) -> ExResult<Handle> {
    let (moved, flat, _perm) = linearize(x, idx, axes)?;
    take(&moved, &flat, 0)
}

/// Nx.indexed_add / Nx.indexed_put over `axes`: the merged-axis view is updated, then the axis
/// order restored. The result has type `ty`.
pub fn indexed_axes(op: IndexedOp, x: &Handle, idx: &Handle, updates: &Handle, axes: &[usize], ty: NxType) -> ExResult<Handle> {
    let (x2, flat, perm) = linearize(x, idx, axes)?;
    let rows = updates.shape.first().copied().unwrap_or(1);
    let mut upd_shape = vec![rows];
    upd_shape.extend_from_slice(&x2.shape[1..]);
    let upd = crate::ops::shape::reshape(updates, upd_shape)?;
    let r = index_update(op, &x2, &flat, &upd, ty)?;
    let permuted: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let r = crate::ops::shape::reshape(&r, permuted)?;
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(r);
    }
    let mut inverse = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inverse[p] = i;
    }
    crate::ops::shape::transpose(&r, inverse)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;

    #[test]
    fn argsort_is_stable_in_both_directions() {
        let x = f32s(&[3.0, 1.0, 3.0, 2.0, 1.0, 3.0], &[6]);
        let asc = argsort(&x, 0, false, NxType::S(64)).unwrap();
        assert_eq!(ints(&asc), vec![1, 4, 3, 0, 2, 5]);
        let desc = argsort(&x, 0, true, NxType::S(64)).unwrap();
        assert_eq!(ints(&desc), vec![0, 2, 5, 3, 1, 4]);
        let s = sort(&x, 0, false, x.ty).unwrap();
        assert_eq!(floats(&s), vec![1.0, 1.0, 2.0, 3.0, 3.0, 3.0]);
    }

    #[test]
    fn argsort_of_narrow_ints_along_inner_axis() {
        let x = i64s(&[5, 5, 1, 0, 2, 2], &[2, 3]);
        let x = crate::ops::elementwise::as_type(&x, NxType::U(8)).unwrap();
        let a = argsort(&x, 1, false, NxType::S(32)).unwrap();
        assert_eq!(ints(&a), vec![2, 0, 1, 0, 1, 2]);
    }

    #[test]
    fn cumulative_ops_forward_and_reverse() {
        let x = i64s(&[1, 2, 3, 4], &[4]);
        assert_eq!(ints(&cumulative(CumulativeOp::CumulativeSum, &x, 0, false).unwrap()), vec![1, 3, 6, 10]);
        assert_eq!(ints(&cumulative(CumulativeOp::CumulativeSum, &x, 0, true).unwrap()), vec![10, 9, 7, 4]);
        assert_eq!(ints(&cumulative(CumulativeOp::CumulativeProduct, &x, 0, false).unwrap()), vec![1, 2, 6, 24]);
        let y = f32s(&[3.0, 1.0, 2.0], &[3]);
        assert_eq!(floats(&cumulative(CumulativeOp::CumulativeMax, &y, 0, false).unwrap()), vec![3.0, 3.0, 3.0]);
        assert_eq!(floats(&cumulative(CumulativeOp::CumulativeMin, &y, 0, true).unwrap()), vec![1.0, 1.0, 2.0]);
    }

    #[test]
    fn reverse_put_slice_and_take() {
        let x = i64s(&[0, 1, 2, 3, 4, 5], &[2, 3]);
        assert_eq!(ints(&reverse(&x, vec![1], x.ty).unwrap()), vec![2, 1, 0, 5, 4, 3]);
        let u = i64s(&[9, 9], &[1, 2]);
        assert_eq!(ints(&put_slice(&x, vec![1, 1], &u).unwrap()), vec![0, 1, 2, 3, 9, 9]);
        let idx = i64s(&[2, 0, 2], &[3]);
        let t = take(&x, &idx, 1).unwrap();
        assert_eq!((t.shape.clone(), ints(&t)), (vec![2, 3], vec![2, 0, 2, 5, 3, 5]));
        assert!(take(&x, &i64s(&[3], &[1]), 1).is_err());
        let along = take_along_axis(&x, &i64s(&[1, 0, 2, 2], &[2, 2]), 1).unwrap();
        assert_eq!(ints(&along), vec![1, 0, 5, 5]);
    }

    #[test]
    fn indexed_add_accumulates_duplicates() {
        let x = f32s(&[0.0, 0.0, 0.0], &[3, 1]);
        let idx = i64s(&[0, 2, 0], &[3]);
        let upd = f32s(&[1.0, 2.0, 3.0], &[3, 1]);
        let r = index_update(IndexedOp::Add, &x, &idx, &upd, NxType::F(32)).unwrap();
        assert_eq!(floats(&r), vec![4.0, 0.0, 2.0]);
        let p = index_update(IndexedOp::Put, &x, &i64s(&[1], &[1]), &f32s(&[7.0], &[1, 1]), NxType::F(64)).unwrap();
        assert_eq!((p.ty, floats(&p)), (NxType::F(64), vec![0.0, 7.0, 0.0]));
    }

    /// Nx's rules shared by the backend's NIFs and compiled programs.
    #[test]
    fn starts_clamp_and_out_of_bounds_coordinates_are_nx_argument_errors() {
        let x = f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
        let starts = [Start::Fixed(5), Start::Dynamic(i64s(&[-3], &[1]))];
        assert_eq!(clamp_starts(&starts, &[2, 2], &[1, 2]).unwrap(), vec![1, 0]);
        assert!(clamp_starts(&starts[..1], &[2, 2], &[1, 2]).is_err());

        let got = gather_axes(&x, &i64s(&[1, 0, 0, 1], &[2, 2]), &[0, 1]).unwrap();
        assert_eq!(floats(&got), vec![3.0, 2.0]);
        match gather_axes(&x, &i64s(&[0, 2], &[1, 2]), &[1, 0]) {
            Err(ExError::NxArgument(m)) => assert_eq!(m, "index 2 is out of bounds for axis 1 in shape {2, 2}"),
            other => panic!("expected an Nx argument error, got {other:?}"),
        }
        match indexed_axes(IndexedOp::Add, &x, &i64s(&[3, 0], &[1, 2]), &f32s(&[1.0], &[1]), &[0, 1], NxType::F(32)) {
            Err(ExError::NxArgument(m)) => assert_eq!(m, "index 3 is out of bounds for axis 0 in shape {2, 2}"),
            other => panic!("expected an Nx argument error, got {other:?}"),
        }
        // indexed over permuted axes writes where the coordinates say
        let got = indexed_axes(IndexedOp::Put, &x, &i64s(&[1, 0], &[1, 2]), &f32s(&[9.0], &[1]), &[1, 0], NxType::F(32)).unwrap();
        assert_eq!(floats(&got), vec![1.0, 9.0, 3.0, 4.0]);
    }
}
