//! Glue between the cube GPU backends and the rest of the crate: when queued work reaches the
//! device (`flush`, any cube backend), kernels of a decoding step (`rows`, `paged_attention`),
//! and, on CUDA, vendor libraries on cubecl's tensors (`cuda`).

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod flush;
pub mod paged_attention;
pub mod rows;

/// Whether `t` lies on a GPU whose kernels here can run: a cube device with plane (warp,
/// subgroup) operations of one fixed size, which `rows` and `paged_attention` sum across.
#[cfg(any(feature = "cuda", feature = "rocm", feature = "vulkan", feature = "metal"))]
pub(crate) fn plane_kernels<const D: usize>(t: &burn::tensor::Tensor<D>) -> bool {
    use burn::backend::{BackendTensor, DispatchTensorKind};
    match &t.clone().into_dispatch().kind {
        DispatchTensorKind::Cube(BackendTensor::Float(f)) => {
            let client = f.client.device().client();
            let p = client.properties();
            p.features.plane.contains(cubecl::features::Plane::Ops) && p.hardware.plane_size_min == p.hardware.plane_size_max
        }
        _ => false,
    }
}
