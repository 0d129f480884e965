//! Creation and host transfer.

use burn::backend::ops::IntTensorOps;
use burn::backend::{Dispatch, Scalar, Slice};

use crate::device::DeviceRef;
use crate::dispatch::{self, Prim};
use crate::dtype::NxType;
use crate::error::{ExError, ExResult};
use crate::ops::{check_alloc, check_axes, empty};
use crate::tensor::{numel, Handle};

/// Reads the first `limit` elements (all when `None`) in Nx's binary layout. Only what is asked
/// for crosses from the device: the flattened tensor is sliced there first.
pub fn read(h: &Handle, limit: Option<usize>) -> ExResult<Vec<u8>> {
    let take = limit.map_or(h.numel(), |l| l.min(h.numel()));
    if take == 0 {
        return Ok(Vec::new());
    }
    let prim = if take < h.numel() {
        let flat = dispatch::reshape(h.prim.clone(), &[h.numel()]);
        dispatch::slice(flat, &[Slice::new(0, Some(take as isize), 1)])
    } else {
        h.prim.clone()
    };
    Ok(dispatch::into_data(prim)?.into_bytes().to_vec())
}

/// Checks shared by every creation op; `Some(empty)` when there is nothing to compute.
fn prepare(shape: &[usize], ty: NxType, device: DeviceRef) -> ExResult<Option<Handle>> {
    check_alloc(shape, ty)?;
    device.check_type(ty)?;
    if numel(shape) == 0 {
        return Ok(Some(empty(shape.to_vec(), ty, device)?));
    }
    Ok(None)
}

pub fn full(value: Scalar, shape: Vec<usize>, ty: NxType, device: DeviceRef) -> ExResult<Handle> {
    if let Some(e) = prepare(&shape, ty, device)? {
        return Ok(e);
    }
    let prim = dispatch::full(&shape, value, ty.dtype(), &device.burn()?);
    Ok(Handle::new(prim, ty, shape, device))
}

/// `0..len` as i64 laid along `axis`, broadcast to `shape`.
fn arange_along(len: usize, axis: usize, shape: &[usize], device: &burn::tensor::Device) -> Prim {
    let range = Dispatch::int_arange(0..len as i64, device.as_dispatch(), burn::backend::IntDType::I64);
    let mut along = vec![1; shape.len()];
    along[axis] = len;
    dispatch::expand(dispatch::reshape(range, &along), shape)
}

pub fn iota(shape: Vec<usize>, ty: NxType, axis: Option<usize>, device: DeviceRef) -> ExResult<Handle> {
    if let Some(a) = axis {
        check_axes(&[a], shape.len())?;
    }
    if let Some(e) = prepare(&shape, ty, device)? {
        return Ok(e);
    }
    let bd = device.burn()?;
    let prim = match axis {
        Some(a) => arange_along(shape[a], a, &shape, &bd),
        None => dispatch::reshape(arange_along(numel(&shape), 0, &[numel(&shape)], &bd), &shape),
    };
    Ok(Handle::new(dispatch::cast(prim, ty.dtype()), ty, shape, device))
}

/// Nx.eye: ones where the last two indices agree.
pub fn eye(shape: Vec<usize>, ty: NxType, device: DeviceRef) -> ExResult<Handle> {
    if shape.len() < 2 {
        return Err(ExError::invalid("eye needs a shape of rank 2 or more"));
    }
    if let Some(e) = prepare(&shape, ty, device)? {
        return Ok(e);
    }
    let bd = device.burn()?;
    let r = shape.len();
    let rows = arange_along(shape[r - 2], r - 2, &shape, &bd);
    let cols = arange_along(shape[r - 1], r - 1, &shape, &bd);
    let on_diagonal = dispatch::pred(Dispatch::int_equal(rows, cols, dispatch::BOOL));
    Ok(Handle::new(dispatch::cast(on_diagonal, ty.dtype()), ty, shape, device))
}

/// Copies a tensor to another device through the host.
pub fn to_device(h: Handle, device: DeviceRef) -> ExResult<Handle> {
    if device == h.device {
        return Ok(h);
    }
    device.check_type(h.ty)?;
    let bytes = h.to_bytes()?;
    Handle::from_bytes(bytes, h.shape, h.ty, device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;

    #[test]
    fn iota_along_an_axis_and_flat() {
        let h = iota(vec![2, 3], NxType::S(64), Some(1), crate::testing::device()).unwrap();
        assert_eq!(ints(&h), vec![0, 1, 2, 0, 1, 2]);
        let h = iota(vec![2, 3], NxType::F(32), None, crate::testing::device()).unwrap();
        assert_eq!(floats(&h), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    }

    #[test]
    fn eye_is_identity_on_last_two_axes() {
        let h = eye(vec![2, 2, 3], NxType::U(8), crate::testing::device()).unwrap();
        assert_eq!(h.to_bytes().unwrap(), vec![1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1, 0]);
    }

    #[test]
    fn full_of_every_type_reads_back_the_value() {
        for ty in crate::dtype::ALL_TYPES.into_iter().filter(|t| supports(*t)) {
            let value = if ty.is_float() { Scalar::Float(3.0) } else { Scalar::Int(3) };
            let h = full(value, vec![2, 2], ty, crate::testing::device()).unwrap();
            assert_eq!(floats(&as_f64(&h)), vec![3.0; 4], "{ty}");
        }
    }

    #[test]
    fn the_top_half_of_u64_fills_exactly() {
        for v in [u64::MAX, i64::MAX as u64 + 1, 7] {
            let h = full(Scalar::UInt(v), vec![3], NxType::U(64), crate::testing::device()).unwrap();
            assert_eq!(h.to_bytes().unwrap(), v.to_ne_bytes().repeat(3), "{v}");
        }
    }

    #[test]
    fn read_with_a_limit_returns_a_prefix() {
        let h = iota(vec![3, 4], NxType::S(32), None, crate::testing::device()).unwrap();
        let bytes = read(&h, Some(5)).unwrap();
        assert_eq!(bytes.len(), 20);
        assert_eq!(&bytes[16..20], &4i32.to_ne_bytes());
    }

    #[test]
    fn huge_shapes_are_refused_before_allocating() {
        let err = full(Scalar::Float(0.0), vec![1 << 40, 1 << 40], NxType::F(32), crate::testing::device()).unwrap_err();
        assert!(matches!(err, ExError::TooLarge { .. }), "{err:?}");
    }
}
