//! ExBurn's native core: Burn tensors behind an Erlang NIF.
//!
//! The crate is a pure Burn core (`tensor`, `dtype`, `device`, `dispatch`, `ops`, `error`) that
//! `cargo test` exercises directly, plus the NIF layer (`nif`, feature `nif`, on by default) that
//! only decodes terms, calls the core and encodes results.

pub mod alloc;
pub mod cpu_target;
pub mod compiler;
#[cfg(feature = "cuda")]
pub mod cublas;
#[cfg(feature = "cuda")]
pub mod cuda_handoff;
pub mod device;
pub mod dispatch;
pub mod dtype;
pub mod error;
pub mod flush;
pub mod model;
pub mod ops;
pub mod precision;
pub mod pretrained;
pub mod switch;
pub mod tensor;

#[cfg(feature = "nif")]
mod nif;

#[cfg(test)]
mod testing;
