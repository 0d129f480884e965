//! ExBurn's native core: Burn tensors behind an Erlang NIF.
//!
//! The crate is a pure Burn core (`tensor`, `dtype`, `device`, `dispatch`, `ops`, `error`) that
//! `cargo test` exercises directly, plus the NIF layer (`nif`, feature `nif`, on by default) that
//! only decodes terms, calls the core and encodes results.

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
