//! Nx.take on the CPU: one parallel pass copying blocks, for contiguous flex tensors.
//!
//! flex's `select` gathers on one thread, which left large takes slower than PyTorch's
//! (guides/backend.md has the timings). The indices arrive
//! checked (`indexing::checked_indices`); other devices, strided views and dtypes keep Burn's
//! path. Written against Burn's public API so it could move into burn-flex.

use burn::backend::{BackendTensor, DispatchTensorKind, Element, TensorData};

use super::vector::par_chunks_for;
use crate::dispatch::{self, Prim};

/// Rows of `inner` values copied per task, at least this many values in all.
const TASK_VALUES: usize = 1 << 14;

/// The contiguous storage of a flex tensor holding `T`s.
fn flex_slice<T: Element + bytemuck::Pod>(p: &Prim) -> Option<&[T]> {
    match &p.kind {
        DispatchTensorKind::Flex(BackendTensor::Float(t) | BackendTensor::Int(t)) if t.dtype() == T::dtype() => t.as_slice::<T>(),
        _ => None,
    }
}

/// `take(x, idx, axis)` of Nx with s64 indices (a flex tensor) in `0..x.shape[axis]`, as a tensor of shape
/// `x.shape[..axis] ++ [idx.len()] ++ x.shape[axis+1..]` (the caller reshapes), else `None`.
pub fn take(x: &Prim, idx: &Prim, axis: usize) -> Option<Prim> {
    let dtype = match &x.kind {
        DispatchTensorKind::Flex(BackendTensor::Float(t) | BackendTensor::Int(t)) => t.dtype(),
        _ => return None,
    };
    use burn::backend::DType;
    match dtype {
        DType::F32 => take_typed::<f32>(x, idx, axis),
        DType::F64 => take_typed::<f64>(x, idx, axis),
        DType::I64 => take_typed::<i64>(x, idx, axis),
        DType::I32 => take_typed::<i32>(x, idx, axis),
        _ => None,
    }
}

fn take_typed<T: Element + bytemuck::Pod>(x: &Prim, idx: &Prim, axis: usize) -> Option<Prim> {
    let (xs, ids) = (flex_slice::<T>(x)?, flex_slice::<i64>(idx)?);
    let dims = dispatch::dims(x);
    let (outer, len, inner) = (dims[..axis].iter().product::<usize>(), dims[axis], dims[axis + 1..].iter().product::<usize>());
    // the caller checked the indices (an out-of-range one would panic on the slice index, which
    // the NIF boundary turns into an error; it is never read out of bounds)
    if inner == 0 {
        return None;
    }
    let rows = outer * ids.len();
    let mut out = vec![T::default(); rows * inner];
    let per_task = TASK_VALUES.div_ceil(inner).max(1);
    let n = ids.len();
    par_chunks_for(&mut out, per_task * inner, rows * inner, |task, piece| {
        // (o, i): the outer block and index of the task's first row, stepped without divisions
        let first = task * per_task;
        let (mut o, mut i) = (first / n, first % n);
        for row in piece.chunks_mut(inner) {
            let at = (o * len + ids[i] as usize) * inner;
            if inner == 1 {
                // single values (a vector, or the last axis): no per-row memcpy
                row[0] = xs[at];
            } else {
                row.copy_from_slice(&xs[at..][..inner]);
            }
            i += 1;
            if i == n {
                (o, i) = (o + 1, 0);
            }
        }
    });
    let mut shape = dims[..axis].to_vec();
    shape.push(ids.len());
    shape.extend(&dims[axis + 1..]);
    Some(dispatch::from_data(TensorData::new(out, shape), &burn::tensor::Device::flex()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::ops::{FloatTensorOps, IntTensorOps};
    use burn::backend::Dispatch;

    fn flex<T: Element>(values: Vec<T>, shape: &[usize]) -> Prim {
        dispatch::from_data(TensorData::new(values, shape.to_vec()), &burn::tensor::Device::flex())
    }

    #[test]
    fn equals_flex_select_on_every_axis_and_both_thread_paths() {
        for (shape, n_idx) in [(vec![1 << 16], 1 << 17), (vec![7, 5, 3], 11), (vec![300, 257], 400), (vec![2, 1], 3)] {
            let total: usize = shape.iter().product();
            let xs: Vec<f32> = (0..total).map(|i| i as f32 * 0.5 - 3.0).collect();
            let x = flex(xs, &shape);
            for axis in 0..shape.len() {
                let ids: Vec<i64> = (0..n_idx).map(|i| ((i * 7919 + 3) % shape[axis]) as i64).collect();
                let idx = flex(ids, &[n_idx]);
                let ours = dispatch::into_data(take(&x, &idx, axis).expect("contiguous f32")).unwrap();
                let theirs = dispatch::into_data(Dispatch::float_select(x.clone(), axis, idx.clone())).unwrap();
                assert_eq!(ours.shape(), theirs.shape(), "{shape:?} axis {axis}");
                assert_eq!(ours.try_to_vec::<f32>().unwrap(), theirs.try_to_vec::<f32>().unwrap(), "{shape:?} axis {axis}");
            }
        }
        // an integer tensor
        let x = flex((0..24i64).collect::<Vec<_>>(), &[4, 6]);
        let idx = flex(vec![3i64, 0, 3], &[3]);
        let ours = dispatch::into_data(take(&x, &idx, 1).unwrap()).unwrap();
        let theirs = dispatch::into_data(Dispatch::int_select(x, 1, idx)).unwrap();
        assert_eq!(ours.try_to_vec::<i64>().unwrap(), theirs.try_to_vec::<i64>().unwrap());
    }

    #[test]
    fn other_index_dtypes_are_left_to_the_caller_and_out_of_range_indices_panic_not_read() {
        let x = flex(vec![1.0f32, 2.0], &[2]);
        assert!(take(&x, &flex(vec![0i32], &[1]), 0).is_none());
        for bad in [2i64, -1] {
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| take(&x, &flex(vec![bad], &[1]), 0)));
            assert!(caught.is_err(), "index {bad}");
        }
    }
}
