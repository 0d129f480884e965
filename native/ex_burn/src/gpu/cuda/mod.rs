//! CUDA-only glue: cuBLAS products on cubecl's tensors (`cublas`) and the device-side ordering
//! between cubecl's stream and the library's (`handoff`), and an exact float remainder kernel
//! (`fmod`).

pub mod cublas;
pub mod fmod;
pub mod handoff;

/// cubecl's CUDA compute server, whose resources both modules resolve to device pointers.
pub(crate) type CudaServer = <cubecl::cuda::CudaRuntime as cubecl_runtime::runtime::Runtime>::Server;
