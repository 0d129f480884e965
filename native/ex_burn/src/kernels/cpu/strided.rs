//! A rank-3 flex tensor's elements where they lie: storage, offset and strides as flex keeps them,
//! so a kernel reads a permuted or broadcast operand without copying it first, through raw
//! pointers once the view's reach is checked.

use burn::backend::{BackendTensor, DType, DispatchTensorKind};

use crate::dispatch::Prim;

/// A `[bsz, rows, cols]` strided view of `T` (strides in elements, of any sign, zero for
/// broadcast axes).
#[derive(Clone, Copy)]
pub(crate) struct View<'a, T> {
    pub data: &'a [T],
    pub offset: usize,
    pub shape: [usize; 3],
    pub strides: [isize; 3],
}

impl<'a, T: bytemuck::Pod> View<'a, T> {
    /// The view of `p` if it is a rank-3 flex float tensor of `dtype`, its storage of `E` read as
    /// `T` (of the same size: bf16 as its bits), whose every element lies inside the storage.
    pub fn of<E: burn::tensor::Element + bytemuck::Pod>(p: &'a Prim, dtype: DType) -> Option<Self> {
        let t = match &p.kind {
            DispatchTensorKind::Flex(BackendTensor::Float(t)) if t.dtype() == dtype && size_of::<E>() == size_of::<T>() => t,
            _ => return None,
        };
        let layout = t.layout();
        let shape: [usize; 3] = layout.shape().as_slice().try_into().ok()?;
        let strides: [isize; 3] = layout.strides().try_into().ok()?;
        let v = View { data: bytemuck::try_cast_slice(t.storage::<E>()).ok()?, offset: layout.start_offset(), shape, strides };
        v.in_bounds().then_some(v)
    }

    /// Whether every element the shape reaches lies inside `data`.
    pub fn in_bounds(&self) -> bool {
        if self.shape.contains(&0) {
            return true;
        }
        let (mut lo, mut hi) = (self.offset as isize, self.offset as isize);
        for (&d, &s) in self.shape.iter().zip(&self.strides) {
            let reach = (d as isize - 1) * s;
            if reach < 0 {
                lo += reach;
            } else {
                hi += reach;
            }
        }
        lo >= 0 && (hi as usize) < self.data.len()
    }

    /// Element (b, r, c); dereferencing it is sound for indices inside the shape of a view that
    /// passed `in_bounds`.
    #[inline(always)]
    pub fn ptr(&self, b: usize, r: usize, c: usize) -> *const T {
        let [s0, s1, s2] = self.strides;
        let at = self.offset as isize + b as isize * s0 + r as isize * s1 + c as isize * s2;
        self.data.as_ptr().wrapping_offset(at)
    }
}
