//! ExBurn's native core: Burn tensors behind an Erlang NIF.
//!
//! The crate is a pure Burn core (`tensor`, `dtype`, `device`, `dispatch`, `ops`, `error`) that
//! `cargo test` exercises directly, plus the NIF layer (`nif`, feature `nif`, on by default) that
//! only decodes terms, calls the core and encodes results.

// cubecl-cuda needs cudarc's run-time loading and candle-core asks it to link at build time;
// cudarc takes one mode per build (guides/devices.md).
#[cfg(all(feature = "cuda", feature = "candle-cuda"))]
compile_error!("the `cuda` and `candle-cuda` features cannot be built together: Burn's CUDA runtime loads CUDA's libraries at run time and Candle links them at build time, and cudarc takes one mode per build; build one library for each");

pub mod compiler;
pub mod device;
pub mod dispatch;
pub mod dtype;
pub mod error;
pub mod gpu;
pub mod kernels;
pub mod model;
pub mod ops;
pub mod pretrained;
pub mod probe;
pub mod process;
pub mod tensor;

#[cfg(feature = "nif")]
mod nif;

#[cfg(test)]
mod testing;
