//! CUDA-only glue: cuBLAS products on cubecl's tensors (`cublas`) and the device-side ordering
//! between cubecl's stream and the library's (`handoff`), an exact float remainder kernel
//! (`fmod`), and a decoder step of its own kernels replayed as CUDA graphs (`decode`).

pub mod cublas;
pub mod decode;
pub mod fmod;
pub mod handoff;

/// cubecl's CUDA compute server, whose resources both modules resolve to device pointers.
pub(crate) type CudaServer = <cubecl::cuda::CudaRuntime as cubecl_runtime::runtime::Runtime>::Server;
