//! Op families. Each module holds the NIFs of one family; the helpers here are what they share:
//! broadcasting, device agreement and the allocation check.

pub mod conv;
pub mod create;
pub mod elementwise;
pub mod indexing;
pub mod linalg;
pub mod precision;
pub mod reduce;
pub mod shape;
pub mod vocab;
pub mod window;

use std::borrow::Cow;
use std::sync::OnceLock;

use crate::device::DeviceRef;
use crate::dispatch::{self, Prim};
use crate::dtype::NxType;
use crate::error::{Detail, ExError, ExResult};
use crate::tensor::{numel, Handle};

/// Largest allocation attempted: the machine's physical memory where it is known. Rust aborts the
/// process on a failed allocation, so oversize requests must be refused before Burn allocates.
fn alloc_limit() -> u128 {
    static LIMIT: OnceLock<u128> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<u128>().ok())
            })
            .map(|kb| kb * 1024)
            .unwrap_or(isize::MAX as u128)
    })
}

pub fn check_alloc(shape: &[usize], ty: NxType) -> ExResult<()> {
    let elems = shape.iter().try_fold(1u128, |acc, &d| acc.checked_mul(d as u128));
    let bytes = elems.and_then(|e| e.checked_mul(ty.bytes() as u128)).unwrap_or(u128::MAX);
    let limit = alloc_limit();
    if bytes > limit {
        return Err(ExError::TooLarge { shape: shape.to_vec(), bytes, limit });
    }
    Ok(())
}

/// Nx broadcasting: shapes aligned on the right, size-1 dimensions stretch.
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> ExResult<Vec<usize>> {
    let rank = a.len().max(b.len());
    let dim = |s: &[usize], i: usize| if i + s.len() >= rank { s[i + s.len() - rank] } else { 1 };
    (0..rank)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (x, y) if x == y => Ok(x),
            (1, y) => Ok(y),
            (x, 1) => Ok(x),
            _ => Err(ExError::Broadcast { lhs: a.to_vec(), rhs: b.to_vec() }),
        })
        .collect()
}

/// The handle's primitive broadcast to `shape` (which must be a valid broadcast of its shape).
pub fn broadcast_prim(h: &Handle, shape: &[usize]) -> Prim {
    if h.shape == shape {
        return h.prim.clone();
    }
    let mut padded = vec![1; shape.len() - h.rank()];
    padded.extend_from_slice(&h.shape);
    let t = dispatch::reshape(h.prim.clone(), &padded);
    dispatch::expand(t, shape)
}

/// The device rule, owned here for every path (ExBurn.Tensor, ExBurn.Backend, programs): an op
/// runs on its first operand's device, and operands held on another device are copied there
/// first (through the host; `to_device`'s type check applies). Returns that device and the
/// operands, borrowed where they already live there.
pub fn colocate<'a, const N: usize>(hs: [&'a Handle; N]) -> ExResult<(DeviceRef, [Cow<'a, Handle>; N])> {
    let device = hs[0].device;
    let mut out = hs.map(Cow::Borrowed);
    for h in out.iter_mut().skip(1) {
        if h.device != device {
            *h = Cow::Owned(create::to_device(h.as_ref().clone(), device)?);
        }
    }
    Ok((device, out))
}

/// `colocate` for a run of operands (concatenate, stack).
pub fn colocate_all(hs: &[Handle]) -> ExResult<(DeviceRef, Vec<Cow<'_, Handle>>)> {
    let device = hs.first().ok_or_else(|| ExError::invalid("needs at least one tensor"))?.device;
    let out = hs
        .iter()
        .map(|h| if h.device == device { Ok(Cow::Borrowed(h)) } else { create::to_device(h.clone(), device).map(Cow::Owned) })
        .collect::<ExResult<_>>()?;
    Ok((device, out))
}

/// A tensor with no elements. Burn kernels are not written for zero-size inputs, so ops whose
/// output is empty produce it here without running one.
pub fn empty(shape: Vec<usize>, ty: NxType, device: DeviceRef) -> ExResult<Handle> {
    debug_assert_eq!(numel(&shape), 0);
    Handle::from_bytes(Vec::new(), shape, ty, device)
}

pub fn cast_to(h: &Handle, ty: NxType) -> Prim {
    dispatch::cast(h.prim.clone(), ty.dtype())
}

/// An axis list that must name distinct axes below `rank`.
pub fn check_axes(axes: &[usize], rank: usize) -> ExResult<()> {
    let mut seen = vec![false; rank];
    for &a in axes {
        if a >= rank || seen[a] {
            return Err(ExError::invalid_with(
                "axes must be distinct and below the rank",
                vec![dims_detail("axes", axes), ("rank", Detail::Int(rank as i128))],
            ));
        }
        seen[a] = true;
    }
    Ok(())
}

pub fn dims_detail(name: &'static str, d: &[usize]) -> (&'static str, Detail) {
    (name, Detail::Dims(d.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{device, f32s, floats};
    use vocab::BinaryOp;

    /// Under EXBURN_TEST_DEVICE=vulkan (CI's lavapipe stage, GPU runs) the operands really sit on
    /// two devices; on the CPU the same calls check that colocated operands are not copied.
    #[test]
    fn ops_run_on_the_first_operands_device_and_copy_the_others_there() {
        let on_test = f32s(&[1.0, 2.0], &[2]);
        let cpu = Handle::from_bytes([10.0f32, 20.0].iter().flat_map(|v| v.to_ne_bytes()).collect(), vec![2], NxType::F(32), DeviceRef::CPU).unwrap();

        let (d, [a, b]) = colocate([&on_test, &cpu]).unwrap();
        assert_eq!(d, device());
        assert_eq!((a.device, b.device), (device(), device()));
        assert!(matches!(a, Cow::Borrowed(_)));
        assert_eq!(matches!(b, Cow::Borrowed(_)), device() == DeviceRef::CPU);

        let sum = elementwise::binary(BinaryOp::Add, &on_test, &cpu, NxType::F(32)).unwrap();
        assert_eq!((sum.device, floats(&sum)), (device(), vec![11.0, 22.0]));
        let sum = elementwise::binary(BinaryOp::Add, &cpu, &on_test, NxType::F(32)).unwrap();
        assert_eq!((sum.device, floats(&sum)), (DeviceRef::CPU, vec![11.0, 22.0]));

        let joined = shape::concatenate(&[cpu.clone(), on_test.clone()], 0, NxType::F(32)).unwrap();
        assert_eq!((joined.device, floats(&joined)), (DeviceRef::CPU, vec![10.0, 20.0, 1.0, 2.0]));
    }

    #[test]
    fn broadcast_shapes_align_on_the_right() {
        assert_eq!(broadcast_shape(&[3, 1], &[2]).unwrap(), vec![3, 2]);
        assert_eq!(broadcast_shape(&[], &[2, 2]).unwrap(), vec![2, 2]);
        assert_eq!(broadcast_shape(&[0, 1], &[1, 4]).unwrap(), vec![0, 4]);
        assert!(broadcast_shape(&[2, 3], &[3, 2]).is_err());
    }

    #[test]
    fn axes_must_be_distinct_and_in_range() {
        assert!(check_axes(&[0, 1], 2).is_ok());
        assert!(check_axes(&[1, 1], 2).is_err());
        assert!(check_axes(&[2], 2).is_err());
    }
}
