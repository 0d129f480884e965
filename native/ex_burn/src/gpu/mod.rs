//! Glue between the cube GPU backends and the rest of the crate: when queued work reaches the
//! device (`flush`, any cube backend) and, on CUDA, vendor libraries on cubecl's tensors (`cuda`).

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod flush;
