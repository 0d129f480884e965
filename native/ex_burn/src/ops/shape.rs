//! Shape NIFs: reshape, transpose, broadcast, slice, concatenate, stack.

use burn::backend::Slice;

use crate::dispatch;
use crate::dtype::NxType;
use crate::error::{Detail, ExError, ExResult};
use std::borrow::Cow;

use crate::ops::{cast_to, check_alloc, check_axes, dims_detail, empty, colocate_all};
use crate::tensor::{numel, Handle};

pub fn reshape(h: &Handle, shape: Vec<usize>) -> ExResult<Handle> {
    if numel(&shape) != h.numel() {
        return Err(ExError::invalid_with(
            "reshape must keep the number of elements",
            vec![dims_detail("from", &h.shape), dims_detail("to", &shape)],
        ));
    }
    if h.numel() == 0 {
        return empty(shape, h.ty, h.device);
    }
    Ok(h.with(dispatch::reshape(h.prim.clone(), &shape), shape))
}

/// Nx.transpose: output axis i is input axis `axes[i]`.
pub fn transpose(h: &Handle, axes: Vec<usize>) -> ExResult<Handle> {
    {
        if axes.len() != h.rank() {
            return Err(ExError::invalid_with(
                "transpose axes must be a permutation of the tensor's axes",
                vec![dims_detail("axes", &axes), dims_detail("shape", &h.shape)],
            ));
        }
        check_axes(&axes, h.rank())?;
        let shape: Vec<usize> = axes.iter().map(|&a| h.shape[a]).collect();
        if h.numel() == 0 {
            return empty(shape, h.ty, h.device);
        }
        Ok(h.with(dispatch::permute(h.prim.clone(), &axes), shape))
    }
}

/// Nx.broadcast with explicit axes: input axis i becomes output axis `axes[i]`; the result in
/// `ty`.
pub fn broadcast(h: &Handle, shape: Vec<usize>, axes: Vec<usize>, ty: NxType) -> ExResult<Handle> {
    let h = &crate::ops::elementwise::as_type(h, ty)?;
    {
        let bad = || {
            ExError::invalid_with(
                "cannot broadcast tensor to shape with these axes",
                vec![dims_detail("from", &h.shape), dims_detail("to", &shape), dims_detail("axes", &axes)],
            )
        };
        if axes.len() != h.rank() || axes.windows(2).any(|w| w[0] >= w[1]) {
            return Err(bad());
        }
        let mut aligned = vec![1; shape.len()];
        for (i, &a) in axes.iter().enumerate() {
            if a >= shape.len() || (h.shape[i] != 1 && h.shape[i] != shape[a]) {
                return Err(bad());
            }
            aligned[a] = h.shape[i];
        }
        check_alloc(&shape, h.ty)?;
        if numel(&shape) == 0 {
            return empty(shape, h.ty, h.device);
        }
        let prim = dispatch::reshape(h.prim.clone(), &aligned);
        let prim = dispatch::expand(prim, &shape);
        Ok(h.with(prim, shape))
    }
}

/// Nx.slice with static, in-bounds starts.
pub fn slice(h: &Handle, starts: Vec<usize>, lengths: Vec<usize>, strides: Vec<usize>) -> ExResult<Handle> {
    {
        let r = h.rank();
        let in_bounds = starts.len() == r
            && lengths.len() == r
            && strides.len() == r
            && strides.iter().all(|s| *s > 0)
            && (0..r).all(|i| starts[i].checked_add(lengths[i]).is_some_and(|end| end <= h.shape[i]));
        if !in_bounds {
            return Err(ExError::invalid_with(
                "slice is out of bounds",
                vec![
                    dims_detail("shape", &h.shape),
                    dims_detail("starts", &starts),
                    dims_detail("lengths", &lengths),
                    dims_detail("strides", &strides),
                ],
            ));
        }
        let shape: Vec<usize> = (0..r).map(|i| lengths[i].div_ceil(strides[i])).collect();
        if numel(&shape) == 0 {
            return empty(shape, h.ty, h.device);
        }
        if r == 0 {
            return Ok(h.clone());
        }
        let slices: Vec<Slice> = (0..r)
            .map(|i| Slice::new(starts[i] as isize, Some((starts[i] + lengths[i]) as isize), strides[i] as isize))
            .collect();
        Ok(h.with(dispatch::slice(h.prim.clone(), &slices), shape))
    }
}

