//! The tensor resource: a Burn primitive plus the Nx view of it.
//!
//! Burn has no rank-0 tensors, so the Nx shape is kept beside the primitive (a scalar is stored as
//! `[1]`). Shape, type and device queries read these fields and never touch device memory.

use std::sync::RwLock;

use burn::backend::{DispatchTensor, TensorData, TensorMetadata};

use crate::device::DeviceRef;
use crate::dispatch;
use crate::dtype::NxType;
use crate::error::{ExError, ExResult};

#[derive(Clone, Debug)]
pub struct Handle {
    pub prim: DispatchTensor,
    pub ty: NxType,
    pub shape: Vec<usize>,
    pub device: DeviceRef,
}

/// A tensor slot that can be emptied early: the BEAM frees the slot at garbage collection, and
/// `deallocate` frees the Burn memory before that.
pub struct TensorSlot {
    slot: RwLock<Option<Handle>>,
}

pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

impl Handle {
    pub fn new(prim: DispatchTensor, ty: NxType, shape: Vec<usize>, device: DeviceRef) -> Self {
        debug_assert_eq!(prim.shape().num_elements(), numel(&shape));
        Handle { prim, ty, shape, device }
    }

    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn from_bytes(bytes: Vec<u8>, shape: Vec<usize>, ty: NxType, device: DeviceRef) -> ExResult<Self> {
        let expected = numel(&shape).checked_mul(ty.bytes());
        if expected != Some(bytes.len()) {
            return Err(ExError::BinarySize {
                expected: expected.unwrap_or(usize::MAX),
                actual: bytes.len(),
                shape,
                ty,
            });
        }
        device.check_type(ty)?;
        let data = TensorData::from_bytes_vec(bytes, dispatch::burn_shape(&shape), ty.dtype());
        let prim = dispatch::from_data(data, &device.burn()?);
        Ok(Handle::new(prim, ty, shape, device))
    }

    /// Reads the tensor back to host bytes (Nx binary layout: row-major, native endian).
    pub fn to_bytes(&self) -> ExResult<Vec<u8>> {
        let data = dispatch::into_data(self.prim.clone())?;
        Ok(data.into_bytes().to_vec())
    }

    /// A copy of this handle with another primitive and shape, same type and device.
    pub fn with(&self, prim: DispatchTensor, shape: Vec<usize>) -> Handle {
        let ty = NxType::from_dtype(prim.dtype()).unwrap_or(self.ty);
        Handle::new(prim, ty, shape, self.device)
    }
}

impl TensorSlot {
    pub fn new(handle: Handle) -> Self {
        TensorSlot { slot: RwLock::new(Some(handle)) }
    }

    /// The live handle; cloning it is cheap (Burn primitives are reference counted).
    pub fn get(&self) -> ExResult<Handle> {
        self.slot
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(ExError::Deallocated)
    }

    /// Runs `f` on the live handle without cloning it. A scheduling check must look only: cloning a
    /// fusion tensor on a thread other than the one that made it (a normal scheduler asking about
    /// a result of a dirty one) makes a cross-stream view, which drains the producer's queue and
    /// later registers a drop, costing a GPU op tens of microseconds before it even starts.
    pub fn peek<R>(&self, f: impl FnOnce(&Handle) -> R) -> ExResult<R> {
        self.slot.read().unwrap_or_else(|e| e.into_inner()).as_ref().map(f).ok_or(ExError::Deallocated)
    }

    /// Drops the primitive now instead of at garbage collection. Returns false when it was
    /// already gone.
    pub fn deallocate(&self) -> bool {
        self.slot.write().unwrap_or_else(|e| e.into_inner()).take().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::ALL_TYPES;

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 37 % 251) as u8).collect()
    }

    #[test]
    fn bytes_round_trip_for_every_type_and_rank() {
        for ty in ALL_TYPES.into_iter().filter(|t| crate::testing::supports(*t)) {
            for rank in 0..=6 {
                let shape: Vec<usize> = (0..rank).map(|i| 1 + (i % 3)).collect();
                let bytes = pattern(numel(&shape) * ty.bytes());
                // NaN payloads survive a byte copy but not every float op: only copies happen here.
                let h = Handle::from_bytes(bytes.clone(), shape.clone(), ty, crate::testing::device()).unwrap();
                assert_eq!(h.shape, shape);
                assert_eq!(h.ty, ty);
                assert_eq!(h.to_bytes().unwrap(), bytes, "{ty} rank {rank}");
            }
        }
    }

    #[test]
    fn zero_size_tensors_round_trip() {
        for ty in ALL_TYPES.into_iter().filter(|t| crate::testing::supports(*t)) {
            for shape in [vec![0], vec![2, 0, 3], vec![0, 0]] {
                let h = Handle::from_bytes(Vec::new(), shape.clone(), ty, crate::testing::device()).unwrap();
                assert_eq!(h.numel(), 0);
                assert!(h.to_bytes().unwrap().is_empty());
            }
        }
    }

    #[test]
    fn wrong_byte_count_is_an_error_not_a_panic() {
        let err = Handle::from_bytes(vec![0; 7], vec![2], NxType::F(32), crate::testing::device()).unwrap_err();
        assert!(matches!(err, ExError::BinarySize { expected: 8, actual: 7, .. }), "{err:?}");
    }

    #[test]
    fn deallocated_tensor_reports_deallocated() {
        let h = Handle::from_bytes(vec![1, 2], vec![2], NxType::U(8), crate::testing::device()).unwrap();
        let res = TensorSlot::new(h);
        assert!(res.get().is_ok());
        assert!(res.deallocate());
        assert!(!res.deallocate());
        assert!(matches!(res.get(), Err(ExError::Deallocated)));
    }

    #[test]
    fn peek_reads_the_live_handle_and_reports_deallocated() {
        let h = Handle::from_bytes(vec![0; 24], vec![2, 3], NxType::F(32), crate::testing::device()).unwrap();
        let res = TensorSlot::new(h);
        assert_eq!(res.peek(|h| (h.shape.clone(), h.ty)).unwrap(), (vec![2, 3], NxType::F(32)));
        res.deallocate();
        assert!(matches!(res.peek(|h| h.numel()), Err(ExError::Deallocated)));
    }
}
