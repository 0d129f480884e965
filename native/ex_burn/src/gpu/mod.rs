//! Glue between the cube GPU backends and the rest of the crate: when queued work reaches the
//! device (`flush`, any cube backend), kernels of a decoding step (`rows`, `rope_cache`,
//! `paged_attention`) and the quantised weights they read (`blocks`), a recurrent step of
//! `model::cells` (`cells`), and, on CUDA, vendor
//! libraries on cubecl's tensors (`cuda`), and where compiled kernels outlive the process
//! (`kernel_cache`).

pub mod blocks;
#[cfg(cube)]
pub mod cells;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod flush;
#[cfg(feature = "cuda")]
pub mod kernel_cache;
pub mod paged_attention;
pub mod rope_cache;
pub mod rows;

/// Whether the kernels here (`rows`, `rope_cache`, `paged_attention`) run for tensors on `t`'s device: a cube
/// device with plane (warp, subgroup) operations of one fixed size, which they sum across, unless
/// `EXBURN_ROWS_KERNEL` turns them off.
pub(crate) fn kernels_run<const D: usize>(t: &burn::tensor::Tensor<D>) -> bool {
    #[cfg(cube)]
    {
        use burn::backend::{BackendTensor, DispatchTensorKind};
        crate::process::env::rows_kernel()
            && match &t.clone().into_dispatch().kind {
                DispatchTensorKind::Cube(BackendTensor::Float(f)) => {
                    let client = f.client.device().client();
                    let p = client.properties();
                    p.features.plane.contains(cubecl::features::Plane::Ops) && p.hardware.plane_size_min == p.hardware.plane_size_max
                }
                _ => false,
            }
    }
    #[cfg(not(cube))]
    {
        let _ = t;
        false
    }
}

/// Whether the float tensor `t` lives on a CUDA device.
#[cfg(feature = "cuda")]
pub(crate) fn dispatch_on_cuda(t: &burn::backend::DispatchTensor) -> bool {
    use burn::backend::{BackendTensor, DispatchTensorKind};
    match &t.kind {
        DispatchTensorKind::Cube(BackendTensor::Float(f)) => matches!(f.client.device(), cubecl::Device::Cuda(_)),
        _ => false,
    }
}

/// `t` with rows laid out one after another, as the kernels here index it.
#[cfg(cube)]
pub(crate) fn contiguous(t: burn_cubecl::tensor::CubeTensor) -> burn_cubecl::tensor::CubeTensor {
    if t.is_contiguous() {
        t
    } else {
        burn_cubecl::kernel::into_contiguous(t)
    }
}

/// `side` itself where the op holds its only reference and its rows are laid out one after
/// another, else a contiguous copy: a pool side is written in place, never under another
/// reader, and never through strides (CUDA pads the rows of uploaded tensors; a copy keeps them).
#[cfg(cube)]
pub(crate) fn writable(side: burn_cubecl::tensor::CubeTensor) -> burn_cubecl::tensor::CubeTensor {
    let side = contiguous(side);
    if side.can_mut() {
        side
    } else {
        side.copy()
    }
}

/// A new contiguous tensor of `shape` on `like`'s device, of its dtype, for a kernel to fill.
#[cfg(cube)]
pub(crate) fn output(like: &burn_cubecl::tensor::CubeTensor, shape: impl Into<burn::tensor::Shape>) -> burn_cubecl::tensor::CubeTensor {
    let shape = shape.into();
    let size = like.dtype.size();
    let handle = like.client.empty((shape.num_elements() * size).max(size));
    burn_cubecl::tensor::CubeTensor::new_contiguous(like.client.clone(), like.device.clone(), shape, handle, like.dtype)
}

/// What the kernels' tests share: their inputs, and whether the kernels run where they test.
#[cfg(test)]
pub(crate) mod test_support {
    use crate::device::{DeviceKind, DeviceRef};

    /// A fixed spread of values in [-1, 1], a different one per `salt`.
    pub fn value(i: usize, salt: usize) -> f64 {
        ((i * 7919 + salt * 104729) % 2003) as f64 / 1001.0 - 1.0
    }

    /// Whether the kernels run for `t` on `device`; where they don't (the CPU never runs them,
    /// nor a GPU without plane operations of one size) the test says it skipped.
    pub fn kernels_run<const D: usize>(t: &burn::tensor::Tensor<D>, device: &DeviceRef) -> bool {
        if !super::kernels_run(t) {
            println!("SKIPPED: the kernels do not run on {device:?}");
            return false;
        }
        assert_ne!(device.kind, DeviceKind::Cpu, "kernels on the CPU");
        true
    }
}