fn join(tensors: &[Handle], axis: usize, out: NxType, stack: bool) -> ExResult<Handle> {
    if tensors.is_empty() {
        return Err(ExError::invalid("needs at least one tensor"));
    }
    let (device, colocated) = colocate_all(tensors)?;
    let tensors: Vec<Handle> = colocated.into_iter().map(Cow::into_owned).collect();
    let tensors = tensors.as_slice();
    device.check_type(out)?;
    let first = &tensors[0].shape;
    let rank = first.len();
    let limit = if stack { rank + 1 } else { rank };
    if axis >= limit {
        return Err(ExError::invalid_with("axis out of range", vec![("axis", Detail::Int(axis as i128)), dims_detail("shape", first)]));
    }
    // Stacking is concatenation of the inputs with a new size-1 axis.
    let lifted: Vec<Vec<usize>> = tensors
        .iter()
        .map(|t| {
            let mut s = t.shape.clone();
            if stack {
                s.insert(axis, 1);
            }
            s
        })
        .collect();
    for (t, s) in tensors.iter().zip(&lifted) {
        let compatible = s.len() == lifted[0].len()
            && s.iter().zip(&lifted[0]).enumerate().all(|(i, (a, b))| i == axis || a == b);
        if !compatible || (stack && t.shape != *first) {
            return Err(ExError::invalid_with(
                "tensors must have the same shape except along the axis",
                vec![dims_detail("first", first), dims_detail("other", &t.shape), ("axis", Detail::Int(axis as i128))],
            ));
        }
    }
    let mut shape = lifted[0].clone();
    shape[axis] = lifted.iter().map(|s| s[axis]).sum();
    check_alloc(&shape, out)?;
    if numel(&shape) == 0 {
        return empty(shape, out, device);
    }
    let parts: Vec<_> = tensors
        .iter()
        .zip(&lifted)
        .filter(|(t, _)| t.numel() > 0)
        .map(|(t, s)| dispatch::reshape(cast_to(t, out), s))
        .collect();
    let prim = dispatch::cat(parts, axis);
    Ok(Handle::new(prim, out, shape, device))
}

pub fn concatenate(tensors: &[Handle], axis: usize, out: NxType) -> ExResult<Handle> {
    if tensors.iter().any(|t| t.rank() == 0) {
        return Err(ExError::invalid("cannot concatenate scalars"));
    }
    join(tensors, axis, out, false)
}

pub fn stack(tensors: &[Handle], axis: usize, out: NxType) -> ExResult<Handle> {
    join(tensors, axis, out, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;

    #[test]
    fn transpose_and_reshape() {
        let x = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
        let t = transpose(&x, vec![1, 0]).unwrap();
        assert_eq!((t.shape.clone(), floats(&t)), (vec![3, 2], vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]));
        assert!(reshape(&x, vec![4]).is_err());
        assert_eq!(reshape(&x, vec![3, 1, 2]).unwrap().shape, vec![3, 1, 2]);
    }

    #[test]
    fn slice_with_strides() {
        let x = crate::ops::create::iota(vec![4, 5], NxType::S(64), None, crate::testing::device()).unwrap();
        let s = slice(&x, vec![1, 0], vec![3, 5], vec![2, 2]).unwrap();
        assert_eq!((s.shape.clone(), ints(&s)), (vec![2, 3], vec![5, 7, 9, 15, 17, 19]));
        assert!(slice(&x, vec![3, 0], vec![2, 5], vec![1, 1]).is_err());
    }

    #[test]
    fn concatenate_casts_and_stack_adds_an_axis() {
        let a = f32s(&[1.0, 2.0], &[1, 2]);
        let b = i64s(&[3, 4, 5, 6], &[2, 2]);
        let c = concatenate(&[a.clone(), b], 0, NxType::F(64)).unwrap();
        assert_eq!((c.shape.clone(), c.ty, floats(&c)), (vec![3, 2], NxType::F(64), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
        let s = stack(&[a.clone(), a], 1, NxType::F(32)).unwrap();
        assert_eq!((s.shape.clone(), floats(&s)), (vec![1, 2, 2], vec![1.0, 2.0, 1.0, 2.0]));
    }

    #[test]
    fn broadcast_with_axes() {
        let x = f32s(&[1.0, 2.0], &[2]);
        let b = broadcast(&x, vec![2, 3], vec![0], x.ty).unwrap();
        assert_eq!(floats(&b), vec![1.0, 1.0, 1.0, 2.0, 2.0, 2.0]);
        assert!(broadcast(&x, vec![3, 3], vec![0], x.ty).is_err());
    }
}
